"""A project's quota of active runs over REST: members read it with what holds it; owners set it."""

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from core.callers import caller
from core.roles import Permission
from core.views import ApiView
from projects import selectors as project_selectors
from projects.models import Project
from runs import scheduling
from runs.models import ProjectQuota, Run


class ProjectQuotaSerializer(serializers.Serializer):
    max_active_runs = serializers.IntegerField(help_text="Runs of the project that may be active at once")
    default = serializers.BooleanField(
        help_text="True: FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS, not set for the project"
    )
    active = serializers.IntegerField(help_text="Runs starting, running, pausing or cancelling now")
    queued = serializers.IntegerField(help_text="Runs waiting to start")
    user_max_active_runs = serializers.IntegerField(
        help_text="Runs one user may have active across projects (FLYWHEEL_USER_MAX_ACTIVE_RUNS; 0: no limit)"
    )


class ProjectQuotaUpdateSerializer(serializers.Serializer):
    max_active_runs = serializers.IntegerField(
        min_value=0, max_value=10_000, allow_null=True, help_text="null: back to the server's default"
    )


def quota_of(project: Project) -> dict:
    runs = Run.objects.filter(project=project)
    return {
        "max_active_runs": scheduling.project_limit(project.pk),
        "default": not ProjectQuota.objects.filter(project=project).exists(),
        "active": runs.filter(status__in=scheduling.BUSY).count(),
        "queued": runs.filter(status=Run.Status.QUEUED).count(),
        "user_max_active_runs": settings.FLYWHEEL_USER_MAX_ACTIVE_RUNS,
    }


class ProjectQuotaView(ApiView):
    @extend_schema(responses=ProjectQuotaSerializer, summary="The project's quota of active runs and its use")
    def get(self, request: Request, id: int) -> Response:
        project = project_selectors.project_for(user=caller(request), project_id=id)
        return Response(ProjectQuotaSerializer(quota_of(project)).data)

    @extend_schema(
        request=ProjectQuotaUpdateSerializer,
        responses=ProjectQuotaSerializer,
        summary="Set the project's quota of active runs (owners); queued runs start where it leaves room",
    )
    def patch(self, request: Request, id: int) -> Response:
        project = project_selectors.project_for(
            user=caller(request), project_id=id, permission=Permission.MANAGE
        )
        scheduling.quota_set(project_id=project.pk, **self.validated(ProjectQuotaUpdateSerializer))
        return Response(ProjectQuotaSerializer(quota_of(project)).data)

"""A project's quotas (active runs, GPU workers) over REST: members read them with their use;
owners set them."""

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
from runs.models import Run


class ProjectQuotaSerializer(serializers.Serializer):
    max_active_runs = serializers.IntegerField(help_text="Runs of the project that may be active at once")
    default = serializers.BooleanField(
        help_text="True: FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS, not set for the project"
    )
    max_gpu_workers = serializers.IntegerField(
        help_text="Learner workers (GPUs on a GPU host) the project's active runs may hold at once; "
        "0: no limit"
    )
    gpu_workers_default = serializers.BooleanField(
        help_text="True: FLYWHEEL_PROJECT_MAX_GPU_WORKERS, not set for the project"
    )
    active = serializers.IntegerField(help_text="Runs starting, running, pausing or cancelling now")
    gpu_workers = serializers.IntegerField(help_text="Learner workers the active runs hold now")
    queued = serializers.IntegerField(help_text="Runs waiting to start")
    user_max_active_runs = serializers.IntegerField(
        help_text="Runs one user may have active across projects (FLYWHEEL_USER_MAX_ACTIVE_RUNS; 0: no limit)"
    )
    user_max_gpu_workers = serializers.IntegerField(
        help_text="Learner workers one user's runs may hold across projects (FLYWHEEL_USER_MAX_GPU_WORKERS; "
        "0: no limit)"
    )


class ProjectQuotaUpdateSerializer(serializers.Serializer):
    max_active_runs = serializers.IntegerField(
        min_value=0,
        max_value=10_000,
        allow_null=True,
        required=False,
        help_text="null: back to the server's default",
    )
    max_gpu_workers = serializers.IntegerField(
        min_value=0,
        max_value=100_000,
        allow_null=True,
        required=False,
        help_text="0: no limit; null: back to the server's default",
    )


def quota_of(project: Project) -> dict:
    walked = scheduling.plans([project.pk])[project.pk]
    return {
        "max_active_runs": walked.limits.active_runs,
        "default": walked.limits.default_active_runs,
        "max_gpu_workers": walked.limits.gpu_workers,
        "gpu_workers_default": walked.limits.default_gpu_workers,
        "active": Run.objects.filter(project=project, status__in=scheduling.BUSY).count(),
        "gpu_workers": scheduling.held_now()[0][project.pk].gpu_workers,
        "queued": len(walked.queue),
        "user_max_active_runs": settings.FLYWHEEL_USER_MAX_ACTIVE_RUNS,
        "user_max_gpu_workers": settings.FLYWHEEL_USER_MAX_GPU_WORKERS,
    }


class ProjectQuotaView(ApiView):
    @extend_schema(
        responses=ProjectQuotaSerializer,
        summary="The project's quotas (active runs, GPU workers) and their use",
    )
    def get(self, request: Request, id: int) -> Response:
        project = project_selectors.project_for(user=caller(request), project_id=id)
        return Response(ProjectQuotaSerializer(quota_of(project)).data)

    @extend_schema(
        request=ProjectQuotaUpdateSerializer,
        responses=ProjectQuotaSerializer,
        summary="Set the project's quotas (owners), the fields given; queued runs start if they leave room",
    )
    def patch(self, request: Request, id: int) -> Response:
        project = project_selectors.project_for(
            user=caller(request), project_id=id, permission=Permission.MANAGE
        )
        scheduling.quota_set(
            project_id=project.pk, **self.validated(ProjectQuotaUpdateSerializer, partial=True)
        )
        return Response(ProjectQuotaSerializer(quota_of(project)).data)

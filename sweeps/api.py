"""Sweeps over REST: create, list and read (with their trials), cancel. Launchers create and
cancel (EDIT); members read (VIEW). A sweep's trials are ordinary runs: runs/{id} has the rest."""

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from core.api import idempotent
from core.callers import caller
from core.roles import Permission
from core.views import ApiView
from projects import selectors as project_selectors
from sweeps import selectors, services
from sweeps import serializers as s


def detail(sweep) -> dict:
    return s.SweepDetailSerializer(selectors.sweep_summary(sweep=sweep)).data


class SweepListView(ApiView):
    @extend_schema(responses=s.SweepSerializer(many=True), summary="The project's sweeps, newest first")
    def get(self, request: Request, id: int) -> Response:
        project = project_selectors.project_for(user=caller(request), project_id=id)
        return self.paginated(selectors.sweeps_of(project_id=project.pk), s.SweepSerializer)

    @extend_schema(
        request=s.SweepCreateSerializer,
        responses={201: s.SweepDetailSerializer},
        summary="Start a sweep: trials of the template over the parameters, searched, stopped early "
        "and kept within the budget; bad input answers 400 naming each field (parameters.1.values)",
    )
    @idempotent
    def post(self, request: Request, id: int) -> Response:
        project = project_selectors.project_for(
            user=caller(request), project_id=id, permission=Permission.EDIT
        )
        data = dict(self.validated(s.SweepCreateSerializer))
        sweep = services.sweep_create(
            project=project,
            by=caller(request),
            name=data.pop("name"),
            template=data.pop("template"),
            parameters=data.pop("parameters"),
            search_kind=data.pop("search"),
            **data,
        )
        return Response(detail(sweep), status=201)


class SweepDetailView(ApiView):
    @extend_schema(
        responses=s.SweepDetailSerializer,
        summary="A sweep with its trials (params, state, objective, cost), its best trial and spend, "
        "and each base model's lift and cost",
    )
    def get(self, request: Request, id: int, sweep_id: int) -> Response:
        return Response(detail(selectors.sweep_for(user=caller(request), sweep_id=sweep_id, project_id=id)))


class SweepCancelView(ApiView):
    @extend_schema(
        request=None,
        responses=s.SweepDetailSerializer,
        summary="Cancel a running sweep and its active runs; a finished one answers 409",
    )
    def post(self, request: Request, id: int, sweep_id: int) -> Response:
        user = caller(request)
        sweep = selectors.sweep_for(user=user, sweep_id=sweep_id, project_id=id, permission=Permission.EDIT)
        return Response(detail(services.sweep_cancel(sweep=sweep)))

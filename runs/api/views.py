"""Thin REST views: check the input, ask a selector (which enforces the role) or call a service,
serialize the result. Non-members get 404, members whose role does not allow the action 403."""

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from core.api import idempotent
from core.callers import caller
from core.roles import Permission
from core.schema import NO_CONTENT
from core.views import ApiView
from projects import selectors as project_selectors
from projects import serializers as project_serializers
from runs import selectors, services
from runs.api import serializers as s

# --- tiers ---------------------------------------------------------------------------------


class TierListView(ApiView):
    @extend_schema(
        parameters=[project_serializers.ProjectFilterSerializer], responses=s.TierSerializer(many=True)
    )
    def get(self, request: Request) -> Response:
        tiers = selectors.tiers_for(user=caller(request))
        if (project := self.query(project_serializers.ProjectFilterSerializer).get("project")) is not None:
            tiers = tiers.filter(project_id=project)
        return self.paginated(tiers, s.TierSerializer)

    @extend_schema(
        request=s.TierCreateSerializer,
        responses={201: s.TierSerializer},
        summary="Create a tier; settings that cannot run together answer 400 naming each field",
    )
    @idempotent
    def post(self, request: Request) -> Response:
        data = self.validated(s.TierCreateSerializer)
        project = project_selectors.project_for(
            user=caller(request), project_id=data.pop("project"), permission=Permission.EDIT
        )
        tier = services.tier_create(project=project, by=caller(request), **data)
        return Response(s.TierSerializer(tier).data, status=201)


class TierDetailView(ApiView):
    @extend_schema(responses=s.TierSerializer)
    def get(self, request: Request, id: int) -> Response:
        return Response(s.TierSerializer(selectors.tier_for(user=caller(request), tier_id=id)).data)

    @extend_schema(request=s.TierUpdateSerializer, responses=s.TierSerializer)
    def patch(self, request: Request, id: int) -> Response:
        tier = selectors.tier_for(user=caller(request), tier_id=id, permission=Permission.EDIT)
        tier = services.tier_update(tier=tier, **self.validated(s.TierUpdateSerializer, partial=True))
        return Response(s.TierSerializer(tier).data)

    @extend_schema(responses=NO_CONTENT)
    def delete(self, request: Request, id: int) -> Response:
        services.tier_delete(
            tier=selectors.tier_for(user=caller(request), tier_id=id, permission=Permission.EDIT)
        )
        return Response(status=204)

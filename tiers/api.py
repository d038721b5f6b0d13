"""The tiers' REST API: tiers (list, create, read, edit, delete) and tier evaluations (request one from
a tier with EDIT, read it with VIEW). Thin: check the input, ask a selector (which enforces the
role) or call a service, serialize the result. Non-members get 404, members whose role does not
allow the action 403."""

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
from tiers import selectors, services
from tiers import serializers as s
from tiers.run_policies import run_policy_for

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
        user = caller(request)
        data = self.validated(s.TierCreateSerializer)
        project = project_selectors.project_for(
            user=user, project_id=data.pop("project"), permission=Permission.EDIT
        )
        tier = services.tier_create(project=project, by=user, **data)
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


# --- tier evaluations ----------------------------------------------------------------------


class TierEvaluateView(ApiView):
    @extend_schema(
        request=s.TierEvaluateSerializer,
        responses={202: s.TierEvaluationSerializer},
        summary="Evaluate a checkpoint under this tier and others, on the eval queue",
    )
    @idempotent
    def post(self, request: Request, id: int) -> Response:
        user = caller(request)
        tier = selectors.tier_for(user=user, tier_id=id, permission=Permission.EDIT)
        data = self.validated(s.TierEvaluateSerializer)
        version = project_selectors.version_by_id_for(user=user, version_id=data["task_set_version"])
        # A run's policy version comes from runs, above tiers (tiers/run_policies.py): 404 for a run
        # the caller may not view, as before they named it.
        policy = run_policy_for(user=user, tier=tier, run_id=data.get("run"), version=data.get("version"))
        compare = [selectors.tier_for(user=user, tier_id=other) for other in data["compare"]]
        evaluation = services.tier_evaluation_request(
            tier=tier,
            by=user,
            task_set_version=version,
            split=data["split"],
            compare=compare,
            checkpoint=data.get("checkpoint", ""),
            policy=policy,
            limit=data.get("limit"),
        )
        return Response(s.TierEvaluationSerializer(evaluation).data, status=202)


class TierEvaluationDetailView(ApiView):
    @extend_schema(
        responses=s.TierEvaluationSerializer, summary="A tier evaluation: its status and results per tier"
    )
    def get(self, request: Request, id: int) -> Response:
        evaluation = selectors.tier_evaluation_for(user=caller(request), evaluation_id=id)
        return Response(s.TierEvaluationSerializer(evaluation).data)

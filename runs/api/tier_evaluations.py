"""REST for tier evaluations: request one from a tier (EDIT), read it (VIEW)."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from core.api import idempotent
from core.roles import Permission
from core.views import ApiView
from projects import selectors as project_selectors
from projects.models import TaskItem
from runs import selectors, tier_evaluations
from runs.models import TierEvaluation


class TierEvaluateSerializer(serializers.Serializer):
    checkpoint = serializers.CharField(
        max_length=500,
        required=False,
        allow_blank=True,
        help_text="A local path or hub id; empty with no run: the tier's base model",
    )
    run = serializers.IntegerField(
        min_value=1, required=False, help_text="Evaluate a policy version of this run"
    )
    version = serializers.IntegerField(
        min_value=0, required=False, help_text="The run's policy version (default: its newest)"
    )
    task_set_version = serializers.IntegerField(min_value=1, help_text="The task set version's id")
    split = serializers.ChoiceField(choices=TaskItem.Split.choices, default=TaskItem.Split.HELDOUT)
    compare = serializers.ListField(
        child=serializers.IntegerField(min_value=1),
        required=False,
        default=list,
        help_text="Other tiers of the project to evaluate alongside",
    )
    limit = serializers.IntegerField(
        min_value=1, max_value=100000, required=False, help_text="Evaluate the split's first N items only"
    )

    def validate(self, data: dict) -> dict:
        if data.get("checkpoint") and data.get("run"):
            raise serializers.ValidationError({"checkpoint": "give a checkpoint path or a run, not both"})
        return data


class TierResultSerializer(serializers.Serializer):
    """One tier's measurements; a tier that could not run has only its name, settings and error."""

    tier_id = serializers.IntegerField(allow_null=True)
    name = serializers.CharField()
    settings = serializers.DictField(help_text="The tier's settings when the evaluation was requested")
    error = serializers.CharField(required=False, help_text="Why this tier could not be measured")
    pass_rate = serializers.FloatField(allow_null=True, required=False)
    passed = serializers.IntegerField(required=False)
    scored = serializers.IntegerField(required=False, help_text="Completions graded")
    ungraded = serializers.IntegerField(required=False, help_text="Not gradable, or the sandbox failed")
    pass_rate_by_family = serializers.DictField(child=serializers.FloatField(), required=False)
    requests = serializers.IntegerField(required=False)
    generated_tokens = serializers.IntegerField(required=False)
    seconds = serializers.FloatField(required=False, help_text="Wall time generating")
    load_seconds = serializers.FloatField(required=False)
    tokens_per_second = serializers.FloatField(allow_null=True, required=False)
    ttft_ms_p50 = serializers.FloatField(allow_null=True, required=False, help_text="Time to first token")
    ttft_ms_p95 = serializers.FloatField(allow_null=True, required=False)
    latency_ms_p50 = serializers.FloatField(allow_null=True, required=False)
    latency_ms_p95 = serializers.FloatField(allow_null=True, required=False)
    model_mb = serializers.FloatField(required=False, help_text="The weights (the draft's included)")
    peak_memory_mb = serializers.FloatField(
        required=False, help_text="The weights plus the peak RSS growth while generating"
    )
    cuda_peak_memory_mb = serializers.FloatField(required=False)
    target_forwards = serializers.IntegerField(required=False)
    draft_forwards = serializers.IntegerField(required=False)
    prefill_positions = serializers.IntegerField(required=False)
    proposed = serializers.IntegerField(required=False, help_text="Draft tokens proposed")
    accepted = serializers.IntegerField(required=False, help_text="Draft tokens accepted")
    acceptance_rate = serializers.FloatField(allow_null=True, required=False)
    pareto = serializers.BooleanField(required=False, help_text="On the capability/speed Pareto front")


class TierEvaluationSerializer(serializers.ModelSerializer):
    results = TierResultSerializer(many=True, read_only=True)
    tier_configs = serializers.ListField(child=serializers.DictField(), read_only=True)

    class Meta:
        model = TierEvaluation
        fields = [
            "id",
            "project",
            "tier",
            "tier_configs",
            "checkpoint",
            "run",
            "policy_version",
            "task_set_version",
            "split",
            "limit",
            "status",
            "results",
            "error",
            "attempts",
            "created_by",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields


class TierEvaluateView(ApiView):
    @extend_schema(
        request=TierEvaluateSerializer,
        responses={202: TierEvaluationSerializer},
        summary="Evaluate a checkpoint under this tier and others, on the eval queue",
    )
    @idempotent
    def post(self, request: Request, id: int) -> Response:
        tier = selectors.tier_for(user=request.user, tier_id=id, permission=Permission.EDIT)
        data = self.validated(TierEvaluateSerializer)
        version = project_selectors.version_by_id_for(user=request.user, version_id=data["task_set_version"])
        run = selectors.run_for(user=request.user, run_id=data["run"]) if data.get("run") else None
        compare = [selectors.tier_for(user=request.user, tier_id=other) for other in data["compare"]]
        evaluation = tier_evaluations.tier_evaluation_request(
            tier=tier,
            by=request.user,
            task_set_version=version,
            split=data["split"],
            compare=compare,
            checkpoint=data.get("checkpoint", ""),
            run=run,
            version=data.get("version"),
            limit=data.get("limit"),
        )
        return Response(TierEvaluationSerializer(evaluation).data, status=202)


class TierEvaluationDetailView(ApiView):
    @extend_schema(
        responses=TierEvaluationSerializer, summary="A tier evaluation: its status and results per tier"
    )
    def get(self, request: Request, id: int) -> Response:
        evaluation = selectors.tier_evaluation_for(user=request.user, evaluation_id=id)
        return Response(TierEvaluationSerializer(evaluation).data)

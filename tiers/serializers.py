"""Input serializers check types and shapes; services check the rules. Output serializers are what
a client sees: every object has `id`, `created_at` (ISO 8601 UTC) and the ids of related objects."""

from rest_framework import serializers

from inference.settings import TIER_FIELDS
from projects.models import TaskItem
from tiers.models import Tier, TierEvaluation

INT32_MAX = 2**31 - 1

# --- tiers ---------------------------------------------------------------------------------


class TierSerializer(serializers.ModelSerializer):
    stop = serializers.ListField(child=serializers.CharField(), read_only=True)

    class Meta:
        model = Tier
        fields = ["id", "project", *TIER_FIELDS, "created_by", "created_at", "updated_at"]
        read_only_fields = fields


class TierUpdateSerializer(serializers.Serializer):
    """Types only: which settings can run together is the service's call (inference.settings)."""

    name = serializers.CharField(max_length=100)
    description = serializers.CharField(required=False, allow_blank=True)
    base_model = serializers.CharField(max_length=500)
    device = serializers.ChoiceField(choices=Tier.Device.choices, required=False)
    precision = serializers.ChoiceField(choices=Tier.Precision.choices, required=False)
    speculation = serializers.ChoiceField(choices=Tier.Speculation.choices, required=False)
    draft_model = serializers.CharField(max_length=500, required=False, allow_blank=True)
    speculative_tokens = serializers.IntegerField(min_value=0, max_value=32767, required=False)
    temperature = serializers.FloatField(required=False)
    top_p = serializers.FloatField(required=False)
    top_k = serializers.IntegerField(min_value=0, max_value=INT32_MAX, required=False)
    stop = serializers.ListField(child=serializers.CharField(trim_whitespace=False), required=False)
    max_new_tokens = serializers.IntegerField(min_value=0, max_value=INT32_MAX, required=False)
    batch_size = serializers.IntegerField(min_value=0, max_value=INT32_MAX, required=False)
    engine = serializers.ChoiceField(choices=Tier.Engine.choices, required=False)
    engine_url = serializers.CharField(max_length=500, required=False, allow_blank=True)
    engine_model = serializers.CharField(max_length=500, required=False, allow_blank=True)
    engine_api_key_env = serializers.CharField(max_length=100, required=False, allow_blank=True)
    engine_adapters = serializers.ChoiceField(choices=Tier.EngineAdapters.choices, required=False)
    engine_adapter_root = serializers.CharField(max_length=500, required=False, allow_blank=True)


class TierCreateSerializer(TierUpdateSerializer):
    project = serializers.IntegerField(min_value=1)


# --- tier evaluations ----------------------------------------------------------------------


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

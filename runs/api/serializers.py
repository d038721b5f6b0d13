"""Input serializers check types and shapes; services check the rules. Output serializers are what
a client sees: every object has `id`, `created_at` (ISO 8601 UTC) and the ids of related objects."""

from rest_framework import serializers

from inference.settings import TIER_FIELDS
from runs.models import Tier

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
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

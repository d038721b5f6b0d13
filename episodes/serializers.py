import math

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from episodes.models import Episode


class EpisodeSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="key", read_only=True, help_text="Send it as X-Flywheel-Episode on /v1")
    model = serializers.SerializerMethodField(help_text="The model name to call on /v1/chat/completions")
    task = serializers.SerializerMethodField(help_text="The task item to play: its data, id and kind")
    group = serializers.SerializerMethodField(help_text="Where the episode sits: its batch, step and group")
    turns = serializers.SerializerMethodField(help_text="Turns recorded so far")
    trajectory = serializers.IntegerField(source="trajectory_id", read_only=True, allow_null=True)

    class Meta:
        model = Episode
        fields = [
            "id",
            "run",
            "status",
            "model",
            "policy_version",
            "deadline_at",
            "task",
            "group",
            "turns",
            "reward",
            "trajectory",
            "created_at",
            "ended_at",
        ]
        read_only_fields = fields

    def get_model(self, episode: Episode) -> str:
        return f"run-{episode.run_id}"

    @extend_schema_field(serializers.DictField())
    def get_task(self, episode: Episode) -> dict:
        item = episode.item
        return item.data | {"id": item.external_id, "kind": item.kind}

    @extend_schema_field(serializers.DictField(child=serializers.IntegerField()))
    def get_group(self, episode: Episode) -> dict:
        return {
            "batch": episode.batch_id,
            "step": episode.batch.step,
            "item": episode.item_id,
            "sample_index": episode.sample_index,
        }

    def get_turns(self, episode: Episode) -> int:
        return len(episode.turns)


class EpisodeListQuerySerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=Episode.Status.choices, required=False)


class OutcomeSerializer(serializers.Serializer):
    reward = serializers.FloatField(
        required=False,
        allow_null=True,
        default=None,
        help_text="The episode's reward, as the agent scored it",
    )
    components = serializers.DictField(
        child=serializers.FloatField(), required=False, default=dict, help_text="Per-component rewards"
    )
    final = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=1_000_000,
        help_text="Instead of a reward: the final answer, scored by the run's reward rule",
    )

    def validate_reward(self, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise serializers.ValidationError("must be a finite number")
        return value

    def validate_components(self, value: dict[str, float]) -> dict[str, float]:
        for name, number in value.items():
            if not math.isfinite(number):
                raise serializers.ValidationError(f"{name}: must be a finite number")
        return value

    def validate(self, data: dict) -> dict:
        if (data.get("reward") is None) == ("final" not in data):
            raise serializers.ValidationError(
                {"reward": "send a reward, or a final answer for the rule to score (one of the two)"}
            )
        if data.get("components") and data.get("reward") is None:
            raise serializers.ValidationError(
                {"components": "come with a reward; the rule scores a final answer's"}
            )
        return data


class EpisodeCountsSerializer(serializers.Serializer):
    open = serializers.IntegerField()
    scoring = serializers.IntegerField()
    reported = serializers.IntegerField()
    timed_out = serializers.IntegerField()
    cancelled = serializers.IntegerField()

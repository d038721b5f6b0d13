"""Input and output shapes of the reward-models REST API."""

from rest_framework import serializers

from reward_models.models import RewardModel, RewardModelVersion, RunRewardModel


class RewardModelVersionSerializer(serializers.ModelSerializer):
    reward_model_name = serializers.CharField(source="reward_model.name", read_only=True)
    project = serializers.IntegerField(source="reward_model.project_id", read_only=True)
    chance_accuracy = serializers.SerializerMethodField()

    class Meta:
        model = RewardModelVersion
        fields = (
            "id",
            "reward_model",
            "reward_model_name",
            "project",
            "number",
            "status",
            "task_set_version",
            "base_model",
            "hyperparameters",
            "train_pairs",
            "heldout_pairs",
            "heldout_accuracy",
            "base_heldout_accuracy",
            "chance_accuracy",
            "train_accuracy",
            "step",
            "steps",
            "history",
            "error",
            "created_at",
            "started_at",
            "finished_at",
        )

    def get_chance_accuracy(self, version: RewardModelVersion) -> float:
        """What guessing scores on held-out pairs: the line a trained model must clear."""
        return 0.5


class RewardModelSerializer(serializers.ModelSerializer):
    latest_version = serializers.SerializerMethodField()

    class Meta:
        model = RewardModel
        fields = ("id", "project", "name", "description", "created_at", "latest_version")

    def get_latest_version(self, reward_model: RewardModel) -> RewardModelVersionSerializer(allow_null=True):  # type: ignore[valid-type]
        version = reward_model.versions.order_by("-number").first()
        return RewardModelVersionSerializer(version).data if version is not None else None


class RewardModelCreateSerializer(serializers.Serializer):
    project = serializers.IntegerField(min_value=1)
    name = serializers.CharField(max_length=100)
    description = serializers.CharField(required=False, allow_blank=True, max_length=10_000, default="")


class RewardModelTrainSerializer(serializers.Serializer):
    task_set_version = serializers.IntegerField(
        min_value=1, help_text="A version whose items hold preference pairs"
    )
    base_model = serializers.CharField(
        required=False, allow_blank=True, max_length=500, default="", help_text="A local path or hub id"
    )
    tier = serializers.IntegerField(
        required=False, min_value=1, help_text="Start from this tier's base model"
    )
    hyperparameters = serializers.DictField(required=False, default=dict)


class RunRewardModelSerializer(serializers.ModelSerializer):
    reward_model_name = serializers.CharField(source="reward_model.name", read_only=True)
    number = serializers.IntegerField(source="version.number", read_only=True)
    heldout_accuracy = serializers.FloatField(source="version.heldout_accuracy", read_only=True)

    class Meta:
        model = RunRewardModel
        fields = (
            "run",
            "reward_model",
            "reward_model_name",
            "version",
            "number",
            "heldout_accuracy",
            "created_at",
        )

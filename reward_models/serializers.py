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
            "restarts",
            "checkpoint_step",
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


# --- scoring ---------------------------------------------------------------------------------

SCORE_MAX_ROWS = 64  # texts, or pairs, per request: a request's forward passes stay short
SCORE_MAX_CHARS = 20_000  # per prompt or completion


def _text_problem(value) -> str | None:
    """A prompt or completion is a string, or a conversation: a list of {role, content} messages."""
    if isinstance(value, str):
        return None if len(value) <= SCORE_MAX_CHARS else f"at most {SCORE_MAX_CHARS} characters"
    if isinstance(value, list) and value:
        for index, message in enumerate(value):
            if not isinstance(message, dict) or not isinstance(message.get("content"), str):
                return f"message {index} is not a {{role, content}} object with text content"
            if not isinstance(message.get("role"), str):
                return f"message {index} has no role"
        if sum(len(message["content"]) for message in value) > SCORE_MAX_CHARS:
            return f"at most {SCORE_MAX_CHARS} characters"
        return None
    return "must be a string or a list of {role, content} messages"


class ScoreTextSerializer(serializers.Serializer):
    prompt = serializers.JSONField(help_text="A string, or a conversation: [{role, content}, ...]")
    completion = serializers.JSONField(help_text="A string, or the assistant's messages")

    def validate(self, data: dict) -> dict:
        problems = {name: p for name in ("prompt", "completion") if (p := _text_problem(data[name]))}
        if problems:
            raise serializers.ValidationError(problems)
        return data


class ScorePairSerializer(serializers.Serializer):
    prompt = serializers.JSONField(help_text="A string, or a conversation: [{role, content}, ...]")
    chosen = serializers.JSONField(help_text="The completion that should score higher")
    rejected = serializers.JSONField()

    def validate(self, data: dict) -> dict:
        names = ("prompt", "chosen", "rejected")
        problems = {name: p for name in names if (p := _text_problem(data[name]))}
        if problems:
            raise serializers.ValidationError(problems)
        return data


class RewardModelScoreSerializer(serializers.Serializer):
    # DRF hands min_length/max_length to the list serializer `many=True` makes; its stubs do not say so.
    texts = ScoreTextSerializer(
        many=True, required=False, min_length=1, max_length=SCORE_MAX_ROWS, help_text="Score each"
    )  # type: ignore[call-arg]
    pairs = ScorePairSerializer(
        many=True, required=False, min_length=1, max_length=SCORE_MAX_ROWS, help_text="Rank each pair"
    )  # type: ignore[call-arg]

    def validate(self, data: dict) -> dict:
        if ("texts" in data) == ("pairs" in data):
            raise serializers.ValidationError({"texts": "give either `texts` or `pairs`"})
        return data


class RankedPairSerializer(serializers.Serializer):
    chosen = serializers.FloatField()
    rejected = serializers.FloatField()
    margin = serializers.FloatField(help_text="chosen - rejected")
    prefers_chosen = serializers.BooleanField()


class RewardModelScoresSerializer(serializers.Serializer):
    reward_model = serializers.IntegerField()
    version = serializers.IntegerField(help_text="The version's id")
    number = serializers.IntegerField()
    scores = serializers.ListField(
        child=serializers.FloatField(), required=False, help_text="With `texts`: one raw score each"
    )
    pairs = RankedPairSerializer(many=True, required=False, help_text="With `pairs`: each pair, ranked")
    accuracy = serializers.FloatField(required=False, help_text="With `pairs`: the share ranked right")


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

"""Input and output shapes of the evaluation-suites REST API."""

from rest_framework import serializers

from core.api import INT64_MAX, INT64_MIN
from evaluations.models import Suite, SuiteEntry, SuiteEvaluation, SuiteResult, SuiteVersion
from runs.models import Run
from runs.outcomes import CHANGES


class SuiteEntrySerializer(serializers.ModelSerializer):
    task_set = serializers.CharField(source="task_set_version.task_set.name", read_only=True)
    task_set_version_number = serializers.IntegerField(source="task_set_version.number", read_only=True)

    class Meta:
        model = SuiteEntry
        fields = (
            "position",
            "task_set_version",
            "task_set",
            "task_set_version_number",
            "split",
            "reward_rule_version",
            "limit",
        )


class SamplingSerializer(serializers.Serializer):
    samples = serializers.IntegerField(help_text="n: samples per item")
    k = serializers.ListField(child=serializers.IntegerField(), help_text="The k of each pass@k (each <= n)")
    temperature = serializers.FloatField(help_text="0: greedy")
    pass_threshold = serializers.FloatField(help_text="A sample passes when its reward reaches this")


class SuiteVersionSerializer(serializers.ModelSerializer):
    entries = SuiteEntrySerializer(many=True, read_only=True)
    sampling = SamplingSerializer(read_only=True)

    class Meta:
        model = SuiteVersion
        fields = ("id", "suite", "number", "entries", "sampling", "note", "created_at")


class SuiteSerializer(serializers.ModelSerializer):
    class Meta:
        model = Suite
        fields: tuple[str, ...] = ("id", "project", "name", "description", "created_at")


class SuiteDetailSerializer(SuiteSerializer):
    versions = SuiteVersionSerializer(many=True, read_only=True)

    class Meta(SuiteSerializer.Meta):
        fields: tuple[str, ...] = (*SuiteSerializer.Meta.fields, "versions")


class EntryInputSerializer(serializers.Serializer):
    task_set_version = serializers.IntegerField(min_value=1)
    split = serializers.ChoiceField(choices=("train", "heldout"), default="heldout")
    reward_rule_version = serializers.IntegerField(min_value=1)
    limit = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, default=None, help_text="The first items only"
    )


class SamplingInputSerializer(serializers.Serializer):
    samples = serializers.IntegerField(required=False, help_text="n: samples per item (default 1)")
    k = serializers.ListField(
        child=serializers.IntegerField(), required=False, help_text="The k of each pass@k (default [1])"
    )
    temperature = serializers.FloatField(required=False, help_text="Default 0: greedy")
    pass_threshold = serializers.FloatField(required=False, help_text="Default 1.0")


class SuiteVersionCreateSerializer(serializers.Serializer):
    entries = EntryInputSerializer(many=True, help_text="The task sets it evaluates")
    sampling = SamplingInputSerializer(required=False, help_text="Default: greedy pass@1")
    note = serializers.CharField(required=False, allow_blank=True, max_length=10_000, default="")


class SuiteCreateSerializer(serializers.Serializer):
    project = serializers.IntegerField(min_value=1)
    name = serializers.CharField(max_length=100)
    description = serializers.CharField(required=False, allow_blank=True, max_length=10_000, default="")
    entries = EntryInputSerializer(many=True, required=False, help_text="With them, version 1 is created too")
    sampling = SamplingInputSerializer(required=False)


class EvaluateSerializer(serializers.Serializer):
    suite_version = serializers.IntegerField(
        required=False, min_value=1, help_text="The suite version's number; default the newest"
    )
    run = serializers.IntegerField(required=False, min_value=1, help_text="A run: one of its policy versions")
    version = serializers.IntegerField(
        required=False, min_value=0, help_text="With run: the policy version (default its newest)"
    )
    checkpoint = serializers.IntegerField(required=False, min_value=1, help_text="A run's checkpoint")
    tier = serializers.IntegerField(
        required=False, min_value=1, help_text="A tier as it is: its base model under its settings"
    )


class SuiteEvaluationSerializer(serializers.ModelSerializer):
    suite = serializers.IntegerField(source="suite_version.suite_id", read_only=True)
    suite_version_number = serializers.IntegerField(source="suite_version.number", read_only=True)
    target_label = serializers.CharField(read_only=True)
    metrics = serializers.JSONField(
        read_only=True,
        help_text="overall and entries (a list): items, samples, errored, pass@1, pass@k, mean_reward, "
        "graders, invalid_action_rate, mean_length",
    )

    class Meta:
        model = SuiteEvaluation
        fields = (
            "id",
            "project",
            "suite",
            "suite_version",
            "suite_version_number",
            "target",
            "target_label",
            "run",
            "policy_version",
            "checkpoint",
            "tier",
            "model",
            "scheduled",
            "status",
            "error",
            "metrics",
            "created_at",
            "started_at",
            "finished_at",
        )


class CompletionSerializer(serializers.Serializer):
    text = serializers.CharField()
    tokens = serializers.IntegerField()
    reward = serializers.FloatField(allow_null=True)
    passed = serializers.BooleanField()
    errored = serializers.BooleanField()
    invalid_actions = serializers.IntegerField(required=False)
    error = serializers.CharField(required=False)


class SuiteResultSerializer(serializers.ModelSerializer):
    item_id = serializers.CharField(
        source="item.external_id", read_only=True, help_text="The item's id in its file"
    )
    kind = serializers.CharField(source="item.kind", read_only=True)
    completions = CompletionSerializer(many=True, read_only=True)
    grader_means = serializers.DictField(child=serializers.FloatField(), read_only=True)

    class Meta:
        model = SuiteResult
        fields = (
            "id",
            "entry",
            "item",
            "item_id",
            "kind",
            "samples",
            "passes",
            "errored",
            "reward_mean",
            "grader_means",
            "completion_tokens_mean",
            "invalid_actions",
            "agent_steps",
            "completions",
        )


class ResultFilterSerializer(serializers.Serializer):
    entry = serializers.IntegerField(required=False, min_value=0, help_text="Only this entry's items")


class ComparisonQuerySerializer(serializers.Serializer):
    against = serializers.IntegerField(
        min_value=INT64_MIN,
        max_value=INT64_MAX,
        help_text="The evaluation compared against (a control, the base)",
    )
    change = serializers.ChoiceField(choices=CHANGES, required=False)
    kind = serializers.CharField(required=False, max_length=20, help_text="Only items of this kind")


class ComparisonSummarySerializer(serializers.Serializer):
    verdict = serializers.ChoiceField(
        choices=Run.Outcome.choices,
        help_text="improved or regressed only when the paired interval on the change excludes 0",
    )
    before = serializers.FloatField()
    after = serializers.FloatField()
    delta = serializers.FloatField()
    low = serializers.FloatField(help_text="The 95% paired bootstrap interval on delta")
    high = serializers.FloatField()
    confidence = serializers.FloatField()
    items = serializers.IntegerField(help_text="Items both evaluations measured")
    improved_items = serializers.IntegerField()
    regressed_items = serializers.IntegerField()


class ComparisonItemSerializer(serializers.Serializer):
    entry = serializers.IntegerField()
    item = serializers.IntegerField()
    external_id = serializers.CharField()
    kind = serializers.CharField()
    before = serializers.FloatField(help_text="Its pass rate over its samples in the other evaluation")
    after = serializers.FloatField(help_text="Its pass rate in this one")
    change = serializers.ChoiceField(choices=CHANGES)
    before_completions = serializers.ListField(child=serializers.DictField())
    after_completions = serializers.ListField(child=serializers.DictField())


class ComparisonSerializer(serializers.Serializer):
    before = serializers.IntegerField(help_text="The evaluation compared against")
    after = serializers.IntegerField(help_text="This evaluation")
    summary = ComparisonSummarySerializer()
    items = ComparisonItemSerializer(many=True, help_text="After the filters, the largest gain first")

"""Input serializers check types and shapes; the engine (through rewards.services) checks the rule.
Output serializers are what a client sees."""

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from rewards.models import RewardRule, RewardRuleVersion
from rewards.services import DRY_RUN_MAX_PAIRS

SPEC_HELP = "The rule as data: a grader object with a `type` (OpenAI grader JSON is a subset)"

# --- rules and versions --------------------------------------------------------------------


class RewardRuleVersionSerializer(serializers.ModelSerializer):
    spec = serializers.DictField(read_only=True, help_text=SPEC_HELP)
    is_used = serializers.BooleanField(read_only=True, help_text="A run has used it; it never changes")

    class Meta:
        model = RewardRuleVersion
        fields = [
            "id",
            "rule",
            "number",
            "spec",
            "content_hash",
            "note",
            "is_used",
            "used_at",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields


class RewardRuleSerializer(serializers.ModelSerializer):
    version_count = serializers.SerializerMethodField()
    latest_version = serializers.SerializerMethodField()

    class Meta:
        model = RewardRule
        fields = [
            "id",
            "project",
            "name",
            "description",
            "version_count",
            "latest_version",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields

    def get_version_count(self, rule: RewardRule) -> int:
        count = getattr(rule, "version_count", None)
        return rule.versions.count() if count is None else count

    @extend_schema_field(RewardRuleVersionSerializer)
    def get_latest_version(self, rule: RewardRule) -> dict[str, Any]:
        return RewardRuleVersionSerializer(rule.versions.first()).data


class RewardRuleUpdatedSerializer(RewardRuleSerializer):
    version_created = serializers.SerializerMethodField(
        help_text="true: the new spec became a new version; false: nothing about the spec changed"
    )

    class Meta(RewardRuleSerializer.Meta):
        fields = [*RewardRuleSerializer.Meta.fields, "version_created"]
        read_only_fields = fields

    def get_version_created(self, rule: RewardRule) -> bool:
        return self.context["version_created"]


class RewardRuleUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    description = serializers.CharField(allow_blank=True)
    spec = serializers.JSONField(help_text=f"{SPEC_HELP}. A changed spec creates a new version")
    note = serializers.CharField(max_length=500, allow_blank=True, help_text="What changed, in a line")


class RewardRuleCreateSerializer(serializers.Serializer):
    project = serializers.IntegerField(min_value=1)
    name = serializers.CharField(max_length=100)
    description = serializers.CharField(required=False, allow_blank=True)
    spec = serializers.JSONField(help_text=SPEC_HELP)
    note = serializers.CharField(max_length=500, required=False, allow_blank=True)


class ImportOpenAISerializer(serializers.Serializer):
    project = serializers.IntegerField(min_value=1)
    name = serializers.CharField(max_length=100)
    description = serializers.CharField(required=False, allow_blank=True)
    grader = serializers.JSONField(help_text="An OpenAI grader object, as used for reinforcement fine-tuning")


# --- validation ----------------------------------------------------------------------------


class SpecInputSerializer(serializers.Serializer):
    spec = serializers.JSONField(help_text=SPEC_HELP)


class ProblemSerializer(serializers.Serializer):
    path = serializers.CharField(
        allow_blank=True, help_text="Dotted place in the spec, like graders.tests.calculate_output"
    )
    message = serializers.CharField()


class ValidationResultSerializer(serializers.Serializer):
    valid = serializers.BooleanField()
    problems = ProblemSerializer(many=True)


# --- diff ----------------------------------------------------------------------------------


class DiffQuerySerializer(serializers.Serializer):
    vars()["from"] = serializers.IntegerField(
        required=False, min_value=1, help_text="A version number; default: the one before `to`"
    )
    to = serializers.IntegerField(
        required=False, min_value=1, help_text="A version number; default: the latest"
    )


class DiffLineSerializer(serializers.Serializer):
    # A plain string, not an enum: the schema already has a `kind` enum (task items).
    kind = serializers.CharField(help_text="header, hunk, added, removed or context: how to colour the line")
    text = serializers.CharField(allow_blank=True)


class DiffSerializer(serializers.Serializer):
    rule = serializers.IntegerField()
    vars()["from"] = serializers.IntegerField(help_text="The older version's number")
    to = serializers.IntegerField()
    diff = serializers.CharField(
        allow_blank=True, help_text="A unified diff of the specs' canonical pretty JSON; empty when equal"
    )
    lines = DiffLineSerializer(many=True)


# --- dry-run -------------------------------------------------------------------------------


class DryRunInputSerializer(serializers.Serializer):
    version = serializers.IntegerField(required=False, min_value=1, help_text="Default: the latest")
    items = serializers.ListField(
        child=serializers.JSONField(),
        required=False,
        max_length=DRY_RUN_MAX_PAIRS,
        help_text="Task items ({id, kind, ...}, as the task library exports them), read as an import "
        "reads a file's lines (a published HumanEval, MBPP, APPS or LiveCodeBench line is mapped)",
    )
    task_set_version = serializers.IntegerField(
        required=False, min_value=1, help_text="Instead of `items`: a task set version id"
    )
    item_ids = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        max_length=DRY_RUN_MAX_PAIRS,
        help_text="With `task_set_version`: these items, in this order; default: the first ones",
    )
    samples = serializers.ListField(
        child=serializers.JSONField(),
        help_text="Samples ({output_text, output_json, files, steps, tokens, metadata}) or completion "
        "strings; each pairs with the item named by its `item_id`, else with the item at its position",
    )

    def validate(self, data: dict) -> dict:
        if ("items" in data) == ("task_set_version" in data):
            raise serializers.ValidationError({"items": "give either `items` or `task_set_version`"})
        if "item_ids" in data and "task_set_version" not in data:
            raise serializers.ValidationError({"item_ids": "only with `task_set_version`"})
        return data


class GraderErrorSerializer(serializers.Serializer):
    grader = serializers.CharField(allow_blank=True)
    kind = serializers.CharField(help_text="sandbox_timeout, grader_exception, bad_template, …")
    message = serializers.CharField(allow_blank=True)


class HackingFlagSerializer(serializers.Serializer):
    detector = serializers.CharField()
    evidence = serializers.JSONField()
    confidence = serializers.ChoiceField(
        choices=["high", "low"], help_text="high: the reward is the rule's floor unless the rule opts out"
    )


class TestResultSerializer(serializers.Serializer):
    name = serializers.CharField(
        help_text='"test_add", "line 3", "check line 5", "case 2", "tests/test_a.py::test_x"'
    )
    passed = serializers.BooleanField()
    outcome = serializers.ChoiceField(choices=["pass", "fail", "error", "timeout"])
    message = serializers.CharField(allow_blank=True, help_text="The failing assertion's message")
    expected = serializers.CharField(required=False, allow_null=True)
    actual = serializers.CharField(required=False, allow_null=True)
    decided_by = serializers.ChoiceField(
        choices=["host", "sandbox"],
        required=False,
        help_text="host: the host compared the values the call returned; sandbox: the in-sandbox "
        "harness's verdict (an assert the host could not take over)",
    )
    credit = serializers.BooleanField(
        required=False, help_text="false: a stub of the solution passes this test too: it pays nothing"
    )


class ScoreResultSerializer(serializers.Serializer):
    total = serializers.FloatField(allow_null=True)
    components = serializers.DictField(
        child=serializers.FloatField(allow_null=True), help_text="Every named sub-reward"
    )
    # Shadows Serializer.errors in the stubs; DRF's metaclass moves declared fields off the class.
    errors = GraderErrorSerializer(many=True)  # type: ignore[assignment]
    errored = serializers.BooleanField(
        help_text="An infrastructure failure: masked from learning, not a zero"
    )
    flags = HackingFlagSerializer(many=True)
    tests = TestResultSerializer(many=True, help_text="Per test, where a unit_tests grader ran the code")
    stop_reason = serializers.CharField(
        allow_null=True, help_text="exited, timeout, out_of_memory, output_cap or killed; null without code"
    )


class ScoredPairSerializer(serializers.Serializer):
    item_id = serializers.CharField(allow_blank=True)
    sample = serializers.DictField()
    result = ScoreResultSerializer()


class ScoreSummarySerializer(serializers.Serializer):
    count = serializers.IntegerField()
    scored = serializers.IntegerField(help_text="Samples with a total (not errored)")
    errored = serializers.IntegerField()
    flagged = serializers.IntegerField(help_text="Samples with at least one hacking flag")
    mean_total = serializers.FloatField(allow_null=True)
    min_total = serializers.FloatField(allow_null=True)
    max_total = serializers.FloatField(allow_null=True)
    component_means = serializers.DictField(child=serializers.FloatField(allow_null=True))


class DryRunResultSerializer(serializers.Serializer):
    rule = serializers.IntegerField(source="version.rule_id")
    version = serializers.IntegerField(source="version.number")
    components = serializers.ListField(child=serializers.CharField())
    summary = ScoreSummarySerializer()
    results = ScoredPairSerializer(many=True, source="pairs")

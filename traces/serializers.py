"""Traces over REST: what a client reports (a batch of traces), asks for (filters, promotion) and sees."""

from datetime import datetime

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from runs.api.run_serializers import REVIEW_LABELS
from traces.models import Trace
from traces.selectors import meta_filter

BATCH_MAX = 1000
EARLIEST_YEAR = 1970  # a trace's timestamp from this year on
THUMBS_FILTER = ("up", "down", "none")
TEXT_MAX = 1_000_000


class MessageSerializer(serializers.Serializer):
    """An OpenAI chat message taken whole: an assistant's `tool_calls` (its content may then be null
    or empty), a tool result's `tool_call_id`, and `name` are kept as they came."""

    role = serializers.CharField(max_length=40, help_text="system, user, assistant, tool, ...")
    content = serializers.JSONField(
        allow_null=True, help_text="A string, OpenAI's list of parts (text parts are read), or null"
    )
    tool_calls = serializers.ListField(
        child=serializers.DictField(),
        required=False,
        help_text="An assistant's tool calls, as OpenAI gives them",
    )
    tool_call_id = serializers.CharField(
        max_length=200, required=False, help_text="The call a tool message answers"
    )
    name = serializers.CharField(max_length=200, required=False)

    def validate_content(self, value):
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(part, dict) for part in value):
            return value
        raise serializers.ValidationError("must be a string, a list of content parts, or null")

    def validate(self, data: dict) -> dict:
        if data.get("content") is None and not data.get("tool_calls"):
            raise serializers.ValidationError(
                {"content": "may be null only in an assistant message with tool_calls"}
            )
        return data


class FeedbackInputSerializer(serializers.Serializer):
    thumbs = serializers.ChoiceField(
        choices=Trace.Thumbs.choices, allow_null=True, required=False, help_text="null clears it"
    )
    correction = serializers.CharField(
        max_length=TEXT_MAX,
        allow_blank=True,
        allow_null=True,
        required=False,
        trim_whitespace=False,
        help_text="What the answer should have been",
    )
    comment = serializers.CharField(
        max_length=10_000, allow_blank=True, allow_null=True, required=False, trim_whitespace=False
    )


class TraceInputSerializer(serializers.Serializer):
    """One trace. A new id needs a prompt or messages; a known id updates the fields it carries."""

    id = serializers.CharField(
        max_length=200, help_text="Your id of the trace: reporting it again updates it"
    )
    prompt = serializers.CharField(max_length=TEXT_MAX, required=False, trim_whitespace=False)
    messages = MessageSerializer(many=True, required=False, allow_empty=False, help_text="Instead of prompt")
    completion = serializers.CharField(
        max_length=TEXT_MAX,
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        help_text="The model's answer; by default a trailing assistant message's",
    )
    model = serializers.CharField(max_length=200, required=False, allow_blank=True)
    tier = serializers.IntegerField(min_value=1, required=False, allow_null=True, help_text="A tier id")
    score = serializers.FloatField(required=False, allow_null=True)
    success = serializers.BooleanField(required=False, allow_null=True)
    feedback = FeedbackInputSerializer(required=False)
    latency_ms = serializers.FloatField(required=False, allow_null=True, min_value=0)
    metadata = serializers.DictField(required=False)
    timestamp = serializers.DateTimeField(
        required=False, help_text="When it happened (default: received); from the year 1970 on"
    )

    def validate_timestamp(self, value: datetime) -> datetime:
        # A year before 1000 has no four-digit ISO 8601 form: it could be stored but never read
        # back as a date-time. No production trace predates 1970.
        if value.year < EARLIEST_YEAR:
            raise serializers.ValidationError(f"must be in {EARLIEST_YEAR} or later")
        return value


class TraceBatchInputSerializer(serializers.Serializer):
    project = serializers.IntegerField(min_value=1)
    # DRF passes max_length on to the list serializer `many=True` makes; its stubs do not say so.
    traces = TraceInputSerializer(many=True, allow_empty=False, max_length=BATCH_MAX)  # type: ignore[call-arg]


class TraceFilterSerializer(serializers.Serializer):
    project = serializers.IntegerField(required=False, min_value=1)
    q = serializers.CharField(
        required=False, max_length=200, help_text="Words in the prompt, completion or correction"
    )
    trace_id = serializers.CharField(required=False, max_length=200, help_text="Your id of a trace")
    model = serializers.CharField(required=False, max_length=200)
    tier = serializers.IntegerField(required=False, min_value=1)
    thumbs = serializers.ChoiceField(choices=THUMBS_FILTER, required=False, help_text="none: no thumbs given")
    success = serializers.BooleanField(required=False, allow_null=True, default=None)
    has_correction = serializers.BooleanField(required=False, allow_null=True, default=None)
    min_score = serializers.FloatField(required=False)
    max_score = serializers.FloatField(required=False)
    since = serializers.DateTimeField(required=False, help_text="Happened at or after")
    until = serializers.DateTimeField(required=False, help_text="Happened before")
    # A declared field named like Field.label: DRF's metaclass takes it out of the class attributes.
    label = serializers.ChoiceField(  # type: ignore[assignment]
        choices=REVIEW_LABELS,
        required=False,
        help_text="A review label, or unreviewed",
    )
    meta = serializers.CharField(required=False, max_length=300, help_text="key:value, a metadata value")

    def validate_meta(self, value: str) -> str:
        try:
            meta_filter(value)
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.message_dict["meta"]) from None
        return value


class TracePromoteInputSerializer(serializers.Serializer):
    project = serializers.IntegerField(min_value=1)
    traces = serializers.ListField(
        child=serializers.IntegerField(min_value=1),
        required=False,
        max_length=10_000,
        help_text="Trace ids (Flywheel's); or filters",
    )
    filters = TraceFilterSerializer(required=False, help_text="Promote every trace that matches")
    task_set = serializers.IntegerField(min_value=1, required=False, help_text="A task set id of the project")
    task_set_name = serializers.CharField(
        max_length=100, required=False, help_text='Or a name: the set is made if missing (default "traces")'
    )
    split = serializers.ChoiceField(
        choices=("train", "heldout", "auto"),
        default="train",
        help_text="Where promoted items land: train (default), heldout, or auto (the set's seeded rule)",
    )

    def validate(self, data: dict) -> dict:
        if ("traces" in data) == ("filters" in data):
            raise serializers.ValidationError({"traces": "give traces (ids) or filters, one of them"})
        return data


# --- output --------------------------------------------------------------------------------


class FeedbackSerializer(serializers.Serializer):
    thumbs = serializers.CharField(allow_null=True)
    correction = serializers.CharField(allow_blank=True)
    comment = serializers.CharField(allow_blank=True)


class TraceSerializer(serializers.ModelSerializer):
    trace_id = serializers.CharField(source="external_id", read_only=True)
    messages = serializers.ListField(child=serializers.DictField(), read_only=True)
    feedback = serializers.SerializerMethodField()
    metadata = serializers.DictField(read_only=True)
    labels = serializers.SerializerMethodField(help_text="Its review labels, one per reviewer")

    class Meta:
        model = Trace
        fields = [
            "id",
            "project",
            "trace_id",
            "prompt",
            "messages",
            "completion",
            "model",
            "tier",
            "score",
            "success",
            "feedback",
            "latency_ms",
            "metadata",
            "labels",
            "occurred_at",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    @extend_schema_field(FeedbackSerializer)
    def get_feedback(self, trace: Trace) -> dict:
        return {
            "thumbs": trace.thumbs or None,
            "correction": trace.correction,
            "comment": trace.feedback_comment,
        }

    def get_labels(self, trace: Trace) -> list[str]:
        return sorted({review.label for review in trace.reviews.all()})


class IngestedTraceSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="Flywheel's id of the trace")
    trace_id = serializers.CharField(help_text="Yours")
    result = serializers.ChoiceField(choices=["created", "updated", "unchanged"])


class IngestResultSerializer(serializers.Serializer):
    project = serializers.IntegerField()
    received = serializers.IntegerField(help_text="Distinct trace ids in the batch")
    created = serializers.IntegerField()
    updated = serializers.IntegerField()
    unchanged = serializers.IntegerField()
    traces = IngestedTraceSerializer(many=True)


class PromotionCountsSerializer(serializers.Serializer):
    traces = serializers.IntegerField(help_text="Selected")
    answer_items = serializers.IntegerField(help_text="Items made from them")
    preference_pairs = serializers.IntegerField(help_text="Of those, items holding a chosen/rejected pair")
    kept_items = serializers.IntegerField(help_text="Items of the set's latest version kept")
    skipped = serializers.DictField(child=serializers.IntegerField(), help_text="no_prompt, no_reference")


class PromotionSerializer(serializers.Serializer):
    task_set = serializers.IntegerField()
    task_set_version = serializers.IntegerField(help_text="The version's id")
    number = serializers.IntegerField()
    item_count = serializers.IntegerField()
    split_counts = serializers.DictField(child=serializers.IntegerField())
    created = serializers.BooleanField(help_text="false: the same items as the latest version, reused")
    counts = PromotionCountsSerializer()

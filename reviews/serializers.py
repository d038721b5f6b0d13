"""Reviews over REST: what a client sends and sees of labels, preferences and queues."""

from rest_framework import serializers

from reviews.exports import FORMATS, LABELS_FORMAT
from reviews.models import Preference, QueueItem, Review, ReviewQueue
from runs.api.run_serializers import RunDetailSerializer, TrajectoryFilterSerializer, TrajectorySerializer
from traces.serializers import TraceFilterSerializer, TraceSerializer

TRAIN_METHODS = (("sft", "SFT"), ("dpo", "DPO"))

# --- query parameters ----------------------------------------------------------------------


class ReviewFilterSerializer(serializers.Serializer):
    run = serializers.IntegerField(required=False, min_value=1)
    trajectory = serializers.IntegerField(required=False, min_value=1)
    trace = serializers.IntegerField(required=False, min_value=1, help_text="A trace id")
    # Shadows Field.label in the stubs; DRF's metaclass moves declared fields off the class.
    label = serializers.ChoiceField(choices=Review.Label.choices, required=False)  # type: ignore[assignment]
    reviewer = serializers.IntegerField(required=False, min_value=1, help_text="A user id")


class RunScopeSerializer(serializers.Serializer):
    run = serializers.IntegerField(required=False, min_value=1)


class QueueScopeSerializer(RunScopeSerializer):
    project = serializers.IntegerField(required=False, min_value=1)
    # Shadows Field.source in the stubs; DRF's metaclass moves declared fields off the class.
    source = serializers.ChoiceField(  # type: ignore[assignment]
        choices=ReviewQueue.Source.choices, required=False
    )


class ExportQuerySerializer(serializers.Serializer):
    run = serializers.IntegerField(min_value=1)
    kind = serializers.ChoiceField(
        choices=[*FORMATS, LABELS_FORMAT],
        default="sft",
        help_text="sft: answer items of good completions; dpo: prompt/chosen/rejected pairs; "
        "dpo-task-set: those pairs as answer items; labels: every label and comment (trajectory, item, "
        "reviewer, label, comment, reward, outcome, times)",
    )


# --- input ---------------------------------------------------------------------------------


class ReviewInputSerializer(serializers.Serializer):
    trajectory = serializers.IntegerField(min_value=1, required=False, help_text="A trajectory, or")
    trace = serializers.IntegerField(min_value=1, required=False, help_text="a production trace")
    # Shadows Field.label in the stubs; DRF's metaclass moves declared fields off the class.
    label = serializers.ChoiceField(choices=Review.Label.choices)  # type: ignore[assignment]
    comment = serializers.CharField(required=False, allow_blank=True, default="", max_length=10_000)

    def validate(self, data: dict) -> dict:
        if ("trajectory" in data) == ("trace" in data):
            raise serializers.ValidationError({"trajectory": "label a trajectory or a trace, one of them"})
        return data


class PreferenceInputSerializer(serializers.Serializer):
    chosen = serializers.IntegerField(min_value=1, help_text="The better trajectory's id")
    rejected = serializers.IntegerField(min_value=1, help_text="A trajectory for the same prompt")
    comment = serializers.CharField(required=False, allow_blank=True, default="", max_length=10_000)


class QueueFiltersSerializer(TrajectoryFilterSerializer):
    """The trajectory filters a queue is built from (its run is the queue's)."""

    # None takes the inherited filter out (DRF's way of removing a declared field).
    run = None  # type: ignore[assignment]
    after = None  # type: ignore[assignment]


class QueueTraceFiltersSerializer(TraceFilterSerializer):
    """The trace filters a queue over traces is built from (its project is the queue's)."""

    # None takes the inherited filter out (DRF's way of removing a declared field).
    project = None  # type: ignore[assignment]


class QueueInputSerializer(serializers.Serializer):
    # Shadows Field.source in the stubs; DRF's metaclass moves declared fields off the class.
    source = serializers.ChoiceField(  # type: ignore[assignment]
        choices=ReviewQueue.Source.choices,
        default=ReviewQueue.Source.TRAJECTORIES,
        help_text="trajectories: a run's (give run and filters); traces: a project's (give project "
        "and trace_filters)",
    )
    run = serializers.IntegerField(min_value=1, required=False)
    project = serializers.IntegerField(min_value=1, required=False)
    name = serializers.CharField(max_length=100)
    filters = QueueFiltersSerializer(required=False, default=dict)
    trace_filters = QueueTraceFiltersSerializer(required=False, default=dict)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=10_000)

    def validate(self, data: dict) -> dict:
        needed = "run" if data["source"] == ReviewQueue.Source.TRAJECTORIES else "project"
        if needed not in data:
            raise serializers.ValidationError({needed: f"is required for a queue over {data['source']}"})
        return data


class AssignInputSerializer(serializers.Serializer):
    reviewers = serializers.ListField(
        child=serializers.IntegerField(min_value=1), help_text="User ids, dealt open items in turn"
    )
    reassign = serializers.BooleanField(default=False, help_text="Also deal items already assigned")


# --- output --------------------------------------------------------------------------------


class ReviewSerializer(serializers.ModelSerializer):
    reviewer_username = serializers.CharField(source="reviewer.get_username", read_only=True)

    class Meta:
        model = Review
        fields = [
            "id",
            "trajectory",
            "trace",
            "reviewer",
            "reviewer_username",
            "label",
            "comment",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class PreferenceSerializer(serializers.ModelSerializer):
    class Meta:
        model = Preference
        fields = ["id", "run", "chosen", "rejected", "reviewer", "comment", "created_at"]
        read_only_fields = fields


class ReviewQueueSerializer(serializers.ModelSerializer):
    filters = serializers.DictField(read_only=True)
    item_count = serializers.IntegerField(read_only=True)
    done_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = ReviewQueue
        fields = [
            "id",
            "project",
            "source",
            "run",
            "name",
            "filters",
            "item_count",
            "done_count",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields


class QueueItemSerializer(serializers.ModelSerializer):
    trajectory = TrajectorySerializer(
        read_only=True, allow_null=True, help_text="In a queue over trajectories"
    )
    trace = TraceSerializer(read_only=True, allow_null=True, help_text="In a queue over traces")

    class Meta:
        model = QueueItem
        fields = ["id", "queue", "position", "assignee", "done_at", "trajectory", "trace", "created_at"]
        read_only_fields = fields


class AssignResultSerializer(serializers.Serializer):
    assigned = serializers.IntegerField(help_text="Items dealt")


# --- train on reviews ----------------------------------------------------------------------


class TrainOnReviewsInputSerializer(serializers.Serializer):
    method = serializers.ChoiceField(
        choices=TRAIN_METHODS,
        help_text="sft: on completions labelled good; dpo: on preferences and good-over-bad pairs",
    )
    name = serializers.CharField(max_length=100, required=False, help_text="The new run's name")
    max_steps = serializers.IntegerField(
        min_value=1, max_value=100_000, required=False, help_text="Learner steps (default 10)"
    )
    hyperparameters = serializers.DictField(
        required=False,
        help_text="The method's hyperparameters by name; by default the parent's eval_items, "
        "pass_threshold and seed, and enough epochs for max_steps",
    )
    task_set_name = serializers.CharField(
        max_length=100,
        required=False,
        help_text='The task set that gets the new version (default: "<the run\'s task set> reviews")',
    )


class SkippedCountsSerializer(serializers.Serializer):
    empty = serializers.IntegerField(help_text="An empty completion")
    identical = serializers.IntegerField(help_text="A pair whose two completions are the same text")
    duplicate = serializers.IntegerField(help_text="A repeat of a record already taken")
    multi_step = serializers.IntegerField(help_text="An agent episode: not one completion")


class TrainingCountsSerializer(serializers.Serializer):
    examples = serializers.IntegerField(required=False, help_text="SFT: good completions")
    pairs = serializers.IntegerField(required=False, help_text="DPO: preference pairs")
    from_preferences = serializers.IntegerField(required=False, help_text="DPO: pairs a reviewer chose")
    from_labels = serializers.IntegerField(required=False, help_text="DPO: good-over-bad pairs from labels")
    heldout_items = serializers.IntegerField(help_text="The parent's held-out items, kept for evaluation")
    skipped = SkippedCountsSerializer()


class TrainingPreviewSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    checkpoint = serializers.IntegerField(
        allow_null=True, help_text="The checkpoint a new run would start from; null: none yet"
    )
    sft = TrainingCountsSerializer()
    dpo = TrainingCountsSerializer()


class NewVersionSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    task_set = serializers.IntegerField()
    task_set_name = serializers.CharField()
    number = serializers.IntegerField()
    item_count = serializers.IntegerField()
    split_counts = serializers.DictField(child=serializers.IntegerField())
    created = serializers.BooleanField(help_text="false: identical to the set's latest version, reused")


class TrainOnReviewsSerializer(serializers.Serializer):
    run = RunDetailSerializer(help_text="The new run, as GET runs/{id} shows it")
    # Shadows Field.parent in the stubs; DRF's metaclass moves declared fields off the class.
    parent = serializers.IntegerField(help_text="The reviewed run")  # type: ignore[assignment]
    checkpoint = serializers.IntegerField(help_text="The parent's checkpoint the new run starts from")
    task_set_version = NewVersionSerializer()
    counts = TrainingCountsSerializer()
    compare_url = serializers.CharField(help_text="The page comparing the new run with its parent")
    control = RunDetailSerializer(
        help_text="The control: the same checkpoint continued for the same steps by the parent's own "
        "method and settings, without the reviews"
    )
    training = serializers.IntegerField(help_text="The Train on reviews record (GET review-trainings/{id})")
    result_url = serializers.CharField(help_text="Its result: the lift over the control")


class RunFigureSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    name = serializers.CharField()
    status = serializers.CharField()
    outcome = serializers.CharField(
        allow_null=True, help_text="improved / unchanged / regressed; null until settled"
    )
    before = serializers.FloatField(allow_null=True, help_text="Held-out pass rate of the parent checkpoint")
    after = serializers.FloatField(allow_null=True, help_text="Held-out pass rate of the run's final version")
    delta = serializers.FloatField(allow_null=True)
    low = serializers.FloatField(allow_null=True, help_text="Paired 95% bootstrap interval on delta")
    high = serializers.FloatField(allow_null=True)
    items = serializers.IntegerField(allow_null=True)
    verdict = serializers.CharField(allow_null=True)
    sentence = serializers.CharField(help_text="The outcome in words; empty until settled")


class LiftSerializer(serializers.Serializer):
    before = serializers.FloatField(help_text="The control's final held-out pass rate on the paired items")
    after = serializers.FloatField(help_text="The reviews run's final held-out pass rate on the same items")
    delta = serializers.FloatField(help_text="after - before: the lift over the control")
    low = serializers.FloatField(help_text="Paired bootstrap interval on delta")
    high = serializers.FloatField()
    confidence = serializers.FloatField()
    items = serializers.IntegerField(help_text="Held-out items both runs measured")
    improved_items = serializers.IntegerField()
    regressed_items = serializers.IntegerField()
    control_step = serializers.IntegerField()
    run_step = serializers.IntegerField()
    verdict = serializers.CharField(
        help_text="beats_control / loses_to_control only when the interval excludes 0, else no_difference"
    )


class ReviewTrainingSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    status = serializers.ChoiceField(
        choices=("pending", "complete", "incomplete"),
        help_text="pending: a run is still active; incomplete: one ended without a final evaluation",
    )
    method = serializers.CharField()
    steps = serializers.IntegerField()
    # Shadows Field.parent in the stubs; DRF's metaclass moves declared fields off the class.
    parent = serializers.IntegerField(help_text="The reviewed run")  # type: ignore[assignment]
    checkpoint = serializers.IntegerField(allow_null=True, help_text="The checkpoint both runs start from")
    counts = TrainingCountsSerializer()
    run = RunFigureSerializer(help_text="The reviews run against the parent checkpoint")
    control = RunFigureSerializer(allow_null=True, help_text="The control against the parent checkpoint")
    lift_over_control = LiftSerializer(allow_null=True, help_text="null until both runs are complete")
    regressed = serializers.BooleanField(help_text="The reviews run ended worse than its parent checkpoint")
    flags = serializers.ListField(
        child=serializers.CharField(), help_text="What must not be missed, in words"
    )
    compare_url = serializers.CharField(help_text="The page comparing the reviews run with its control")

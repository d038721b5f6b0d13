"""Runs over REST: what a launch, a clone or a fork may ask for (types and shapes; the lifecycle
checks the rules), and what a client sees of runs, events, metrics, trajectories and checkpoints."""

from typing import Any, cast

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.api import INT64_MAX, INT64_MIN
from inference.token_text import token_texts
from projects.models import TaskItem
from runs import lifecycle, scheduling, selectors
from runs.learners import launch_choices
from runs.models import Checkpoint, Run, RunEvent, Trajectory, TrajectoryStep
from runs.outcomes import CHANGES

INT32_MAX = 2**31 - 1
PREVIEW_CHARS = 200
HYPERPARAMETERS_HELP = 'By name; a value or "auto" (or leave it out) for the method\'s default'

# --- query parameters ----------------------------------------------------------------------


class RunFilterSerializer(serializers.Serializer):
    project = serializers.IntegerField(required=False, min_value=1, help_text="Only this project's")
    status = serializers.ChoiceField(choices=Run.Status.choices, required=False)


class EventFilterSerializer(serializers.Serializer):
    since = serializers.IntegerField(
        required=False,
        min_value=0,
        help_text="Only events after this event id, oldest first: what a client missed while away",
    )
    level = serializers.ChoiceField(choices=RunEvent.Level.choices, required=False)


class MetricFilterSerializer(serializers.Serializer):
    name = serializers.ListField(
        child=serializers.CharField(max_length=100), required=False, help_text="Repeat for several"
    )
    since_step = serializers.IntegerField(required=False, min_value=0, help_text="From this step on")
    max_points = serializers.IntegerField(
        required=False,
        min_value=2,
        max_value=100000,
        help_text="Downsample each series to at most this many points; every bucket keeps its min and max",
    )


class HeldOutCompareQuerySerializer(serializers.Serializer):
    against = serializers.IntegerField(
        required=False,
        min_value=INT64_MIN,
        max_value=INT64_MAX,
        help_text="The run compared against (a control, the parent); default: this run",
    )
    step = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=INT64_MAX,
        help_text="This run's version; default: its newest evaluated one",
    )
    against_step = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=INT64_MAX,
        help_text="The other side's version; default: its newest evaluated one, or 0 against this run itself",
    )
    metric = serializers.RegexField(
        r"^heldout/(pass_rate|reward(/[A-Za-z0-9_.-]{1,60})?)$",
        default="heldout/pass_rate",
        required=False,
        help_text="heldout/pass_rate, heldout/reward, or heldout/reward/<grader> (one grader of a multi "
        "rule: only the items it graded on both sides)",
    )
    change = serializers.ChoiceField(choices=CHANGES, required=False)
    kind = serializers.CharField(required=False, max_length=20, help_text="Only items of this kind")
    sort = serializers.ChoiceField(
        choices=("change", "-change"), default="-change", required=False, help_text="-change: gains first"
    )


class HeldOutSummarySerializer(serializers.Serializer):
    verdict = serializers.ChoiceField(choices=Run.Outcome.choices)
    before = serializers.FloatField()
    after = serializers.FloatField()
    delta = serializers.FloatField()
    low = serializers.FloatField()
    high = serializers.FloatField()
    confidence = serializers.FloatField()
    items = serializers.IntegerField()
    improved_items = serializers.IntegerField()
    regressed_items = serializers.IntegerField()


class HeldOutItemSerializer(serializers.Serializer):
    item = serializers.IntegerField()
    external_id = serializers.CharField()
    kind = serializers.CharField()
    before = serializers.FloatField()
    after = serializers.FloatField()
    change = serializers.ChoiceField(choices=CHANGES)
    before_completion = serializers.CharField()
    after_completion = serializers.CharField()


class HeldOutCompareSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    step = serializers.IntegerField()
    against = serializers.IntegerField()
    against_step = serializers.IntegerField()
    metric = serializers.CharField()
    summary = HeldOutSummarySerializer(help_text="Over every item both sides measured, filters aside")
    items = HeldOutItemSerializer(many=True, help_text="After the filters, sorted by the change")


REVIEW_LABELS = ("good", "bad", "reward_hack", "infrastructure_error", "unreviewed")
MONITOR_ACTIONS = ("alert", "pause", "stop")


class TrajectoryFilterSerializer(serializers.Serializer):
    run = serializers.IntegerField(required=False, min_value=1)
    outcome = serializers.ChoiceField(choices=Trajectory.Outcome.choices, required=False)
    policy_version = serializers.IntegerField(required=False, min_value=0)
    min_reward = serializers.FloatField(required=False)
    max_reward = serializers.FloatField(required=False)
    step = serializers.IntegerField(required=False, min_value=0, help_text="Learned in this learner step")
    batch = serializers.IntegerField(required=False, min_value=1, help_text="A rollout batch id")
    item = serializers.IntegerField(required=False, min_value=1, help_text="A task item id")
    task = serializers.CharField(required=False, max_length=200, help_text="A task item's external id")
    flagged = serializers.BooleanField(
        required=False,
        allow_null=True,
        default=None,
        help_text="true: only those the reward-hacking detectors flagged; false: only unflagged",
    )
    flag = serializers.CharField(required=False, max_length=100, help_text="Only those with this flag")
    # A declared field named like Field.label: DRF's metaclass takes it out of the class attributes.
    label = serializers.ChoiceField(  # type: ignore[assignment]
        choices=REVIEW_LABELS, required=False, help_text="A review label, or unreviewed"
    )
    after = serializers.IntegerField(
        required=False, min_value=0, help_text="Only larger ids: what a live view has not seen yet"
    )


class StepFilterSerializer(serializers.Serializer):
    index = serializers.IntegerField(required=False, min_value=0, help_text="Only this step")


class CheckpointFilterSerializer(serializers.Serializer):
    run = serializers.IntegerField(required=False, min_value=1)


# --- input ---------------------------------------------------------------------------------


class RunOverridesSerializer(serializers.Serializer):
    """What a clone or a fork changes; everything left out stays as in the parent run."""

    name = serializers.CharField(max_length=100, required=False)
    task_set_version = serializers.IntegerField(min_value=1, required=False, help_text="A version id")
    reward_rule_version = serializers.IntegerField(
        min_value=1, required=False, help_text="A reward rule version id"
    )
    tier = serializers.IntegerField(min_value=1, required=False, help_text="A tier id")
    # The registered algorithms (runs/learners.py), read per request: `__init__` sets them.
    method = serializers.ChoiceField(choices=Run.Method.choices, required=False)
    hyperparameters = serializers.DictField(
        required=False, help_text=f"{HYPERPARAMETERS_HELP}. Merged over the parent's"
    )
    max_steps = serializers.IntegerField(max_value=INT32_MAX, required=False)
    max_wall_seconds = serializers.IntegerField(max_value=INT32_MAX, required=False, allow_null=True)
    max_sandbox_cpu_seconds = serializers.FloatField(required=False, allow_null=True)
    budget_money = serializers.DecimalField(
        max_digits=14,
        decimal_places=2,
        required=False,
        allow_null=True,
        help_text="What the run may cost; reaching it pauses the run at a step boundary",
    )
    budget_device_hours = serializers.FloatField(
        required=False, allow_null=True, help_text="Device-hours the run may use before it pauses"
    )
    priority = serializers.IntegerField(min_value=-INT32_MAX, max_value=INT32_MAX, required=False)
    train_split = serializers.ChoiceField(choices=TaskItem.Split.choices, required=False)
    eval_split = serializers.ChoiceField(choices=TaskItem.Split.choices, required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cast(serializers.ChoiceField, self.fields["method"]).choices = launch_choices()


class RunCreateSerializer(RunOverridesSerializer):
    """A launch: what to train on, how it is scored, which model samples, the method and budgets."""

    project = serializers.IntegerField(min_value=1)
    name = serializers.CharField(max_length=100)
    task_set_version = serializers.IntegerField(min_value=1, help_text="A version id")
    reward_rule_version = serializers.IntegerField(min_value=1, help_text="A reward rule version id")
    tier = serializers.IntegerField(min_value=1, help_text="A tier id: the model and how it samples")
    method = serializers.ChoiceField(choices=Run.Method.choices, default=Run.Method.GRPO)
    hyperparameters = serializers.DictField(required=False, help_text=HYPERPARAMETERS_HELP)
    max_steps = serializers.IntegerField(max_value=INT32_MAX, default=20, help_text="Learner steps")
    priority = serializers.IntegerField(
        min_value=-INT32_MAX, max_value=INT32_MAX, default=0, help_text="Higher starts first"
    )
    train_split = serializers.ChoiceField(choices=TaskItem.Split.choices, default="train")
    eval_split = serializers.ChoiceField(choices=TaskItem.Split.choices, default="heldout")
    monitors = serializers.DictField(
        child=serializers.FloatField(),
        required=False,
        help_text="Alert thresholds by name (runs/{id}/monitors)",
    )
    monitor_actions = serializers.DictField(
        child=serializers.ChoiceField(choices=MONITOR_ACTIONS),
        required=False,
        help_text=(
            "By monitor: alert, pause, or stop (the run ends as failed); each monitor alerts by "
            'default but nothing_to_learn, which stops. e.g. {"reward_hacking": "pause"}'
        ),
    )


# --- runs ----------------------------------------------------------------------------------


class RunErrorSerializer(serializers.Serializer):
    message = serializers.CharField()
    where = serializers.CharField(help_text="The part of the system that failed, such as learner")


class ProgressSerializer(serializers.Serializer):
    learner_step = serializers.IntegerField(help_text="The last finished learner step")
    max_steps = serializers.IntegerField()
    policy_version = serializers.IntegerField(help_text="The newest published policy version")
    restarts = serializers.IntegerField(help_text="Automatic restarts after a crash")
    sandbox_cpu_seconds = serializers.FloatField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    heartbeat_at = serializers.DateTimeField(allow_null=True, help_text="The learner's last sign of life")


class RunOutcomeSerializer(serializers.Serializer):
    verdict = serializers.ChoiceField(
        choices=Run.Outcome.choices,
        help_text="improved or regressed only when the interval on the change excludes 0",
    )
    metric = serializers.CharField(help_text="What is compared per item: heldout/pass_rate")
    from_step = serializers.IntegerField(help_text="The start: version 0, the base or the forked checkpoint")
    to_step = serializers.IntegerField(help_text="The final policy version")
    before = serializers.FloatField(help_text="The start's mean over the items both measured")
    after = serializers.FloatField(help_text="The final version's mean over the same items")
    delta = serializers.FloatField(help_text="after - before")
    low = serializers.FloatField(help_text="The paired bootstrap interval on delta: its lower end")
    high = serializers.FloatField(help_text="Its upper end")
    confidence = serializers.FloatField(help_text="The interval's confidence, 0.95")
    items = serializers.IntegerField(help_text="Held-out items measured at both ends")
    improved_items = serializers.IntegerField()
    regressed_items = serializers.IntegerField()


class RunSerializer(serializers.ModelSerializer):
    error = serializers.SerializerMethodField(help_text="Why it failed; null unless it failed")
    outcome = serializers.SerializerMethodField(
        help_text="Whether the run made the model better: its final held-out results against its "
        "start, item by item; null until the final evaluation is in"
    )
    queue_position = serializers.SerializerMethodField(
        help_text="1 starts next in its project; null when not queued"
    )
    queue_reason = serializers.SerializerMethodField(
        help_text="Why a queued run waits (a project's or a user's quota in use); null when not queued"
    )
    # One nested serializer for the whole list (not one built per run: most of a list's time).
    progress = ProgressSerializer(source="*", read_only=True)

    class Meta:
        model = Run
        fields = [
            "id",
            "project",
            "name",
            "status",
            "error",
            "method",
            "task_set_version",
            "reward_rule_version",
            "tier",
            "priority",
            "calibration",
            "queue_position",
            "queue_reason",
            "progress",
            "outcome",
            "parent",
            "parent_checkpoint",
            "created_by",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    @extend_schema_field(RunErrorSerializer(allow_null=True))
    def get_error(self, run: Run) -> dict | None:
        if not run.error:
            return None
        return {"message": str(run.error.get("message", "")), "where": str(run.error.get("where", ""))}

    @extend_schema_field(RunOutcomeSerializer(allow_null=True))
    def get_outcome(self, run: Run) -> dict | None:
        return run.outcome_detail if run.outcome else None

    def get_queue_reason(self, run: Run) -> str | None:
        reasons = self.context.get("queue_reasons")
        return reasons.get(run.pk) if reasons is not None else scheduling.queue_reason(run)

    def get_queue_position(self, run: Run) -> int | None:
        positions = self.context.get("queue_positions")
        return positions.get(run.pk) if positions is not None else lifecycle.queue_position(run)


class ConfigChangeSerializer(serializers.Serializer):
    field = serializers.CharField(help_text="Dotted, such as resolved.group_size or tier_config.precision")
    # A declared field named like Field.parent: DRF's metaclass takes it out of the class attributes.
    parent = serializers.JSONField(  # type: ignore[assignment]
        help_text="The parent's value (null when it had none)"
    )
    run = serializers.JSONField(help_text="This run's value (null when it has none)")


class BestCheckpointSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    step = serializers.IntegerField()
    metric = serializers.CharField(help_text="The run's best_metric, which chose it")
    value = serializers.FloatField(help_text="The checkpoint's value of that metric")
    heldout_reward = serializers.FloatField(allow_null=True, help_text="The first tie-break")


class RunDetailSerializer(RunSerializer):
    hyperparameters = serializers.DictField(read_only=True, help_text="As submitted; may hold auto")
    resolved = serializers.DictField(read_only=True, help_text="Every hyperparameter with its value")
    tier_config = serializers.DictField(read_only=True, help_text="The tier's settings at launch")
    config_diff = serializers.SerializerMethodField(help_text="Against the parent; null without one")
    best_checkpoint = serializers.SerializerMethodField(
        help_text="The checkpoint with the highest held-out best_metric (ties: the higher held-out "
        "reward, then the earlier step): what Export, Try and Train on reviews default to; null "
        "while none is evaluated"
    )

    class Meta(RunSerializer.Meta):
        fields = [
            *RunSerializer.Meta.fields,
            "train_split",
            "eval_split",
            "hyperparameters",
            "resolved",
            "tier_config",
            "max_steps",
            "max_wall_seconds",
            "max_sandbox_cpu_seconds",
            "budget_money",
            "budget_device_hours",
            "config_diff",
            "best_checkpoint",
        ]
        read_only_fields = fields

    @extend_schema_field(ConfigChangeSerializer(many=True, allow_null=True))
    def get_config_diff(self, run: Run) -> list[dict[str, Any]] | None:
        return None if run.parent is None else lifecycle.config_diff(run.parent, run)

    @extend_schema_field(BestCheckpointSerializer(allow_null=True))
    def get_best_checkpoint(self, run: Run) -> dict[str, Any] | None:
        scores = selectors.checkpoint_scores_of(run=run)
        best = selectors.checkpoint_best_id(run, scores)
        if best is None:
            return None
        metric = selectors.best_metric_of(run)
        return {
            "id": best,
            "step": run.checkpoints.values_list("step", flat=True).get(pk=best),
            "metric": metric,
            "value": scores[best][metric],
            "heldout_reward": scores[best].get(selectors.HELDOUT_REWARD),
        }


# --- the record ----------------------------------------------------------------------------


class RunEventSerializer(serializers.ModelSerializer):
    # A declared field named like Serializer.data: DRF's metaclass takes it out of the class attributes.
    data = serializers.DictField(read_only=True)  # type: ignore[assignment]

    class Meta:
        model = RunEvent
        fields = ["id", "run", "level", "kind", "message", "data", "created_at"]
        read_only_fields = fields


class MetricPointSerializer(serializers.Serializer):
    step = serializers.IntegerField()
    value = serializers.FloatField()

    def to_representation(self, point: tuple[int, float]) -> dict[str, Any]:
        return {"step": point[0], "value": point[1]}


class MetricSeriesSerializer(serializers.Serializer):
    name = serializers.CharField()
    count = serializers.IntegerField(help_text="Points stored in the range asked for")
    downsampled = serializers.BooleanField(help_text="true: `points` keeps each bucket's min and max")
    points = MetricPointSerializer(many=True, help_text="By step")


class StepAxesSerializer(serializers.Serializer):
    wall_seconds = serializers.DictField(
        child=serializers.FloatField(), help_text="Step -> seconds from the run's first metric to the step's"
    )
    tokens = serializers.DictField(
        child=serializers.IntegerField(), help_text="Step -> completion tokens learned from, up to that step"
    )


class RunMetricsSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    metrics = MetricSeriesSerializer(many=True, help_text="One series a metric name, by name")
    axes = StepAxesSerializer(help_text="Other x-axes for charts: wall time and tokens, by step")


class TrajectorySerializer(serializers.ModelSerializer):
    item_external_id = serializers.CharField(source="item.external_id", read_only=True)
    components = serializers.DictField(read_only=True, help_text="Each sub-reward by name")
    # A declared field named like Serializer.errors: DRF's metaclass takes it out of the class attributes.
    errors = serializers.ListField(child=serializers.JSONField(), read_only=True)  # type: ignore[assignment]
    flags = serializers.ListField(child=serializers.JSONField(), read_only=True)
    labels = serializers.SerializerMethodField(help_text="Its review labels, one per reviewer")
    prompt_preview = serializers.SerializerMethodField(
        help_text="The item's prompt, its first 200 characters"
    )
    completion_preview = serializers.SerializerMethodField(help_text="The output, its first 200 characters")

    class Meta:
        model = Trajectory
        fields = [
            "id",
            "run",
            "batch",
            "item",
            "item_external_id",
            "sample_index",
            "policy_version",
            "outcome",
            "reward",
            "components",
            "errors",
            "flags",
            "prompt_tokens",
            "completion_tokens",
            "step_count",
            "wall_seconds",
            "cut_off",
            "learned_in_step",
            "advantage",
            "labels",
            "prompt_preview",
            "completion_preview",
            "created_at",
        ]
        read_only_fields = fields

    def get_prompt_preview(self, trajectory: Trajectory) -> str:
        return trajectory.item.text[:PREVIEW_CHARS]

    def get_completion_preview(self, trajectory: Trajectory) -> str:
        return trajectory.completion_text[:PREVIEW_CHARS]

    def get_labels(self, trajectory: Trajectory) -> list[str]:
        return sorted({review.label for review in trajectory.reviews.all()})


class TrajectoryDetailSerializer(TrajectorySerializer):
    class Meta(TrajectorySerializer.Meta):
        fields = [*TrajectorySerializer.Meta.fields, "completion_text"]
        read_only_fields = fields


class TrajectoryStepSerializer(serializers.ModelSerializer):
    # A declared field named like Serializer.data: DRF's metaclass takes it out of the class attributes.
    data = serializers.SerializerMethodField(  # type: ignore[assignment]
        help_text="The step's payload: observation, action, tool result, tokens, timing"
    )

    class Meta:
        model = TrajectoryStep
        fields = ["id", "trajectory", "index", "kind", "raw_size", "data"]
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_data(self, step: TrajectoryStep) -> dict[str, Any]:
        """The payload; a step that recorded token ids only gains `tokens`, each id's text, when
        the run's tokenizer is readable here (the replay colours text, not ids)."""
        data = step.data()
        ids = data.get("token_ids")
        if isinstance(ids, list) and ids and "tokens" not in data:
            source = step.trajectory.run.tier_config.get("base_model", "")
            texts = token_texts(source, ids) if all(isinstance(i, int) for i in ids) else None
            if texts is not None:
                data["tokens"] = texts
        return data


class CheckpointSerializer(serializers.ModelSerializer):
    metrics = serializers.DictField(read_only=True)
    heldout = serializers.SerializerMethodField(
        help_text="Its held-out scores by metric name (heldout/pass_rate, heldout/reward, per "
        "family and per grader); {} while it is not evaluated"
    )
    heldout_pass_rate = serializers.SerializerMethodField(help_text="null: not evaluated")
    heldout_reward = serializers.SerializerMethodField(help_text="Mean held-out reward; null: not evaluated")
    best = serializers.SerializerMethodField(
        help_text="Whether it is its run's best checkpoint by the run's best_metric"
    )

    class Meta:
        model = Checkpoint
        fields = [
            "id",
            "run",
            "step",
            "policy_version",
            "path",
            "metrics",
            "heldout",
            "heldout_pass_rate",
            "heldout_reward",
            "best",
            "created_at",
        ]
        read_only_fields = fields

    def _scored(self, checkpoint: Checkpoint) -> tuple[dict[int, dict[str, float]], int | None]:
        """Its run's scores and best checkpoint, read once a run for a whole page of checkpoints."""
        # The root's context (a dict the stubs type as a read-only Mapping): shared by a list.
        cache = self.context.setdefault("checkpoint_scores", {})  # type: ignore[attr-defined]
        if checkpoint.run_id not in cache:
            run = checkpoint.run
            scores = selectors.checkpoint_scores_of(run=run)
            cache[checkpoint.run_id] = (scores, selectors.checkpoint_best_id(run, scores))
        return cache[checkpoint.run_id]

    @extend_schema_field(serializers.DictField(child=serializers.FloatField()))
    def get_heldout(self, checkpoint: Checkpoint) -> dict[str, float]:
        return self._scored(checkpoint)[0].get(checkpoint.pk, {})

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_heldout_pass_rate(self, checkpoint: Checkpoint) -> float | None:
        return self.get_heldout(checkpoint).get("heldout/pass_rate")

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_heldout_reward(self, checkpoint: Checkpoint) -> float | None:
        return self.get_heldout(checkpoint).get(selectors.HELDOUT_REWARD)

    def get_best(self, checkpoint: Checkpoint) -> bool:
        return self._scored(checkpoint)[1] == checkpoint.pk


class MonitorSettingSerializer(serializers.Serializer):
    name = serializers.CharField()
    value = serializers.FloatField(help_text="In force for this run")
    default = serializers.FloatField()
    help = serializers.CharField()


class MonitorActionSerializer(serializers.Serializer):
    monitor = serializers.CharField()
    action = serializers.ChoiceField(
        choices=MONITOR_ACTIONS,
        help_text="pause: the run pauses itself when it fires; stop: it ends as failed, the alert its reason",
    )
    help = serializers.CharField()


class RunMonitorsSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    thresholds = MonitorSettingSerializer(many=True)
    actions = MonitorActionSerializer(many=True, help_text="What each monitor does when it fires")


class RunMonitorsInputSerializer(serializers.Serializer):
    thresholds = serializers.DictField(
        child=serializers.FloatField(allow_null=True),
        required=False,
        default=dict,
        help_text="By name; null restores the default. Others stay as they are",
    )
    actions = serializers.DictField(
        child=serializers.ChoiceField(choices=MONITOR_ACTIONS),
        required=False,
        default=dict,
        help_text="By monitor: alert, pause or stop (ends the run as failed). Others stay as they are",
    )

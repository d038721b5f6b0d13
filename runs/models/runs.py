"""Post-training runs and their record: events, metric points, rollout batches, trajectories with
their steps, and checkpoints.

A run binds a task set version, a reward rule version and a tier (whose settings are copied into
the run, since tiers stay editable) to a method and its hyperparameters. The database is the
record; websocket messages only announce changes.
"""

import json
import uuid
import zlib

from django.conf import settings
from django.db import models
from django.utils import timezone

from projects.models import Project, TaskItem, TaskSetVersion
from runs.learners import algorithm_get
from tiers.models import Tier


class Run(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        STARTING = "starting"
        RUNNING = "running"
        PAUSING = "pausing"
        PAUSED = "paused"
        CANCELLING = "cancelling"
        CANCELLED = "cancelled"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    class Outcome(models.TextChoices):
        IMPROVED = "improved"
        UNCHANGED = "unchanged"
        REGRESSED = "regressed"

    class Method(models.TextChoices):  # the built-in algorithms; any registered one is valid
        SFT = "sft", "SFT"
        DPO = "dpo", "DPO"
        GRPO = "grpo", "GRPO"

    ACTIVE = (Status.QUEUED, Status.STARTING, Status.RUNNING, Status.PAUSING, Status.PAUSED)
    TERMINAL = (Status.CANCELLED, Status.SUCCEEDED, Status.FAILED)

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="runs")
    # Names the run's files (policies, checkpoints): unique even across databases that reuse ids.
    key = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    name = models.CharField(max_length=100)
    task_set_version = models.ForeignKey(TaskSetVersion, on_delete=models.PROTECT, related_name="runs")
    train_split = models.CharField(max_length=8, default="train")
    eval_split = models.CharField(max_length=8, default="heldout")
    reward_rule_version = models.ForeignKey(
        "rewards.RewardRuleVersion", on_delete=models.PROTECT, related_name="runs"
    )
    tier = models.ForeignKey(Tier, null=True, on_delete=models.SET_NULL, related_name="runs")
    tier_config = models.JSONField(help_text="The tier's settings when the run was created")
    # A registered algorithm's name (runs/learners.py; Method names the built-in ones).
    method = models.CharField(max_length=32, default=Method.GRPO)
    hyperparameters = models.JSONField(default=dict, help_text="As submitted; may hold 'auto'")
    resolved = models.JSONField(default=dict, help_text="Every hyperparameter with its value")
    monitors = models.JSONField(
        default=dict, blank=True, help_text="Alert thresholds by name; a missing one takes its default"
    )
    monitor_actions = models.JSONField(
        default=dict, blank=True, help_text="What each monitor does when it fires, by name: alert or pause"
    )
    max_steps = models.PositiveIntegerField()
    max_wall_seconds = models.PositiveIntegerField(null=True, blank=True)
    max_sandbox_cpu_seconds = models.FloatField(null=True, blank=True)
    # What the run may cost (costs/): past either, it pauses at the next step boundary until its
    # owner raises the budget and resumes it.
    budget_money = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    budget_device_hours = models.FloatField(null=True, blank=True)
    priority = models.IntegerField(default=0, help_text="Higher runs first")
    # A short run an estimate launched to measure its tier and method (costs/estimates.py): billed
    # like any run (its units are real), and marked as a calibration wherever runs are listed.
    calibration = models.BooleanField(default=False, help_text="Launched by an estimate to calibrate it")
    # Whether the run made the model better: its final held-out results against its start, per
    # item, with a paired bootstrap interval (runs/outcomes.py). Empty until the final evaluation.
    outcome = models.CharField(max_length=12, choices=Outcome.choices, blank=True, default="")
    outcome_detail = models.JSONField(null=True, blank=True, help_text="The figures behind the outcome")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    error = models.JSONField(null=True, blank=True, help_text="Why it failed: message and where")
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    parent_checkpoint = models.ForeignKey(
        "Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks"
    )
    # Progress, written by the learner: the newest published policy and the last finished step.
    policy_version = models.PositiveIntegerField(default=0)
    learner_step = models.PositiveIntegerField(default=0)
    sandbox_cpu_seconds = models.FloatField(default=0.0)
    learner_pid = models.IntegerField(null=True, blank=True)
    learner_host = models.CharField(max_length=255, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    restarts = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["project", "status", "priority", "created_at"])]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"

    @property
    def method_label(self) -> str:
        """The method as people read it (GRPO, SFT...): its registered algorithm's label."""
        algorithm = algorithm_get(self.method)
        return algorithm.label if algorithm is not None else self.method

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL

    @property
    def staleness(self) -> int:
        return int(self.resolved.get("staleness", 0))


class RunEvent(models.Model):
    class Level(models.TextChoices):
        INFO = "info"
        WARNING = "warning"
        ERROR = "error"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    level = models.CharField(max_length=8, choices=Level.choices, default=Level.INFO)
    kind = models.CharField(max_length=40, help_text="status, checkpoint, restart, alert, ...")
    message = models.TextField()
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        indexes = [models.Index(fields=["run", "created_at"])]

    def __str__(self) -> str:
        return f"{self.level}: {self.message}"


class MetricPoint(models.Model):
    """One value of one named metric at one learner step. Written in batches."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_points")
    name = models.CharField(max_length=100)
    step = models.PositiveIntegerField()
    value = models.FloatField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["run", "name", "step"])]

    def __str__(self) -> str:
        return f"{self.name}@{self.step}={self.value}"


class RolloutBatch(models.Model):
    """A unit of rollout work: a group of samples for each of some items, with one policy version.

    Claimed with a conditional update, so a redelivered task finds it taken and does nothing. The
    worker holding it renews `heartbeat_at`; a stale one means the worker died, and it is claimed
    again.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"  # every attempt failed: its episodes are recorded as errored
        CANCELLED = "cancelled"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="rollout_batches")
    index = models.PositiveIntegerField()
    step = models.PositiveIntegerField(default=0, help_text="The learner step this batch feeds")
    policy_version = models.PositiveIntegerField()
    item_ids = models.JSONField(help_text="TaskItem ids, each sampled group_size times")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PENDING)
    worker = models.CharField(max_length=255, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    claimed_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(
        null=True, blank=True, help_text="Renewed by the worker holding it; stale means that worker died"
    )
    deadline_at = models.DateTimeField(
        null=True, blank=True, help_text="Episodes still running then are cut off"
    )
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, help_text="Why the last attempt failed")
    generate_seconds = models.FloatField(default=0.0)
    score_seconds = models.FloatField(default=0.0)
    sandbox_cpu_seconds = models.FloatField(default=0.0, help_text="CPU the sandboxed code used")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "index"], name="rollout_batch_index")]
        indexes = [models.Index(fields=["run", "step", "status"])]

    def __str__(self) -> str:
        return f"run {self.run_id} batch {self.index} (v{self.policy_version}, {self.status})"


class Trajectory(models.Model):
    """One episode: a sampled completion (or a multi-step agent episode) and its score.

    Every trajectory ends in exactly one outcome. `errored` ones (the infrastructure failed) are
    masked from learning, never scored as zero. `learned_in_step` marks that a learner step used it,
    so none is learned from twice, even across restarts.
    """

    class Outcome(models.TextChoices):
        SCORED = "scored"
        ERRORED = "errored"
        CANCELLED = "cancelled"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="trajectories")
    batch = models.ForeignKey(RolloutBatch, null=True, on_delete=models.SET_NULL, related_name="trajectories")
    item = models.ForeignKey(TaskItem, on_delete=models.PROTECT, related_name="+")
    sample_index = models.PositiveSmallIntegerField(default=0, help_text="Index within its group")
    policy_version = models.PositiveIntegerField()
    outcome = models.CharField(max_length=10, choices=Outcome.choices)
    reward = models.FloatField(null=True, blank=True)
    components = models.JSONField(default=dict, blank=True)
    errors = models.JSONField(default=list, blank=True)
    flags = models.JSONField(default=list, blank=True)
    completion_text = models.TextField(blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    step_count = models.PositiveIntegerField(default=0)
    wall_seconds = models.FloatField(default=0.0)
    cut_off = models.BooleanField(default=False, help_text="Stopped at its deadline")
    learned_in_step = models.PositiveIntegerField(null=True, blank=True, db_index=True)
    advantage = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["batch", "item", "sample_index"], name="one_trajectory_per_batch_sample"
            )
        ]
        indexes = [models.Index(fields=["run", "outcome", "learned_in_step", "policy_version"])]

    def __str__(self) -> str:
        return f"trajectory {self.pk} of run {self.run_id} ({self.outcome}, reward {self.reward})"


class TrajectoryStep(models.Model):
    """One step of a trajectory: observation, action, tool result, tokens and log-probs.

    The payload is compressed JSON in its own row, so step k of a huge trajectory opens without
    reading the others.
    """

    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="steps")
    index = models.PositiveIntegerField()
    kind = models.CharField(max_length=20, help_text="completion, tool_call, code, command, message")
    payload = models.BinaryField()
    raw_size = models.PositiveIntegerField()

    class Meta:
        ordering = ["index"]
        constraints = [models.UniqueConstraint(fields=["trajectory", "index"], name="step_index")]

    def __str__(self) -> str:
        return f"step {self.index} of trajectory {self.trajectory_id}"

    @staticmethod
    def pack(data: dict) -> tuple[bytes, int]:
        raw = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
        return zlib.compress(raw, 6), len(raw)

    def data(self) -> dict:
        return json.loads(zlib.decompress(bytes(self.payload)))


class HeldOutResult(models.Model):
    """One held-out item's result under one policy version of a run: what the run's outcome, the
    per-item comparisons and a checkpoint's scores are computed from. Greedy, so one per item."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="heldout_results")
    step = models.PositiveIntegerField(help_text="The policy version evaluated")
    item = models.ForeignKey(TaskItem, on_delete=models.CASCADE, related_name="+")
    reward = models.FloatField(null=True, blank=True, help_text="None when grading errored")
    passed = models.BooleanField(default=False)
    errored = models.BooleanField(default=False)
    components = models.JSONField(default=dict, blank=True)
    completion_text = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "step", "item"], name="heldout_result_item")]

    def __str__(self) -> str:
        return f"held-out item {self.item_id} of run {self.run_id} at step {self.step}"


class Checkpoint(models.Model):
    """A saved learner state (model, optimiser, scheduler, RNG, data position) after `step`."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.PositiveIntegerField()
    policy_version = models.PositiveIntegerField()
    path = models.CharField(max_length=500, help_text="Folder under FLYWHEEL_HOME/checkpoints")
    metrics = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="checkpoint_step")]

    def __str__(self) -> str:
        return f"checkpoint {self.step} of run {self.run_id}"


class ProjectQuota(models.Model):
    """A project's own quotas (runs/scheduling.py): how many of its runs may be active at once, and
    how many learner workers (GPUs on a GPU host) they may hold; a blank one is the server's
    default (FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS, FLYWHEEL_PROJECT_MAX_GPU_WORKERS)."""

    project = models.OneToOneField(Project, on_delete=models.CASCADE, related_name="run_quota")
    max_active_runs = models.PositiveIntegerField(null=True, blank=True)
    max_gpu_workers = models.PositiveIntegerField(null=True, blank=True, help_text="0: no limit")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.project}: {self.max_active_runs} active runs, {self.max_gpu_workers} GPU workers"

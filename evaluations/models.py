"""Evaluation suites: a project's named suite and its immutable versions (which task-set versions,
splits and reward rules, and how to sample), the evaluations of a version against a target (a
run's policy version, a checkpoint, or a tier as it is), and each evaluation's result per item."""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from projects.models import Project, TaskItem, TaskSetVersion
from rewards.models import RewardRuleVersion
from runs.models import Checkpoint, Run
from tiers.models import Tier

DEFAULT_SAMPLING = {"samples": 1, "k": [1], "temperature": 0.0, "pass_threshold": 1.0}


class Suite(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="eval_suites")
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="eval_suite_name_per_project")
        ]

    def __str__(self) -> str:
        return self.name


class SuiteVersion(models.Model):
    """Immutable once created: a change is a new version, so an evaluation's figures always mean
    the same items, rules and sampling."""

    suite = models.ForeignKey(Suite, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    sampling = models.JSONField(
        default=dict, help_text="samples (n), k (pass@k values, each <= n), temperature, pass_threshold"
    )
    note = models.TextField(blank=True, help_text="What changed")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["suite", "number"], name="eval_suite_version_number")]

    def __str__(self) -> str:
        return f"{self.suite.name} v{self.number}"


class SuiteEntry(models.Model):
    """One task set of a suite version: its items of one split (the first `limit`, in file order),
    scored by one reward rule version."""

    version = models.ForeignKey(SuiteVersion, on_delete=models.CASCADE, related_name="entries")
    position = models.PositiveSmallIntegerField()
    task_set_version = models.ForeignKey(TaskSetVersion, on_delete=models.PROTECT, related_name="+")
    split = models.CharField(max_length=10, default="heldout")
    reward_rule_version = models.ForeignKey(RewardRuleVersion, on_delete=models.PROTECT, related_name="+")
    limit = models.PositiveIntegerField(null=True, blank=True, help_text="At most this many items; none: all")

    class Meta:
        ordering = ("position",)
        constraints = [
            models.UniqueConstraint(fields=["version", "position"], name="eval_suite_entry_position")
        ]

    def __str__(self) -> str:
        return f"entry {self.position} of {self.version}"


class SuiteEvaluation(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    class Target(models.TextChoices):
        POLICY = "policy", "a run's policy version"
        CHECKPOINT = "checkpoint", "a run's checkpoint"
        TIER = "tier", "a tier as it is (its base model under its settings)"

    TERMINAL = (Status.SUCCEEDED, Status.FAILED)

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="suite_evaluations")
    suite_version = models.ForeignKey(SuiteVersion, on_delete=models.PROTECT, related_name="evaluations")
    target = models.CharField(max_length=12, choices=Target.choices)
    run = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.CASCADE, related_name="suite_evaluations"
    )
    policy_version = models.PositiveIntegerField(null=True, blank=True)
    checkpoint = models.ForeignKey(
        Checkpoint, null=True, blank=True, on_delete=models.SET_NULL, related_name="suite_evaluations"
    )
    tier = models.ForeignKey(Tier, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    model = models.CharField(max_length=500, help_text="What was loaded: a policy folder, path or hub id")
    tier_config = models.JSONField(default=dict, help_text="The settings it decoded with, as they were")
    scheduled = models.BooleanField(default=False, help_text="Asked for by its run's schedule")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED, db_index=True)
    error = models.TextField(blank=True)
    metrics = models.JSONField(default=dict, blank=True, help_text="overall, and per entry")
    attempts = models.PositiveSmallIntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # A run's schedule asks once per policy version; a resent request finds it.
            models.UniqueConstraint(
                fields=["suite_version", "run", "policy_version"],
                condition=Q(scheduled=True),
                name="eval_suite_scheduled_once",
            )
        ]

    def __str__(self) -> str:
        return f"{self.suite_version} on {self.target_label} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL

    @property
    def target_label(self) -> str:
        if self.target == self.Target.TIER:
            return f"tier {self.tier_config.get('name', self.tier_id)}"
        where = (
            f"checkpoint step {self.policy_version}"
            if self.target == self.Target.CHECKPOINT
            else (f"policy v{self.policy_version}")
        )
        return f"run {self.run_id} {where}"


class SuiteResult(models.Model):
    """One item's result under one entry of an evaluation: its samples, passes and figures, and
    the first completions, so a figure opens down to the text that earned it."""

    evaluation = models.ForeignKey(SuiteEvaluation, on_delete=models.CASCADE, related_name="results")
    entry = models.PositiveSmallIntegerField(help_text="The entry's position in the suite version")
    item = models.ForeignKey(TaskItem, on_delete=models.CASCADE, related_name="+")
    samples = models.PositiveIntegerField(help_text="Graded samples (n)")
    passes = models.PositiveIntegerField(help_text="Samples whose reward reached the pass threshold (c)")
    errored = models.PositiveIntegerField(default=0, help_text="Samples the sandbox or a grader failed")
    reward_mean = models.FloatField(null=True, blank=True)
    grader_means = models.JSONField(default=dict, blank=True)
    completion_tokens_mean = models.FloatField(null=True, blank=True)
    invalid_actions = models.PositiveIntegerField(null=True, blank=True, help_text="Agent items")
    agent_steps = models.PositiveIntegerField(null=True, blank=True, help_text="Agent items")
    completions = models.JSONField(default=list, blank=True, help_text="The first few, with reward")

    class Meta:
        ordering = ("entry", "id")
        constraints = [
            models.UniqueConstraint(fields=["evaluation", "entry", "item"], name="suite_result_item")
        ]

    def __str__(self) -> str:
        return f"item {self.item_id} of {self.evaluation_id}: {self.passes}/{self.samples}"

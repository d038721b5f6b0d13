"""Reward models: a project's named reward model and its versions, each trained from the preference
pairs of a task-set version (reviews, promoted traces or an imported file) on a base model, with
its held-out pair accuracy; and which version each run's `reward_model` grader used."""

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from projects.models import Project, TaskSetVersion
from runs.models import Run


class RewardModel(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="reward_models")
    name = models.CharField(
        max_length=100, help_text="What reward rules call it: a `reward_model` grader's model"
    )
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="reward_model_name_per_project")
        ]

    def __str__(self) -> str:
        return self.name


class RewardModelVersion(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        CANCELLING = "cancelling"
        CANCELLED = "cancelled"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    ACTIVE = (Status.QUEUED, Status.RUNNING, Status.CANCELLING)
    TERMINAL = (Status.CANCELLED, Status.SUCCEEDED, Status.FAILED)

    reward_model = models.ForeignKey(RewardModel, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    # Names its files: unique even across databases that reuse ids.
    key = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.QUEUED, db_index=True)
    task_set_version = models.ForeignKey(
        TaskSetVersion, on_delete=models.PROTECT, related_name="reward_models"
    )
    base_model = models.CharField(
        max_length=500, help_text="The causal LM whose body carries the scalar head"
    )
    hyperparameters = models.JSONField(default=dict, help_text="Every hyperparameter with its value")
    train_pairs = models.PositiveIntegerField(default=0)
    heldout_pairs = models.PositiveIntegerField(default=0)
    heldout_accuracy = models.FloatField(
        null=True, blank=True, help_text="Held-out pairs ranked right, trained"
    )
    base_heldout_accuracy = models.FloatField(
        null=True, blank=True, help_text="The same, before training (the fresh head): the baseline"
    )
    train_accuracy = models.FloatField(null=True, blank=True)
    history = models.JSONField(default=list, blank=True, help_text="Per step: loss, accuracy, margin")
    step = models.PositiveIntegerField(default=0)
    steps = models.PositiveIntegerField(default=0)
    path = models.CharField(max_length=500, blank=True, help_text="Where the trained model is saved")
    error = models.TextField(blank=True)
    checkpoint_step = models.PositiveIntegerField(
        default=0,
        help_text="The last checkpoint's step (saved at each epoch's end): a resume starts there",
    )
    checkpoint_path = models.CharField(
        max_length=500, blank=True, help_text="The last checkpoint in the artifact storage"
    )
    restarts = models.PositiveIntegerField(
        default=0, help_text="Times its learner was restarted from the last checkpoint after dying"
    )
    learner_pid = models.IntegerField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["reward_model", "number"], name="reward_model_version_number")
        ]

    def __str__(self) -> str:
        return f"{self.reward_model.name} v{self.number} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL


class RunRewardModel(models.Model):
    """The reward-model version a run's rewards used, pinned on first use: a rule that names a model
    without a version gets its newest trained version when the run first scores, and keeps it."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="reward_model_uses")
    reward_model = models.ForeignKey(RewardModel, on_delete=models.CASCADE, related_name="+")
    version = models.ForeignKey(RewardModelVersion, on_delete=models.PROTECT, related_name="run_uses")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "reward_model"], name="one_version_per_run_and_model")
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} used {self.version}"

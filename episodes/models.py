"""An episode an agent outside Flywheel plays for a run of `external_rollouts`: handed out as one
slot of a rollout batch (a task item and its index in the item's group), its turns recorded as the
run's policy answers them on /v1 (the exact prompt and completion tokens, with the behaviour
log-probs), ended by the agent's outcome, and then stored as the run's trajectory for that slot."""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from projects.models import TaskItem
from runs.models import RolloutBatch, Run, Trajectory


class Episode(models.Model):
    class Status(models.TextChoices):
        OPEN = "open"  # handed out; turns are recorded until the agent reports
        SCORING = "scoring"  # the agent sent its final answer; the run's reward rule is scoring it
        REPORTED = "reported"  # stored as a trajectory
        TIMED_OUT = "timed_out"  # no outcome before its deadline: dropped, its slot handed out again
        CANCELLED = "cancelled"  # its batch was cancelled (the run ended, or a resume rolled it back)

    LIVE = (Status.OPEN, Status.SCORING, Status.REPORTED)  # hold their slot

    key = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="episodes")
    batch = models.ForeignKey(RolloutBatch, on_delete=models.CASCADE, related_name="episodes")
    item = models.ForeignKey(TaskItem, on_delete=models.PROTECT, related_name="+")
    sample_index = models.PositiveSmallIntegerField(help_text="Index within the item's group")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OPEN, db_index=True)
    policy_version = models.PositiveIntegerField(help_text="The run's policy version when it began")
    turns = models.JSONField(default=list, help_text="Each turn's tokens, log-probs and text, in order")
    deadline_at = models.DateTimeField()
    trajectory = models.OneToOneField(
        Trajectory, null=True, blank=True, on_delete=models.SET_NULL, related_name="external_episode"
    )
    reward = models.FloatField(
        null=True, blank=True, help_text="As reported, or as the rule scored the final answer"
    )
    final = models.TextField(blank=True, help_text="The answer the agent reported for the rule to score")
    started_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["batch", "item", "sample_index"],
                condition=Q(status__in=("open", "scoring", "reported")),
                name="one_live_episode_per_slot",
            )
        ]
        indexes = [models.Index(fields=["run", "status", "deadline_at"])]

    def __str__(self) -> str:
        return f"episode {self.key} of run {self.run_id} ({self.status})"

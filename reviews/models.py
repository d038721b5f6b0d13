"""Reviews of trajectories: labels, pairwise preferences, and review queues with assignment.

A label is one reviewer's verdict on one trajectory (saving again replaces it). A preference says
which of two trajectories for the same prompt is better. A queue is a filter over a run's
trajectories, materialised as items in order, each optionally assigned to a reviewer.
"""

from django.conf import settings
from django.db import models
from django.utils import timezone

from runs.models import Run, Trajectory


class Review(models.Model):
    class Label(models.TextChoices):
        GOOD = "good"
        BAD = "bad"
        REWARD_HACK = "reward_hack", "reward hack"
        INFRASTRUCTURE_ERROR = "infrastructure_error", "infrastructure error"

    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="reviews")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    label = models.CharField(max_length=24, choices=Label.choices)
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["trajectory", "reviewer"], name="one_review_per_reviewer")
        ]

    def __str__(self) -> str:
        return f"{self.label} for trajectory {self.trajectory_id}"


class Preference(models.Model):
    """`chosen` is better than `rejected`; both answer the same prompt in the same run."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="preferences")
    chosen = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="+")
    rejected = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="+")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["chosen", "rejected", "reviewer"], name="one_preference_per_pair"
            ),
            models.CheckConstraint(
                condition=~models.Q(chosen=models.F("rejected")), name="preference_of_two"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.chosen_id} over {self.rejected_id}"


class ReviewQueue(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="review_queues")
    name = models.CharField(max_length=100)
    filters = models.JSONField(default=dict, blank=True, help_text="The trajectory filters it was built from")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    def __str__(self) -> str:
        return self.name


class QueueItem(models.Model):
    queue = models.ForeignKey(ReviewQueue, on_delete=models.CASCADE, related_name="items")
    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="+")
    position = models.PositiveIntegerField()
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    done_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["position"]
        constraints = [
            models.UniqueConstraint(fields=["queue", "trajectory"], name="queue_item_once"),
        ]
        indexes = [models.Index(fields=["queue", "done_at", "assignee", "position"])]

    def __str__(self) -> str:
        return f"item {self.position} of queue {self.queue_id}"

"""Reviews of trajectories: labels, pairwise preferences, and review queues with assignment.

A label is one reviewer's verdict on one trajectory, or on one production trace (saving again
replaces it). A preference says which of two trajectories for the same prompt is better. A queue
is a filter over a run's trajectories or a project's traces, materialised as items in order, each
optionally assigned to a reviewer.
"""

from django.conf import settings
from django.db import models
from django.utils import timezone

from projects.models import Project
from runs.models import Checkpoint, Run, Trajectory
from traces.models import Trace


class Review(models.Model):
    class Label(models.TextChoices):
        GOOD = "good"
        BAD = "bad"
        REWARD_HACK = "reward_hack", "reward hack"
        INFRASTRUCTURE_ERROR = "infrastructure_error", "infrastructure error"

    trajectory = models.ForeignKey(
        Trajectory, null=True, blank=True, on_delete=models.CASCADE, related_name="reviews"
    )
    trace = models.ForeignKey(Trace, null=True, blank=True, on_delete=models.CASCADE, related_name="reviews")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    label = models.CharField(max_length=24, choices=Label.choices)
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["trajectory", "reviewer"], name="one_review_per_reviewer"),
            models.UniqueConstraint(fields=["trace", "reviewer"], name="one_trace_review_per_reviewer"),
            models.CheckConstraint(
                condition=models.Q(trajectory__isnull=False, trace__isnull=True)
                | models.Q(trajectory__isnull=True, trace__isnull=False),
                name="review_of_one_thing",
            ),
        ]

    def __str__(self) -> str:
        if self.trace_id:
            return f"{self.label} for trace {self.trace_id}"
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
    class Source(models.TextChoices):
        TRAJECTORIES = "trajectories", "a run's trajectories"
        TRACES = "traces", "a project's production traces"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="review_queues")
    run = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.CASCADE, related_name="review_queues"
    )
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.TRAJECTORIES)
    name = models.CharField(max_length=100)
    filters = models.JSONField(default=dict, blank=True, help_text="The filters it was built from")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    def __str__(self) -> str:
        return self.name


class QueueItem(models.Model):
    queue = models.ForeignKey(ReviewQueue, on_delete=models.CASCADE, related_name="items")
    trajectory = models.ForeignKey(
        Trajectory, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    trace = models.ForeignKey(Trace, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
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
            models.UniqueConstraint(fields=["queue", "trace"], name="queue_trace_once"),
        ]
        indexes = [models.Index(fields=["queue", "done_at", "assignee", "position"])]

    def __str__(self) -> str:
        return f"item {self.position} of queue {self.queue_id}"


class ReviewTraining(models.Model):
    """One Train on reviews: the run on the reviews and its control, the same checkpoint continued
    for the same steps by the parent's own method and settings without the reviews. The reviews
    run's lift is measured against the control, not against the parent."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="review_training")
    control = models.OneToOneField(
        Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="control_of"
    )
    parent = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="review_trainings")
    checkpoint = models.ForeignKey(Checkpoint, null=True, on_delete=models.SET_NULL, related_name="+")
    method = models.CharField(max_length=8)
    counts = models.JSONField(default=dict, blank=True, help_text="What the reviews gave")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    def __str__(self) -> str:
        return (
            f"{self.method} on reviews of run {self.parent_id}: run {self.run_id}, control {self.control_id}"
        )

"""Production traces: one record of what a deployed model did for a request, as a client reports it.

A trace holds the input (a prompt, or chat messages), the completion, which model or tier answered,
the outcome (a score, success or failure), the user's feedback (thumbs, a correction, a comment),
the latency and free metadata. The client names each trace (`external_id`, unique in its project),
so reporting the same trace again updates it rather than adding a second one: feedback that comes
later arrives as another report of the same trace.
"""

from django.db import models
from django.utils import timezone

from projects.models import Project
from tiers.models import Tier


class Trace(models.Model):
    class Thumbs(models.TextChoices):
        UP = "up"
        DOWN = "down"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="traces")
    external_id = models.CharField(max_length=200, help_text="The client's id of the trace")
    messages = models.JSONField(default=list, blank=True, help_text="Chat messages: role and content")
    # The prompt, or the conversation as text, in a column of its own so traces can be searched.
    prompt = models.TextField(blank=True)
    completion = models.TextField(blank=True)
    model = models.CharField(max_length=200, blank=True, help_text="The model that answered, as named")
    tier = models.ForeignKey(Tier, null=True, blank=True, on_delete=models.SET_NULL, related_name="traces")
    score = models.FloatField(null=True, blank=True)
    success = models.BooleanField(null=True, blank=True)
    thumbs = models.CharField(max_length=4, choices=Thumbs.choices, blank=True)
    correction = models.TextField(blank=True, help_text="What the answer should have been")
    feedback_comment = models.TextField(blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    occurred_at = models.DateTimeField(default=timezone.now, db_index=True, help_text="When it happened")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "external_id"], name="trace_id_per_project")
        ]
        indexes = [
            models.Index(fields=["project", "created_at"]),
            models.Index(fields=["project", "thumbs"]),
            models.Index(fields=["project", "model"]),
        ]

    def __str__(self) -> str:
        return f"trace {self.external_id}"

    @property
    def has_correction(self) -> bool:
        return bool(self.correction.strip())

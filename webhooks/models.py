"""Webhooks: a project's subscriptions to run events (status changes, monitor alerts), and one
delivery row per event and webhook (the outbox the workers send from, retry and record)."""

from django.conf import settings
from django.db import models
from django.utils import timezone

from core.encryption import EncryptedCharField
from projects.models import Project
from runs.models import Run, RunEvent


class Webhook(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="webhooks")
    url = models.CharField(max_length=2000, help_text="An http:// or https:// URL that receives POSTs")
    description = models.CharField(max_length=200, blank=True)
    # Not hashed, since it is the HMAC key every delivery is signed with, but encrypted at rest
    # (core/encryption.py). Shown once, at creation; no serializer or page shows it again.
    secret = EncryptedCharField(max_length=500, editable=False)
    # After a rotation, deliveries are signed with the old secret too, until it expires: receivers
    # switch to the new one without a delivery they cannot verify.
    previous_secret = EncryptedCharField(max_length=500, blank=True, editable=False)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    statuses = models.JSONField(default=list, blank=True, help_text="Run statuses to send; empty: all")
    events = models.JSONField(
        default=list,
        blank=True,
        help_text="Event types to send (run.status, run.alert, run.budget); empty: all",
    )
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    def __str__(self) -> str:
        return self.url

    def wants(self, status: str) -> bool:
        return self.wants_event("run.status") and (not self.statuses or status in self.statuses)

    def wants_event(self, event_type: str) -> bool:
        return not self.events or event_type in self.events

    def signing_secrets(self, now) -> list[str]:
        """The secrets a delivery sent at `now` is signed with: the current one, and the one it
        replaced while that is still honoured."""
        previous = self.previous_secret_expires_at is not None and now < self.previous_secret_expires_at
        return [self.secret, self.previous_secret] if previous and self.previous_secret else [self.secret]


class WebhookDelivery(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed"

    class Type(models.TextChoices):
        RUN_STATUS = "run.status", "A run changed status"
        RUN_ALERT = "run.alert", "A run's monitor raised an alert"
        RUN_BUDGET = "run.budget", "A run reached its budget and paused"
        PING = "ping", "A test event"

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    event = models.ForeignKey(RunEvent, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    type = models.CharField(max_length=20, choices=Type.choices, default=Type.RUN_STATUS)
    payload = models.JSONField(help_text="The body sent, exactly")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(
        null=True, blank=True, help_text="When a pending delivery is due (or its claim runs out)"
    )
    last_response_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(fields=["status", "next_attempt_at"]),
            models.Index(fields=["webhook", "created_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.type} delivery {self.pk} to {self.webhook_id} ({self.status})"

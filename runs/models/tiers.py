"""Tier evaluations: one checkpoint measured under several tiers on the same held-out task set."""

from django.conf import settings
from django.db import models
from django.utils import timezone

from runs.models.library import Project, TaskSetVersion, Tier


class TierEvaluation(models.Model):
    """A request to evaluate a checkpoint under tiers, and its results (one entry per tier).

    The tiers' settings are copied in when it is requested (tiers stay editable), as a run does.
    """

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="tier_evaluations")
    tier = models.ForeignKey(
        Tier, null=True, on_delete=models.SET_NULL, related_name="evaluations", help_text="Requested from"
    )
    tier_configs = models.JSONField(help_text="Each evaluated tier's id, name and settings when requested")
    checkpoint = models.CharField(max_length=500, help_text="The policy evaluated: a local path or a hub id")
    run = models.ForeignKey(
        "runs.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="tier_evaluations"
    )
    policy_version = models.PositiveIntegerField(null=True, blank=True)
    task_set_version = models.ForeignKey(TaskSetVersion, on_delete=models.PROTECT, related_name="+")
    split = models.CharField(max_length=8, default="heldout")
    limit = models.PositiveIntegerField(null=True, blank=True, help_text="Evaluate the first N items only")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    results = models.JSONField(
        default=list, blank=True, help_text="One entry per tier, in tier_configs order"
    )
    error = models.TextField(blank=True)
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"tier evaluation {self.pk} of {self.checkpoint}"

    @property
    def finished(self) -> bool:
        return self.status in (self.Status.SUCCEEDED, self.Status.FAILED)


class ServedAdapter(models.Model):
    """A LoRA adapter loaded into the OpenAI-compatible endpoint at run time (`POST
    /v1/load_lora_adapter`, vLLM's contract): served under its name on the tier's base model, its
    weights a run's policy version in the artifact storage. Rows, not process memory, so every web
    process of a deployment serves what one of them was told to load."""

    name = models.CharField(max_length=200, unique=True, help_text="The model id requests name")
    tier = models.ForeignKey(Tier, on_delete=models.CASCADE, related_name="served_adapters")
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="served_adapters")
    artifact = models.CharField(max_length=500, help_text="The policy version's name in the artifact storage")
    loaded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

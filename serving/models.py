"""What the OpenAI-compatible endpoint keeps between requests: the LoRA adapters loaded at run time.

The model came from the runs app and keeps its table (`runs_servedadapter`): only Django's record of
it moved (serving/migrations/0001_initial.py)."""

from django.conf import settings
from django.db import models
from django.utils import timezone

from runs.models import Run
from tiers.models import Tier


class ServedAdapter(models.Model):
    """A LoRA adapter loaded into the OpenAI-compatible endpoint at run time (`POST
    /v1/load_lora_adapter`, vLLM's contract): served under its name on the tier's base model, its
    weights a run's policy version in the artifact storage. Rows, not process memory, so every web
    process of a deployment serves what one of them was told to load."""

    name = models.CharField(max_length=200, unique=True, help_text="The model id requests name")
    tier = models.ForeignKey(Tier, on_delete=models.CASCADE, related_name="served_adapters")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="served_adapters")
    artifact = models.CharField(max_length=500, help_text="The policy version's name in the artifact storage")
    loaded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "runs_servedadapter"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

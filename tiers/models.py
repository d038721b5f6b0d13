"""Tiers (a checkpoint's inference configurations: how fast, how capable) and tier evaluations (one
checkpoint measured under several tiers on the same held-out task set).

Both came from the runs app and keep its tables (`runs_tier`, `runs_tierevaluation`): only Django's
record of them moved (tiers/migrations/0001_initial.py). An evaluation may name the run whose policy
it measured; that relation is by name ("runs.Run"), since runs sit above tiers and tiers import none
of runs."""

from django.conf import settings
from django.db import models
from django.utils import timezone

from projects.models import Project, TaskSetVersion


class Tier(models.Model):
    """A named inference configuration of a checkpoint: how fast, how capable."""

    class Precision(models.TextChoices):
        FP32 = "fp32", "fp32"
        BF16 = "bf16", "bf16"
        FP16 = "fp16", "fp16"
        INT8 = "int8", "int8 (dynamic quantisation)"

    class Device(models.TextChoices):
        AUTO = "auto", "auto"
        CPU = "cpu", "CPU"
        CUDA = "cuda", "CUDA GPU"

    class Speculation(models.TextChoices):
        NONE = "none", "none"
        DRAFT_MODEL = "draft_model", "draft model"
        PROMPT_LOOKUP = "prompt_lookup", "prompt lookup (n-gram)"

    class Engine(models.TextChoices):
        LOCAL = "local", "Flywheel's decoder"
        OPENAI = "openai", "OpenAI-compatible engine"

    class EngineAdapters(models.TextChoices):
        NONE = "none", "none (the engine's model only)"
        VLLM = "vllm", "vLLM runtime LoRA loading (also Flywheel's /v1)"
        SGLANG = "sglang", "SGLang runtime LoRA loading"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="tiers")
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    base_model = models.CharField(max_length=500, help_text="A local path or a hub id")
    device = models.CharField(max_length=8, choices=Device.choices, default=Device.AUTO)
    precision = models.CharField(max_length=8, choices=Precision.choices, default=Precision.FP32)
    speculation = models.CharField(max_length=16, choices=Speculation.choices, default=Speculation.NONE)
    draft_model = models.CharField(max_length=500, blank=True)
    speculative_tokens = models.PositiveSmallIntegerField(default=0)
    temperature = models.FloatField(default=1.0)
    top_p = models.FloatField(default=1.0)
    top_k = models.PositiveIntegerField(default=0, help_text="0 turns top-k off")
    stop = models.JSONField(default=list, blank=True)
    max_new_tokens = models.PositiveIntegerField(default=256)
    batch_size = models.PositiveIntegerField(default=8)
    chat = models.BooleanField(
        default=True,
        help_text="Render prompts with the model's chat template (when it has one); off: raw prompts",
    )
    engine = models.CharField(
        max_length=8,
        choices=Engine.choices,
        default=Engine.LOCAL,
        help_text="Who decodes: Flywheel's own decoder, or an OpenAI-compatible engine (vLLM, SGLang)",
    )
    engine_url = models.CharField(
        max_length=500,
        blank=True,
        help_text=("The engine's base URL, such as http://gpu-1:8000/v1; several servers: comma-separated"),
    )
    engine_model = models.CharField(
        max_length=500, blank=True, help_text="The model name the engine serves (its --served-model-name)"
    )
    engine_api_key_env = models.CharField(
        max_length=100,
        blank=True,
        help_text="The NAME of the environment variable that holds the engine's API key on worker hosts",
    )
    engine_adapters = models.CharField(
        max_length=8,
        choices=EngineAdapters.choices,
        default=EngineAdapters.NONE,
        help_text="How the engine loads a LoRA run's policy versions at run time",
    )
    engine_adapter_root = models.CharField(
        max_length=500,
        blank=True,
        help_text="Where the engine's host mounts the artifact storage; empty: send artifact names",
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        db_table = "runs_tier"
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="tier_name_per_project")]

    def __str__(self) -> str:
        return self.name


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
        db_table = "runs_tierevaluation"
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"tier evaluation {self.pk} of {self.checkpoint}"

    @property
    def finished(self) -> bool:
        return self.status in (self.Status.SUCCEEDED, self.Status.FAILED)

"""What runs use, in units, and what the units cost.

A Usage row is one component's units for one step of one run (the learner's step, a rollout part
of the step, a checkpoint), written by the worker that did the work. Its key is (run, step,
component), and a component's name never holds an attempt or a worker, so a step run again (a
retried batch, a learner resumed from a checkpoint) updates its row instead of adding a second:
`recordings` says how many times it was recorded. Money is never stored: it is computed at read
time from the units and the Price in force when they were recorded, so changing a price never
rewrites a past run's units.
"""

from decimal import Decimal

from django.db import models
from django.utils import timezone

from projects.models import Project
from runs.models import Run

# The unit columns of a Usage row, in the order the API and the pages show them.
UNITS = (
    "device_seconds",
    "cpu_seconds",
    "tokens_prefilled",
    "tokens_sampled",
    "tokens_trained",
    "engine_tokens_in",
    "engine_tokens_out",
    "judge_calls",
    "reward_model_calls",
    "storage_bytes",
)


class Usage(models.Model):
    class Kind(models.TextChoices):
        LEARNER = "learner", "Learner"
        ROLLOUT = "rollout", "Rollout"
        EVALUATION = "evaluation", "Evaluation"
        STORAGE = "storage", "Storage"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="usage")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    step = models.PositiveIntegerField(help_text="The run's step the work was for")
    component = models.CharField(
        max_length=80, help_text="Which part of the step: learner, rollout:<part>, checkpoint (no attempt)"
    )
    kind = models.CharField(max_length=12, choices=Kind.choices)
    worker = models.CharField(max_length=255, blank=True, help_text="Host and process that recorded it last")
    device_class = models.CharField(max_length=80, blank=True, help_text="cpu, or the GPU's name")
    device_seconds = models.FloatField(default=0.0, help_text="Time holding the device (GPU or CPU)")
    cpu_seconds = models.FloatField(default=0.0, help_text="CPU of sandboxes and graders")
    tokens_prefilled = models.BigIntegerField(default=0)
    tokens_sampled = models.BigIntegerField(default=0)
    tokens_trained = models.BigIntegerField(default=0)
    engine_tokens_in = models.BigIntegerField(default=0)
    engine_tokens_out = models.BigIntegerField(default=0)
    engine = models.CharField(max_length=100, blank=True, help_text="The engine tier whose tokens these are")
    judge_calls = models.PositiveIntegerField(default=0)
    reward_model_calls = models.PositiveIntegerField(default=0)
    storage_bytes = models.BigIntegerField(default=0)
    warm_up = models.BooleanField(
        default=False,
        help_text="A worker process's first work since it started (its start-up was in this time)",
    )
    recordings = models.PositiveIntegerField(
        default=1, help_text="Times recorded; above 1 the step was run again and billed once"
    )
    first_recorded_at = models.DateTimeField(default=timezone.now)
    recorded_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "step", "component"], name="usage_once_per_component")
        ]
        indexes = [models.Index(fields=["project", "recorded_at"])]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step} {self.component}"

    @property
    def rerecorded(self) -> bool:
        return self.recordings > 1


class Price(models.Model):
    """An operator's price for one unit, from `effective_from` until a later price of the same
    unit and scope. `scope` narrows it: a device class for device hours, an engine tier's name for
    engine tokens; blank applies to every scope without a price of its own."""

    class Unit(models.TextChoices):
        DEVICE_HOUR = "device_hour", "per device-hour"
        CPU_HOUR = "cpu_hour", "per CPU-hour"
        ENGINE_MTOK_IN = "engine_mtok_in", "per million engine tokens in"
        ENGINE_MTOK_OUT = "engine_mtok_out", "per million engine tokens out"
        GB_MONTH = "gb_month", "per GB-month stored"

    unit = models.CharField(max_length=20, choices=Unit.choices)
    scope = models.CharField(max_length=100, blank=True)
    amount = models.DecimalField(max_digits=14, decimal_places=6)
    effective_from = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["unit", "scope", "effective_from"])]

    def __str__(self) -> str:
        return f"{self.amount} {self.get_unit_display()} {self.scope or '(any)'} from {self.effective_from}"


class ProjectBudget(models.Model):
    """A project's monthly budget in money: past it, the project admits no new run that month."""

    project = models.OneToOneField(Project, on_delete=models.CASCADE, related_name="budget")
    monthly = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal(0))
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.project} {self.monthly}/month"

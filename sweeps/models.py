"""Sweeps: a run template, the parameters varied over it, how they are searched, when a losing
run is stopped early, and what the whole may spend; each trial of a sweep is one ordinary run.

The link lives here (a SweepTrial names its run), so runs know nothing of sweeps. The search's
state is these rows: the driver (sweeps/driver.py) rebuilds its Optuna study from them on every
pass, so a crashed pass loses nothing and a repeated one counts nothing twice.
"""

from django.conf import settings
from django.db import models
from django.utils import timezone

from projects.models import Project
from runs.models import Run


class Sweep(models.Model):
    class Search(models.TextChoices):
        GRID = "grid", "grid (every combination of the values)"
        RANDOM = "random", "random"
        TPE = "tpe", "Optuna's TPE (tree-structured Parzen estimator)"

    class EarlyStopping(models.TextChoices):
        NONE = "none", "none"
        MEDIAN = "median", "median: below the median of finished trials at the same step"
        ASHA = "asha", "ASHA: not in the top 1/reduction_factor at a rung"

    class Direction(models.TextChoices):
        MAXIMIZE = "maximize"
        MINIMIZE = "minimize"

    class Status(models.TextChoices):
        RUNNING = "running"
        FINISHED = "finished"
        CANCELLED = "cancelled"
        BUDGET_EXHAUSTED = "budget_exhausted"
        FAILED = "failed"  # a trial's run could not be created (a quota, a budget, a deleted tier)

    TERMINAL = (Status.FINISHED, Status.CANCELLED, Status.BUDGET_EXHAUSTED, Status.FAILED)

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="sweeps")
    name = models.CharField(max_length=100)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    template = models.JSONField(help_text="The run request every trial starts from (ids for references)")
    parameters = models.JSONField(
        help_text="What varies: a list of {name, values | choices | low, high[, log]}"
    )
    # A base_model parameter runs each model under a tier of its own: the template's tier with that
    # base model, made when the sweep was created ({base model: tier id}).
    base_model_tiers = models.JSONField(default=dict, blank=True)
    search = models.CharField(max_length=8, choices=Search.choices, default=Search.TPE)
    seed = models.PositiveIntegerField(default=0)
    metric = models.CharField(max_length=100, default="heldout/pass_rate", help_text="The objective")
    direction = models.CharField(max_length=8, choices=Direction.choices, default=Direction.MAXIMIZE)
    early_stopping = models.CharField(max_length=8, choices=EarlyStopping.choices, default=EarlyStopping.NONE)
    min_steps = models.PositiveIntegerField(
        default=1, help_text="No trial is stopped before this step (ASHA: its first rung)"
    )
    reduction_factor = models.PositiveIntegerField(default=3, help_text="ASHA: 1/this of a rung goes on")
    max_runs = models.PositiveIntegerField()
    max_device_hours = models.FloatField(null=True, blank=True)
    max_money = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    concurrency = models.PositiveIntegerField(default=2, help_text="Trials active at once")
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.RUNNING, db_index=True)
    reason = models.TextField(blank=True, help_text="Why it stopped launching or ended")
    advanced_at = models.DateTimeField(null=True, blank=True, help_text="The driver's last pass")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["project", "created_at"])]

    def __str__(self) -> str:
        return f"sweep {self.pk} {self.name} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL


class SweepTrial(models.Model):
    """One point of the search and the run that measures it."""

    class State(models.TextChoices):
        RUNNING = "running"  # its run is active
        COMPLETE = "complete"  # its run succeeded and reported the objective
        PRUNED = "pruned"  # stopped early by the sweep
        FAILED = "failed"  # its run failed, was cancelled by someone, or never reported the objective

    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="trials")
    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="sweep_trial")
    number = models.PositiveIntegerField(help_text="0, 1, ... in the order the search asked for them")
    params = models.JSONField(help_text="The value of each parameter, by name")
    state = models.CharField(max_length=10, choices=State.choices, default=State.RUNNING, db_index=True)
    value = models.FloatField(null=True, blank=True, help_text="The objective: its last value")
    step = models.PositiveIntegerField(null=True, blank=True, help_text="The step of that value")
    # What Optuna keeps on a trial between passes: the grid point it was given, the ASHA rungs it
    # completed (completed_rung_<n>: its value there).
    system_attrs = models.JSONField(default=dict, blank=True)
    stopped_early = models.BooleanField(default=False)
    why = models.TextField(blank=True, help_text="Why it was stopped early or failed")
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("sweep", "number")
        constraints = [models.UniqueConstraint(fields=["sweep", "number"], name="sweep_trial_number")]

    def __str__(self) -> str:
        return f"trial {self.number} of sweep {self.sweep_id} ({self.state})"

    @property
    def is_active(self) -> bool:
        return self.state == self.State.RUNNING

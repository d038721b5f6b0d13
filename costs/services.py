"""Writes for costs: usage recorded by the workers, prices set by operators, budgets set by owners,
and a run paused when it reaches its budget.

`usage_record` is keyed by (run, step, component) and a component never names an attempt, so a
step recorded again (a batch retried after its worker died, a learner resumed from a checkpoint
that runs a step again) replaces its units instead of adding to them, and counts the recording.
"""

import hashlib
from dataclasses import replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from core.exceptions import StateError
from costs import selectors
from costs.models import UNITS, Price, ProjectBudget, Usage
from projects.models import Project
from runs.learners import hyperparameters_resolve
from runs.lifecycle import RunRequest, run_create, run_event, run_transition
from runs.models import Run
from webhooks.services import budget_deliveries_enqueue

S = Run.Status


def rollout_component(item_ids: list[int]) -> str:
    """A rollout part's name from its items, which a step's batching makes the same on every
    attempt and after a rollback (a batch's index and attempt differ), so it is billed once.

    >>> rollout_component([3, 1]) == rollout_component([3, 1]) != rollout_component([1, 3])
    True
    """
    digest = hashlib.sha256(",".join(map(str, item_ids)).encode()).hexdigest()[:16]
    return f"rollout:{digest}"


def usage_record(
    *,
    run_id: int,
    step: int,
    component: str,
    kind: str,
    worker: str = "",
    device_class: str = "",
    engine: str = "",
    warm_up: bool = False,
    **units: float | int,
) -> Usage:
    """Record a component's units for one step of a run; a second recording of the same
    (run, step, component) replaces the first's units and counts itself in `recordings`.
    `warm_up`: the worker's process did this as its first work since it started; once a row is
    marked it stays marked (a step re-run warm still had a cold attempt in its times)."""
    if unknown := set(units) - set(UNITS):
        raise ValueError(f"unknown usage units: {', '.join(sorted(unknown))}")
    if kind not in Usage.Kind.values:
        raise ValueError(f"unknown usage kind {kind!r}; use {', '.join(Usage.Kind.values)}")
    if negative := [name for name, value in units.items() if value < 0]:
        raise ValueError(f"usage units cannot be negative: {', '.join(sorted(negative))}")
    values: dict[str, Any] = dict.fromkeys(UNITS, 0) | units
    fields = (
        values
        | {
            "kind": kind,
            "worker": worker[:255],
            "device_class": device_class[:80],
            "engine": engine,
        }
        | ({"warm_up": True} if warm_up else {})
    )
    key = {"run_id": run_id, "step": step, "component": component}
    now = timezone.now()
    with transaction.atomic():
        if Usage.objects.filter(**key).update(**fields, recordings=F("recordings") + 1, recorded_at=now):
            return Usage.objects.get(**key)
        project_id = Run.objects.filter(pk=run_id).values_list("project_id", flat=True).get()
        try:
            with transaction.atomic():  # two recorders racing for the first row: the loser updates
                return Usage.objects.create(
                    **key, **fields, project_id=project_id, first_recorded_at=now, recorded_at=now
                )
        except IntegrityError:
            Usage.objects.filter(**key).update(**fields, recordings=F("recordings") + 1, recorded_at=now)
            return Usage.objects.get(**key)


def price_set(
    *, unit: str, amount: Decimal, scope: str = "", effective_from: datetime | None = None
) -> Price:
    """A new price for a unit (and scope), from `effective_from` (now by default). Earlier
    prices stay: units recorded while they were in force keep costing what they did."""
    problems = {}
    if unit not in Price.Unit.values:
        problems["unit"] = f"unknown unit {unit!r}; use {', '.join(Price.Unit.values)}"
    if amount < 0:
        problems["amount"] = "must be 0 or more"
    if unit in (Price.Unit.CPU_HOUR, Price.Unit.GB_MONTH) and scope:
        problems["scope"] = f"{unit} has no scope; leave it blank"
    if problems:
        raise ValidationError(problems)
    return Price.objects.create(
        unit=unit, scope=scope, amount=amount, effective_from=effective_from or timezone.now()
    )


def project_budget_set(*, project: Project, monthly: Decimal | None) -> ProjectBudget:
    """The project's monthly budget; None or 0 removes it."""
    if monthly is not None and monthly < 0:
        raise ValidationError({"monthly": "must be 0 (no budget) or more"})
    budget, _ = ProjectBudget.objects.update_or_create(project=project, defaults={"monthly": monthly or 0})
    return budget


def project_budget_problems(request: RunRequest, resolved: dict[str, Any]) -> dict[str, str]:
    """A launch check (registered with runs): a project past its monthly budget admits no run."""
    budget = ProjectBudget.objects.filter(project=request.project).first()
    if budget is None or not budget.monthly:
        return {}
    spent = selectors.project_month_spent(project=request.project)
    if spent < budget.monthly:
        return {}
    return {
        "project": f"project {request.project.name} has spent {spent:.2f} of its monthly budget of "
        f"{budget.monthly:.2f} this month; an owner can raise the budget to launch more runs"
    }


BUDGET_FIELDS = ("budget_money", "budget_device_hours")


@transaction.atomic
def run_budget_set(*, run: Run, **changes: Any) -> Run:
    """Change a run's budgets: the fields given (budget_money, budget_device_hours; null removes
    one). A run paused at its budget resumes when its owner resumes it, and pauses again at the
    next step boundary if it is still over."""
    problems = {name: "cannot be changed here" for name in set(changes) - set(BUDGET_FIELDS)}
    for name, value in changes.items():
        if name in BUDGET_FIELDS and value is not None and value <= 0:
            problems[name] = "must be more than 0, or null for none"
    if problems:
        raise ValidationError(problems)
    Run.objects.filter(pk=run.pk).update(**changes)
    run.refresh_from_db()
    parts = [
        *([f"{run.budget_money} {settings.FLYWHEEL_CURRENCY}"] if run.budget_money is not None else []),
        *([f"{run.budget_device_hours:g} device-hours"] if run.budget_device_hours is not None else []),
    ]
    run_event(
        run,
        "budget",
        f"budget set to {' and '.join(parts)}" if parts else "budget removed",
        data={
            "budget_money": None if run.budget_money is None else str(run.budget_money),
            "budget_device_hours": run.budget_device_hours,
        },
    )
    return run


def run_budget_reached(*, run: Run, spent: selectors.Tally) -> dict[str, Any] | None:
    """Which of the run's budgets `spent` reaches, with the figures; None while within them."""
    if run.budget_money is not None and spent.total >= run.budget_money:
        return {"kind": "money", "budget": str(run.budget_money), "spent": str(spent.total)}
    if run.budget_device_hours is not None and spent.device_hours >= run.budget_device_hours:
        return {"kind": "device_hours", "budget": run.budget_device_hours, "spent": spent.device_hours}
    return None


@transaction.atomic
def run_budget_check(*, run: Run, step: int) -> dict[str, Any] | None:
    """At a step boundary: if the run has reached its budget, ask it to pause (the learner
    pauses at once, checkpointed at `step`), with a `budget` event and a `run.budget` webhook.
    Returns what was reached, or None."""
    run.refresh_from_db(fields=["budget_money", "budget_device_hours", "status"])
    reached = run_budget_reached(run=run, spent=selectors.run_spent(run=run))
    if reached is None:
        return None
    reached["step"] = step
    unit = "device-hours" if reached["kind"] == "device_hours" else ""
    spent = f"{float(reached['spent']):.4g}"
    message = f"budget reached at step {step}: spent {spent} of {reached['budget']} {unit}".rstrip()
    try:
        run = run_transition(run, allowed=(S.RUNNING,), to=S.PAUSING, message=f"pausing: {message}")
    except StateError:  # already pausing or stopping: nothing more to ask
        return reached
    event = run_event(run, "budget", message, level="warning", data=reached)
    budget_deliveries_enqueue(run=run, event=event, budget=reached)
    return reached


# A calibration measures steps, not the model: no held-out evaluation beyond the least the run
# does anyway (one item, at its start and end), where the method has one.
CALIBRATION_QUIET = {"eval_every": 100_000, "eval_items": 1}


@transaction.atomic
def run_calibrate(*, request: RunRequest, by: User) -> tuple[Run, bool]:
    """Launch a calibration for an estimate: a run of FLYWHEEL_CALIBRATION_STEPS steps with the
    request's tier, method, data and hyperparameters (so the same batch shape), through the same
    launch checks and queue as any run, marked `calibration`, with no budget of its own. An active
    calibration of the same tier and method is used instead of a second. Returns (run, launched)."""
    active = Run.objects.filter(
        tier=request.tier, method=request.method, calibration=True, status__in=Run.ACTIVE
    ).order_by("-pk")
    if (running := active.first()) is not None:
        return running, False
    resolved, _ = hyperparameters_resolve(request.method, request.hyperparameters or {})
    quiet = {name: value for name, value in CALIBRATION_QUIET.items() if name in resolved}
    calibration = replace(
        request,
        name=f"calibration: {request.tier.name} ({request.method})",
        max_steps=settings.FLYWHEEL_CALIBRATION_STEPS,
        hyperparameters=(request.hyperparameters or {}) | quiet,
        max_wall_seconds=None,
        budget_money=None,
        budget_device_hours=None,
        calibration=True,
    )
    return run_create(request=calibration, by=by), True

"""Reads for sweeps: a user's sweeps, one sweep with its trials, what each trial's run cost, the
best trial, the chart's rows and the table of each base model's lift and cost."""

from collections import defaultdict
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import User
from django.db.models import QuerySet, Sum
from django.http import Http404

from core.roles import Permission
from costs.models import Usage
from costs.selectors import runs_money
from projects.selectors import require
from runs.models import MetricPoint
from sweeps.models import Sweep, SweepTrial

T = SweepTrial.State


def sweeps_of(*, project_id: int) -> QuerySet[Sweep]:
    return Sweep.objects.filter(project_id=project_id).order_by("-created_at", "-pk")


def sweep_for(
    *, user: User, sweep_id: int, permission: str = Permission.VIEW, project_id: int | None = None
) -> Sweep:
    """The sweep, if the user's role in its project allows `permission` (and, given, it is of
    `project_id`); 404 for non-members and for another project's sweep."""
    sweep = Sweep.objects.select_related("project", "created_by").filter(pk=sweep_id).first()
    if sweep is None or (project_id is not None and sweep.project_id != project_id):
        raise Http404("no such sweep")
    require(user=user, project_id=sweep.project_id, permission=permission)
    return sweep


def trials_of(*, sweep: Sweep) -> list[SweepTrial]:
    return list(sweep.trials.select_related("run").order_by("number"))


def trial_costs(run_ids: list[int]) -> dict[int, tuple[Decimal, float]]:
    """{run: (money, device-hours)} recorded so far; runs without usage are (0, 0)."""
    money = runs_money(run_ids=run_ids)
    seconds = dict(
        Usage.objects.filter(run_id__in=run_ids)
        .values("run_id")
        .annotate(total=Sum("device_seconds"))
        .values_list("run_id", "total")
    )
    return {
        run_id: (money.get(run_id, Decimal(0)), float(seconds.get(run_id) or 0.0) / 3600)
        for run_id in run_ids
    }


def best_trial(trials: list[SweepTrial], direction: str) -> SweepTrial | None:
    """The complete trial with the best objective (ties: the earlier one)."""
    done = [t for t in trials if t.state == T.COMPLETE and t.value is not None]
    if not done:
        return None
    sign = 1.0 if direction == Sweep.Direction.MAXIMIZE else -1.0
    return max(done, key=lambda t: (sign * float(t.value or 0.0), -t.number))


def base_model_of(trial: SweepTrial) -> str:
    return str((trial.run.tier_config or {}).get("base_model", ""))


def start_values(metric: str, run_ids: list[int]) -> dict[int, float]:
    """Each run's objective at step 0: its base model before any training."""
    points = MetricPoint.objects.filter(run_id__in=run_ids, name=metric, step=0)
    return dict(points.values_list("run_id", "value"))


def sweep_summary(*, sweep: Sweep) -> dict[str, Any]:
    """The sweep with its trials (params, state, objective, cost), its best trial, its spend and,
    when its trials ran on more than one base model, each model's lift and cost."""
    trials = trials_of(sweep=sweep)
    run_ids = [t.run_id for t in trials]
    costs = trial_costs(run_ids)
    starts = start_values(sweep.metric, run_ids)
    best = best_trial(trials, sweep.direction)
    rows = [_trial_row(t, costs[t.run_id], starts.get(t.run_id)) for t in trials]
    money = sum((c[0] for c in costs.values()), Decimal(0))
    hours = sum(c[1] for c in costs.values())
    return {
        "sweep": sweep,
        "trials": rows,
        "best": None if best is None else _trial_row(best, costs[best.run_id], starts.get(best.run_id)),
        "spent": {"money": money, "device_hours": hours},
        "stopped_early": sum(t.stopped_early for t in trials),
        "base_models": base_model_table(sweep, trials, costs, starts),
    }


def _trial_row(trial: SweepTrial, cost: tuple[Decimal, float], start: float | None) -> dict[str, Any]:
    return {
        "number": trial.number,
        "run": trial.run_id,
        "run_name": trial.run.name,
        "run_status": trial.run.status,
        "base_model": base_model_of(trial),
        "params": trial.params,
        "state": trial.state,
        "value": trial.value,
        "step": trial.step,
        "start": start,
        "stopped_early": trial.stopped_early,
        "why": trial.why,
        "money": cost[0],
        "device_hours": cost[1],
    }


def base_model_table(
    sweep: Sweep,
    trials: list[SweepTrial],
    costs: dict[int, tuple[Decimal, float]],
    starts: dict[int, float],
) -> list[dict[str, Any]]:
    """Per base model: its best complete trial, that run's lift (its objective at the last
    evaluation minus at step 0) and what all its trials cost. Empty with a single base model."""
    by_model: dict[str, list[SweepTrial]] = defaultdict(list)
    for trial in trials:
        by_model[base_model_of(trial)].append(trial)
    if len(by_model) < 2:
        return []
    table = []
    for model, group in by_model.items():
        best = best_trial(group, sweep.direction)
        start = None if best is None else starts.get(best.run_id)
        end = None if best is None else best.value
        table.append(
            {
                "base_model": model,
                "trials": len(group),
                "best_run": None if best is None else best.run_id,
                "best_trial": None if best is None else best.number,
                "start": start,
                "end": end,
                "lift": None if start is None or end is None else end - start,
                "money": sum((costs[t.run_id][0] for t in group), Decimal(0)),
                "device_hours": sum(costs[t.run_id][1] for t in group),
            }
        )
    return sorted(table, key=lambda row: (row["lift"] is None, -(row["lift"] or 0.0), row["base_model"]))


def chart_of(*, sweep: Sweep, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The parallel-coordinates chart's data: a dimension per parameter (categories as their
    index, labelled) and the objective last; trials without a value are left out."""
    scored = [row for row in rows if row["value"] is not None]
    dimensions = []
    for parameter in sweep.parameters:
        name = parameter["name"]
        values = [row["params"].get(name) for row in scored]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            dimensions.append({"label": name, "values": values})
            continue
        labels = sorted({str(v) for v in values})
        dimensions.append(
            {
                "label": name,
                "values": [labels.index(str(v)) for v in values],
                "tickvals": list(range(len(labels))),
                "ticktext": labels,
            }
        )
    objective = [row["value"] for row in scored]
    dimensions.append({"label": sweep.metric, "values": objective})
    return {"dimensions": dimensions, "color": objective, "trials": [row["number"] for row in scored]}

"""The sweep driver: one pass settles the trials whose runs ended, stops the losers early, and
launches trials up to the concurrency limit while the budget allows; when nothing is left to run
the sweep is finished.

A pass runs when a trial's run ends or reports the objective (sweeps/listeners.py, through a
task) and on the periodic tick (workers/supervisor.runs_tick). It holds the sweep's row for its
whole length, so two passes never interleave; it rebuilds its Optuna study from the database
(sweeps/search.py), so a crash between passes loses nothing, and a trial is recorded in the same
transaction as the run it creates, so nothing is launched or counted twice.
"""

import copy
import logging
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal

import optuna
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from core.exceptions import StateError
from costs.estimates import run_estimate
from runs import lifecycle
from runs.lifecycle import RunRequest, run_problems
from runs.models import MetricPoint, Run
from sweeps import search, selectors, specs
from sweeps.models import Sweep, SweepTrial

logger = logging.getLogger(__name__)
S = Run.Status
T = SweepTrial.State


@dataclass
class Pass:
    """What one pass did, for its caller and its tests."""

    settled: list[int] = field(default_factory=list)  # trial numbers that ended
    pruned: list[int] = field(default_factory=list)
    launched: list[int] = field(default_factory=list)
    status: str = ""


def sweeps_advance() -> list[int]:
    """A pass over every sweep that is running or has a running trial; the ids advanced."""
    ids = set(Sweep.objects.filter(status=Sweep.Status.RUNNING).values_list("pk", flat=True))
    ids |= set(SweepTrial.objects.filter(state=T.RUNNING).values_list("sweep_id", flat=True))
    for sweep_id in sorted(ids):
        try:
            sweep_advance(sweep_id=sweep_id)
        except Exception:  # noqa: BLE001 - one sweep's failure must not stop the others' passes
            logger.exception("sweep %s: the pass failed", sweep_id)
    return sorted(ids)


@transaction.atomic
def sweep_advance(*, sweep_id: int) -> Pass:
    done = Pass()
    # The UPDATE takes the row's lock (PostgreSQL) or the database's write lock (SQLite) first:
    # a second pass waits here and then sees everything this one wrote.
    if not Sweep.objects.filter(pk=sweep_id).update(advanced_at=timezone.now()):
        return done
    sweep = (
        Sweep.objects.select_for_update(of=("self",)).select_related("project", "created_by").get(pk=sweep_id)
    )
    trials = selectors.trials_of(sweep=sweep)
    values = objective_values(sweep.metric, [trial.run_id for trial in trials])
    study = search.study_build(
        sweep, [search.Record(trial, _after_start(values.get(trial.run_id, {}))) for trial in trials]
    )
    for trial in trials:
        if trial.state == T.RUNNING and trial.run.is_terminal:
            _settle(sweep, study, trial, values.get(trial.run_id, {}))
            done.settled.append(trial.number)
    if sweep.status == Sweep.Status.RUNNING and sweep.early_stopping != Sweep.EarlyStopping.NONE:
        for trial in trials:
            if trial.state == T.RUNNING and trial.run.status in (S.QUEUED, S.STARTING, S.RUNNING, S.PAUSED):
                if _prune_if_losing(sweep, study, trial, values.get(trial.run_id, {})):
                    done.pruned.append(trial.number)
    if sweep.status == Sweep.Status.RUNNING:
        done.launched = _launch(sweep, study, trials)
        _finish_if_done(sweep, trials)
    done.status = sweep.status
    return done


def objective_values(metric: str, run_ids: list[int]) -> dict[int, dict[int, float]]:
    """{run: {step: value}} of the objective metric, every evaluated step (0: the start)."""
    out: dict[int, dict[int, float]] = {run_id: {} for run_id in run_ids}
    points = MetricPoint.objects.filter(run_id__in=run_ids, name=metric).values_list(
        "run_id", "step", "value"
    )
    for run_id, step, value in points:
        out[run_id][step] = value
    return out


def _after_start(values: dict[int, float]) -> dict[int, float]:
    """What the pruners compare: the steps after the start (every trial of one base model starts
    from the same figure, and the start says nothing of a setting)."""
    return {step: value for step, value in values.items() if step > 0}


def _last(values: dict[int, float]) -> tuple[int, float] | None:
    if not values:
        return None
    step = max(values)
    return step, values[step]


# --- settling --------------------------------------------------------------------------------


def _settle(sweep: Sweep, study: optuna.Study, trial: SweepTrial, values: dict[int, float]) -> None:
    """Record how the trial's run ended: complete with its last objective value, or failed."""
    run = trial.run
    last = _last(_after_start(values)) or _last(values)
    frozen = search.frozen(study, trial.number)
    if run.status == S.SUCCEEDED and last is not None:
        # The rungs it passed count for the trials after it, as if it had been asked at each.
        if sweep.early_stopping == Sweep.EarlyStopping.ASHA and frozen.intermediate_values:
            _asha_replay(study, trial.number, _after_start(values))
        search.tell(study, trial.number, last[1])
        trial.state, (trial.step, trial.value) = T.COMPLETE, last
    else:
        search.tell(study, trial.number, state=optuna.trial.TrialState.FAIL)
        trial.state = T.FAILED
        trial.why = _failure(run, sweep.metric)
        if last is not None:
            trial.step, trial.value = last
    trial.system_attrs = dict(search.frozen(study, trial.number).system_attrs)
    trial.finished_at = run.finished_at or timezone.now()
    trial.save(update_fields=["state", "value", "step", "why", "system_attrs", "finished_at"])


def _failure(run: Run, metric: str) -> str:
    if run.status == S.SUCCEEDED:
        return f"its run succeeded but recorded no {metric}"
    if run.status == S.FAILED:
        return f"its run failed: {(run.error or {}).get('message', 'no message')}"
    return "its run was cancelled"


# --- stopping early --------------------------------------------------------------------------


def _prune_if_losing(sweep: Sweep, study: optuna.Study, trial: SweepTrial, values: dict[int, float]) -> bool:
    """Ask the pruner about the trial's newest figure; a loser's run is cancelled with an event
    that says why. The rungs it passed are kept either way (ASHA compares later trials with them)."""
    frozen = search.frozen(study, trial.number)
    if not frozen.intermediate_values:
        return False
    after = _after_start(values)
    if sweep.early_stopping == Sweep.EarlyStopping.ASHA:
        lost_at = _asha_replay(study, trial.number, after)
    else:
        lost_at = frozen.last_step if study.pruner.prune(study, frozen) else None
    attrs = dict(search.frozen(study, trial.number).system_attrs)
    if lost_at is None:
        if attrs != trial.system_attrs:
            trial.system_attrs = attrs
            trial.save(update_fields=["system_attrs"])
        return False
    why = (
        f"stopped early by sweep {sweep.pk}: {sweep.metric} {after[lost_at]:.4g} at step {lost_at} "
        + _loss(sweep, study, frozen.number, lost_at, after[lost_at], attrs)
    )
    step, value = _last(after) or (0, 0.0)
    search.tell(study, trial.number, state=optuna.trial.TrialState.PRUNED)
    trial.state, trial.stopped_early, trial.why = T.PRUNED, True, why
    trial.step, trial.value, trial.system_attrs = step, value, attrs
    trial.finished_at = timezone.now()
    trial.save(
        update_fields=["state", "stopped_early", "why", "step", "value", "system_attrs", "finished_at"]
    )
    lifecycle.run_event(
        trial.run,
        "sweep",
        why,
        level="warning",
        data={"sweep": sweep.pk, "trial": trial.number, "rule": sweep.early_stopping},
    )
    try:
        lifecycle.run_cancel(run=trial.run)
    except StateError:  # it ended meanwhile; the trial stays stopped early, its record says why
        pass
    return True


def _asha_replay(study: optuna.Study, number: int, values: dict[int, float]) -> int | None:
    """Ask ASHA at each evaluated step in turn, as a live study is asked after each report: a pass
    may come after several evaluations, and each rung must hold the trial's figure at the rung's
    own step (the first evaluated at or after it), not the newest. The step it lost at, or None.
    Rungs recorded by earlier passes are kept (ASHA never asks a rung twice)."""
    for step in sorted(values):
        view = copy.copy(search.frozen(study, number))  # re-read: each ask may record a rung
        view.intermediate_values = {s: v for s, v in values.items() if s <= step}
        if study.pruner.prune(study, view):
            return step
    return None


def _loss(sweep: Sweep, study: optuna.Study, number: int, step: int, value: float, attrs: dict) -> str:
    """The comparison that lost, in words."""
    worse = "below" if sweep.direction == Sweep.Direction.MAXIMIZE else "above"
    if sweep.early_stopping == Sweep.EarlyStopping.MEDIAN:
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        at = [t.intermediate_values[step] for t in done if step in t.intermediate_values]
        median = statistics.median(at) if at else float("nan")
        return f"is {worse} the median {median:.4g} of the {len(at)} finished trial(s) at step {step}"
    rung = max(int(key.rsplit("_", 1)[1]) for key in attrs if key.startswith("completed_rung_"))
    key = f"completed_rung_{rung}"
    competing = sorted(t.system_attrs[key] for t in study.get_trials(deepcopy=False) if key in t.system_attrs)
    keep = max(1, len(competing) // sweep.reduction_factor)
    best = competing[-keep:] if sweep.direction == Sweep.Direction.MAXIMIZE else competing[:keep]
    rung_step = sweep.min_steps * sweep.reduction_factor**rung
    return (
        f"is {worse} the top 1/{sweep.reduction_factor} of the {len(competing)} trial(s) at ASHA rung {rung} "
        f"(step {rung_step}): the cut is {best[0] if worse == 'below' else best[-1]:.4g}"
    )


# --- launching -------------------------------------------------------------------------------


def _launch(sweep: Sweep, study: optuna.Study, trials: list[SweepTrial]) -> list[int]:
    """New trials while fewer than `concurrency` are active, fewer than `max_runs` exist, the grid
    has points left and the next run fits the budget with what the sweep has spent."""
    launched: list[int] = []
    active = sum(trial.state == T.RUNNING for trial in trials)
    while active < sweep.concurrency and len(trials) < sweep.max_runs and search.grid_left(study, sweep) > 0:
        proposed = search.ask(study, sweep)
        name = f"{sweep.name} #{proposed.number}"
        try:
            request = specs.request_for(sweep, proposed.params, name=name)
        except (ValidationError, KeyError) as refused:
            _stop(sweep, Sweep.Status.FAILED, f"trial {proposed.number} could not be made: {refused}")
            break
        if sweep.created_by is None:  # runs are launched as the sweep's creator
            _stop(sweep, Sweep.Status.FAILED, "its creator's account was deleted: no one to launch runs as")
            break
        if (over := _over_budget(sweep, request, trials)) is not None:
            _note(sweep, over)
            break
        try:
            with transaction.atomic():
                run = lifecycle.run_create(request=request, by=sweep.created_by)
                trial = SweepTrial.objects.create(
                    sweep=sweep,
                    run=run,
                    number=proposed.number,
                    params=proposed.params,
                    system_attrs=dict(proposed.system_attrs),
                )
        except ValidationError as refused:
            _stop(sweep, Sweep.Status.FAILED, f"trial {proposed.number}'s run was refused: {_said(refused)}")
            break
        lifecycle.run_event(run, "sweep", f"trial {trial.number} of sweep {sweep.pk} ({sweep.name})")
        trials.append(trial)
        launched.append(trial.number)
        active += 1
    return launched


def _said(refused: ValidationError) -> str:
    if hasattr(refused, "message_dict"):
        return "; ".join(f"{key}: {' '.join(m)}" for key, m in refused.message_dict.items())
    return " ".join(refused.messages)


def _over_budget(sweep: Sweep, request: RunRequest, trials: list[SweepTrial]) -> str | None:
    """Why the next run would pass the sweep's budget, or None. What the sweep has spent, plus
    what its active runs are expected to spend still, plus the next run's estimate."""
    if sweep.max_money is None and sweep.max_device_hours is None:
        return None
    spent = selectors.trial_costs([trial.run_id for trial in trials])
    expected = _expected(request, trials, spent)
    committed_money, committed_hours = Decimal(0), 0.0
    for trial in trials:
        money, hours = spent.get(trial.run_id, (Decimal(0), 0.0))
        if trial.state == T.RUNNING:
            money, hours = max(money, expected[0]), max(hours, expected[1])
        committed_money += money
        committed_hours += hours
    if sweep.max_money is not None and committed_money + expected[0] > sweep.max_money:
        return (
            f"the budget of {sweep.max_money} would be passed: {committed_money:.2f} spent or committed "
            f"and the next run is expected to cost {expected[0]:.2f}"
        )
    if sweep.max_device_hours is not None and committed_hours + expected[1] > sweep.max_device_hours:
        return (
            f"the budget of {sweep.max_device_hours:g} device-hours would be passed: {committed_hours:.4f} "
            f"spent or committed and the next run is expected to take {expected[1]:.4f}"
        )
    return None


def _expected(
    request: RunRequest, trials: list[SweepTrial], spent: dict[int, tuple[Decimal, float]]
) -> tuple[Decimal, float]:
    """What a run of `request` is expected to cost (money, device-hours): the estimate from the
    tier's history (costs/estimates.py), else the mean of the sweep's finished trials, else 0."""
    resolved, problems = run_problems(request)
    if not problems:
        estimate = run_estimate(
            tier=request.tier, method=request.method, resolved=resolved, steps=request.max_steps
        )
        if estimate.get("basis"):
            return Decimal(estimate["money"]["expected"]), float(estimate["device_hours"]["expected"])
    finished = [spent[t.run_id] for t in trials if t.state == T.COMPLETE and t.run_id in spent]
    if not finished:
        return Decimal(0), 0.0
    money = sum((m for m, _ in finished), Decimal(0)) / len(finished)
    return money, sum(h for _, h in finished) / len(finished)


def _note(sweep: Sweep, reason: str) -> None:
    if sweep.reason != reason:
        sweep.reason = reason
        sweep.save(update_fields=["reason"])


def _stop(sweep: Sweep, status: str, reason: str) -> None:
    sweep.status, sweep.reason, sweep.finished_at = status, reason, timezone.now()
    sweep.save(update_fields=["status", "reason", "finished_at"])


def _finish_if_done(sweep: Sweep, trials: Iterable[SweepTrial]) -> None:
    """With no active trial and none to launch, the sweep ends: finished when its runs or its grid
    are used up, budget_exhausted when its budget stopped it first."""
    trials = list(trials)
    if sweep.status != Sweep.Status.RUNNING or any(t.state == T.RUNNING for t in trials):
        return
    limit = sweep.max_runs
    if sweep.search == Sweep.Search.GRID:
        limit = min(limit, search.grid_size(sweep.parameters))
    if len(trials) >= limit:
        _stop(sweep, Sweep.Status.FINISHED, f"all {len(trials)} trial(s) ended")
    elif sweep.reason.startswith("the budget"):
        _stop(sweep, Sweep.Status.BUDGET_EXHAUSTED, sweep.reason)

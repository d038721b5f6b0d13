"""The search, in Optuna's terms: a sweep's parameters as distributions, its sampler and pruner, and
a study rebuilt in memory from the trials recorded in the database.

Nothing of Optuna's is stored: each pass of the driver builds a fresh in-memory study, adds every
recorded trial to it (params, state, the objective's values by step, and the attributes samplers
and pruners keep on a trial: the grid point, the ASHA rungs passed), then asks and prunes. The
sampler is seeded with the sweep's seed plus the number of the trial it is about to propose, so a
pass that runs again proposes the same point, and two trials never share a random stream (a grid
is shuffled once by the sweep's seed, and its n-th trial takes its n-th point).
"""

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from sweeps.models import Sweep, SweepTrial

optuna.logging.set_verbosity(optuna.logging.WARNING)  # its per-trial INFO lines say nothing we record

STATES = {
    SweepTrial.State.RUNNING: TrialState.RUNNING,
    SweepTrial.State.COMPLETE: TrialState.COMPLETE,
    SweepTrial.State.PRUNED: TrialState.PRUNED,
    SweepTrial.State.FAILED: TrialState.FAIL,
}


def values_of(parameter: dict[str, Any]) -> list[Any] | None:
    """A parameter's list of values (`values` or `choices`), or None for a range."""
    found = parameter.get("values", parameter.get("choices"))
    return None if found is None else list(found)


def distribution(parameter: dict[str, Any]) -> BaseDistribution:
    """Optuna's distribution of one (validated) parameter: a list is categorical; a range of
    integers is an IntDistribution, else a FloatDistribution; `log` samples its logarithm."""
    listed = values_of(parameter)
    if listed is not None:
        return CategoricalDistribution(listed)
    low, high, log = parameter["low"], parameter["high"], bool(parameter.get("log", False))
    if isinstance(low, int) and isinstance(high, int) and not parameter.get("float"):
        return IntDistribution(low, high, log=log)
    return FloatDistribution(float(low), float(high), log=log)


def distributions(parameters: list[dict[str, Any]]) -> dict[str, BaseDistribution]:
    return {parameter["name"]: distribution(parameter) for parameter in parameters}


def grid_of(parameters: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {parameter["name"]: values_of(parameter) or [] for parameter in parameters}


def grid_size(parameters: list[dict[str, Any]]) -> int:
    """How many points a grid of these parameters has.

    >>> grid_size([{"name": "a", "values": [1, 2]}, {"name": "b", "choices": ["x", "y", "z"]}])
    6
    """
    return math.prod(len(values_of(p) or []) for p in parameters)


def grid_points(parameters: list[dict[str, Any]]) -> list[dict[str, Any]]:
    grid = grid_of(parameters)
    return [dict(zip(grid, point, strict=True)) for point in itertools.product(*grid.values())]


def sampler(sweep: Sweep, number: int) -> optuna.samplers.BaseSampler:
    """The sampler that proposes trial `number`, seeded for it."""
    if sweep.search == Sweep.Search.GRID:
        # The sweep's seed alone: it orders the grid, which must be the same order in every pass.
        return optuna.samplers.GridSampler(grid_of(sweep.parameters), seed=sweep.seed)
    seed = sweep.seed + number
    if sweep.search == Sweep.Search.RANDOM:
        return optuna.samplers.RandomSampler(seed=seed)
    # Few trials are the rule in a sweep of training runs: TPE models after a handful, not ten.
    startup = max(2, min(10, sweep.max_runs // 3))
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, constant_liar=True)


def pruner(sweep: Sweep) -> optuna.pruners.BasePruner:
    if sweep.early_stopping == Sweep.EarlyStopping.MEDIAN:
        return optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=sweep.min_steps)
    if sweep.early_stopping == Sweep.EarlyStopping.ASHA:
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=max(1, sweep.min_steps), reduction_factor=sweep.reduction_factor
        )
    return optuna.pruners.NopPruner()


@dataclass
class Record:
    """What the study needs of one recorded trial: its row and its objective's values by step."""

    trial: SweepTrial
    values: dict[int, float]  # the objective metric at each evaluated step after the start


def study_build(sweep: Sweep, records: Iterable[Record]) -> optuna.Study:
    """A fresh in-memory study holding every recorded trial, numbered as recorded."""
    maximize = sweep.direction == Sweep.Direction.MAXIMIZE
    direction = optuna.study.StudyDirection.MAXIMIZE if maximize else optuna.study.StudyDirection.MINIMIZE
    study = optuna.create_study(direction=direction, sampler=sampler(sweep, 0), pruner=pruner(sweep))
    spaces = distributions(sweep.parameters)
    for record in sorted(records, key=lambda r: r.trial.number):
        trial = record.trial
        state = STATES[SweepTrial.State(trial.state)]
        value = trial.value if state in (TrialState.COMPLETE, TrialState.PRUNED) else None
        study.add_trial(
            optuna.trial.create_trial(
                params=trial.params,
                distributions=spaces,
                state=state,
                value=value if state == TrialState.COMPLETE or value is not None else None,
                intermediate_values=record.values,
                system_attrs=dict(trial.system_attrs),
            )
        )
    return study


def frozen(study: optuna.Study, number: int) -> FrozenTrial:
    return study.get_trials(deepcopy=False)[number]


def ask(study: optuna.Study, sweep: Sweep) -> FrozenTrial:
    """The next point of the search, as a trial of `study` (running there, recorded nowhere yet)."""
    number = len(study.get_trials(deepcopy=False))
    study.sampler = sampler(sweep, number)
    trial = study.ask(distributions(sweep.parameters))
    return frozen(study, trial.number)


def tell(
    study: optuna.Study, number: int, value: float | None = None, *, state: TrialState | None = None
) -> None:
    """End a trial of the rebuilt study. The sampler that would see it is set aside: it only
    proposes (a grid sampler, told its last point ended, would stop an optimize loop there is not)."""
    proposing, study.sampler = study.sampler, optuna.samplers.RandomSampler()
    try:
        study.tell(number, value, state=state)
    finally:
        study.sampler = proposing


def grid_left(study: optuna.Study, sweep: Sweep) -> int:
    """Grid points not yet given to a trial (any search but grid: no end)."""
    if sweep.search != Sweep.Search.GRID:
        return 10**9
    taken = {t.system_attrs.get("grid_id") for t in study.get_trials(deepcopy=False)}
    return grid_size(sweep.parameters) - len(taken - {None})

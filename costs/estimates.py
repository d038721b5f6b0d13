"""What a run will use before it starts: its steps' device time, sandbox CPU, wall time and money,
scaled from what earlier runs of the same tier and method recorded (the Usage rows the workers
write), with the range those runs spread over.

The unit of work is what a step processes: `batch_size` × `group_size` (a GRPO step's samples; an
SFT or DPO step's examples). An earlier steady step's device seconds per unit, times the new run's
units per step, times its steps, is one estimate of the whole; the median over earlier steps is
the figure and their 10th and 90th percentiles its range. Wall time is the time between
consecutive learner steps, per unit the same way.

Start-up is kept out of the steady rates. A step is steady when the step before it was recorded
and none of its rows is a worker's warm-up (`Usage.warm_up`: the first work of a worker process,
which loaded, compiled and warmed its caches in that time; a learner restarted after a crash or a
pause starts a new process, so the gap it left is not a step's time either). A run's start is
counted once per run: every run starts a learner process of its own, so its first step's learner
time beyond a steady one, and the time from the run's start to its first step's end, are a run's
cost. But a start whose rollouts were done by a worker's first batch measured that worker's
start-up, which a run on warm workers does not pay: its rollouts' extra device time is left out,
and so is its wall time (with only such starts, the first step is counted as a steady step). So a
calibration that was the first run on fresh workers does not inflate the estimate of the runs
after it. Nor do the steps after its start while its host still warms up (on a fresh host the
first runs' steps keep speeding up for several steps: caches and allocators fill, a spare learner
loads beside them): a run's leading steps slower than WARMING times the pace of its later half
are left out of both the steady rates and the start. With no steady step of this tier and method
recorded there is no basis, and the answer says so rather than guess.
"""

import statistics
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.utils import timezone

from costs.models import Price, Usage
from costs.selectors import CENT, PriceBook
from runs.models import Run
from tiers.models import Tier

HISTORY_RUNS = 20  # the newest runs of the tier and method the rates come from
RANGE = (0.1, 0.9)  # the quantiles of the per-step rates given as the range
WARMING = 1.25  # a run's leading steps this much slower than its later half were still warming up
PER_STEP_KINDS = (Usage.Kind.LEARNER, Usage.Kind.ROLLOUT)
COLD_STARTS = " (their starts were on workers just started, so a start is counted as a steady step)"


@dataclass(frozen=True)
class StepRate:
    """One steady step of an earlier run (see the module's docstring), per unit of work."""

    device_seconds: float
    cpu_seconds: float
    wall_seconds: float  # since the run's step before
    device_class: str


@dataclass(frozen=True)
class RunStart:
    """What an earlier run's start cost once, beyond its steady steps: the device-seconds its first
    step took above a steady one (loading, warming), and the seconds from its start to the end of
    its first step (None when its start was not recorded, or measured a worker's start-up)."""

    device_seconds: float
    wall_seconds: float | None


@dataclass
class History:
    steps: list[StepRate]
    starts: list[RunStart]
    runs: list[int]
    recorded_steps: int


@dataclass
class StepRecord:
    """One recorded step of a run, its rows added up: when its learner recorded it, the device
    time of the learner and of the rollouts, and whether a worker warmed up in it."""

    ended: Any = None
    device_class: str = ""
    learner: float = 0.0
    rollout: float = 0.0
    cpu: float = 0.0
    warm_up: bool = False
    rollout_warm_up: bool = False


def work_per_step(resolved: dict[str, Any]) -> int:
    """Units of work a step processes: its items times their samples.

    >>> work_per_step({"batch_size": 16, "group_size": 8}), work_per_step({"batch_size": 4})
    (128, 4)
    """
    return int(resolved.get("batch_size") or 1) * int(resolved.get("group_size") or 1)


def run_steps(run: Run) -> list[tuple[int, StepRecord]]:
    """The run's steps its learner recorded, in order, each with all its rows added up."""
    records: dict[int, StepRecord] = {}
    rows = Usage.objects.filter(run=run, kind__in=PER_STEP_KINDS).values_list(
        "step", "kind", "device_seconds", "cpu_seconds", "warm_up", "first_recorded_at", "device_class"
    )
    for step, kind, device, cpu, warm_up, first_recorded_at, device_class in rows:
        record = records.setdefault(step, StepRecord())
        record.cpu += cpu
        record.warm_up |= warm_up
        if kind == Usage.Kind.LEARNER:
            record.learner += device
            record.ended, record.device_class = first_recorded_at, device_class
        else:
            record.rollout += device
            record.rollout_warm_up |= warm_up
    # A step ends when its learner records it; a rollout of the next step may be recorded before
    # (pipelining), and one whose learner never recorded it is no step.
    return sorted((step, record) for step, record in records.items() if record.ended is not None)


def steady_pairs(steps: list[tuple[int, StepRecord]]) -> list[tuple[StepRecord, int, StepRecord]]:
    """(the step before, step, its record) for each steady step of a run's recorded ones: the
    step before was recorded, and no worker warmed up in it (see the module's docstring)."""
    pairs = zip(steps, steps[1:], strict=False)
    return [
        (earlier, step, record)
        for (before, earlier), (step, record) in pairs
        if step == before + 1 and not record.warm_up
    ]


def settled_pairs(
    pairs: list[tuple[StepRecord, int, StepRecord]],
) -> list[tuple[StepRecord, int, StepRecord]]:
    """The steady pairs from the first whose device time and wall time are both within WARMING of
    the medians of the run's later half: what came before was the host still warming up.

    >>> from datetime import datetime, timedelta
    >>> t0 = datetime(2026, 1, 1)
    >>> def pair(step, device, wall, ended):
    ...     at = t0 + timedelta(seconds=ended)
    ...     return StepRecord(at - timedelta(seconds=wall)), step, StepRecord(at, learner=device)
    >>> pairs = [pair(2, 3.0, 3.0, 3), pair(3, 1.1, 1.0, 4), pair(4, 1.0, 1.0, 5), pair(5, 0.9, 1.0, 6)]
    >>> [step for _, step, _ in settled_pairs(pairs)]
    [3, 4, 5]
    """
    later = pairs[len(pairs) // 2 :]
    if not later:
        return []
    device = statistics.median(record.learner + record.rollout for _, _, record in later)
    wall = statistics.median(_wall(earlier, record) for earlier, _, record in later)
    for index, (earlier, _, record) in enumerate(pairs):
        if record.learner + record.rollout <= WARMING * device and _wall(earlier, record) <= WARMING * wall:
            return pairs[index:]
    return later


def _wall(earlier: StepRecord, record: StepRecord) -> float:
    return (record.ended - earlier.ended).total_seconds()


def step_rate(earlier: StepRecord, record: StepRecord, units: int) -> StepRate:
    return StepRate(
        device_seconds=(record.learner + record.rollout) / units,
        cpu_seconds=record.cpu / units,
        wall_seconds=_wall(earlier, record) / units,
        device_class=record.device_class,
    )


def run_start(run: Run, steps: list[tuple[int, StepRecord]], steady: set[int]) -> RunStart:
    """What the run's start cost beyond a steady step: the learner's extra (every run starts a
    learner of its own), and the rollouts' unless a worker's first batch did them."""
    first = steps[0][1]
    learner = [record.learner for step, record in steps if step in steady]
    rollout = [record.rollout for step, record in steps if step in steady]
    extra = max(first.learner - statistics.median(learner), 0.0) if learner else 0.0
    if rollout and not first.rollout_warm_up:
        extra += max(first.rollout - statistics.median(rollout), 0.0)
    cold = first.rollout_warm_up or run.started_at is None
    wall = None if cold else (first.ended - run.started_at).total_seconds()
    return RunStart(device_seconds=extra, wall_seconds=wall)


def history(*, tier: Tier, method: str) -> History:
    """The steady steps and the starts of the newest runs of this tier and method."""
    runs = list(
        Run.objects.filter(tier=tier, method=method, learner_step__gt=0)
        .order_by("-pk")
        .only("pk", "resolved", "started_at")[:HISTORY_RUNS]
    )
    found = History(steps=[], starts=[], runs=[run.pk for run in runs], recorded_steps=0)
    for run in runs:
        steps = run_steps(run)
        if not steps:
            continue
        found.recorded_steps += len(steps)
        units, pairs = work_per_step(run.resolved or {}), settled_pairs(steady_pairs(steps))
        found.steps += [step_rate(earlier, record, units) for earlier, _, record in pairs]
        found.starts.append(run_start(run, steps, {step for _, step, _ in pairs}))
    return found


def _spread(values: list[float]) -> tuple[float, float, float]:
    """(low, median, high): the RANGE quantiles around the median (all one value when alone)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[int(RANGE[0] * 100) - 1], statistics.median(values), cuts[int(RANGE[1] * 100) - 1]


def run_estimate(*, tier: Tier, method: str, resolved: dict[str, Any], steps: int) -> dict[str, Any]:
    """The expected device-hours, sandbox CPU-hours, wall time and money of `steps` steps, each
    with its range, or no basis and why. A run's start (its first step's extra device time, the
    time to its first step's end) is counted once, at the median of the earlier runs'."""
    units = work_per_step(resolved)
    past = history(tier=tier, method=method)
    calibration = latest_calibration(tier=tier, method=method)
    answer: dict[str, Any] = {
        "steps": steps,
        "work_per_step": units,
        "basis": None,
        "calibration": calibration,
    }
    if not past.steps:
        answer["why"] = (
            f"no run of tier {tier.name} with method {method} has recorded two steps yet: calibrate "
            "(a short run of a few steps) and its record becomes the basis"
        )
        if calibration is not None and calibration["status"] in Run.ACTIVE:
            answer["why"] = (
                f"calibration run {calibration['run']} of tier {tier.name} ({method}) is "
                f"{calibration['status']}, at step {calibration['learner_step']} of "
                f"{calibration['max_steps']}: the estimate rests on it once it has recorded two steps"
            )
        return answer
    start_device = statistics.median(start.device_seconds for start in past.starts)
    walls_to_first = [start.wall_seconds for start in past.starts if start.wall_seconds is not None]
    start_wall = statistics.median(walls_to_first) if walls_to_first else None
    device = [(units * steps * r.device_seconds + start_device) / 3600 for r in past.steps]
    cpu = [units * steps * r.cpu_seconds / 3600 for r in past.steps]
    # Without a start measured on warm workers, the first step is counted as a steady one.
    steady_steps = steps if start_wall is None else steps - 1
    walls = [units * steady_steps * r.wall_seconds + (start_wall or 0.0) for r in past.steps]
    device_class = statistics.mode([r.device_class for r in past.steps])
    prices, now = PriceBook.load(), timezone.now()
    per_device_hour = prices.at(Price.Unit.DEVICE_HOUR, device_class, now)
    per_cpu_hour = prices.at(Price.Unit.CPU_HOUR, "", now)
    # Money as exact as the hours it comes from: floats, kept to the millionth as costs are.
    money = [d * float(per_device_hour) + c * float(per_cpu_hour) for d, c in zip(device, cpu, strict=True)]
    answer["basis"] = {"runs": past.runs, "steps": past.recorded_steps, "device_class": device_class}
    answer["device_hours"] = _range(device)
    answer["sandbox_cpu_hours"] = _range(cpu)
    answer["wall_seconds"] = _range(walls)
    answer["money"] = {
        name: str(Decimal(repr(value)).quantize(CENT))
        for name, value in zip(("low", "expected", "high"), _spread(money), strict=True)
    }
    answer["why"] = (
        f"scaled from {past.recorded_steps} recorded steps of {len(past.runs)} earlier run(s) of tier "
        f"{tier.name} ({method}), by {units} units of work a step over {steps} steps, with a run's "
        f"start counted once{'' if start_wall is not None else COLD_STARTS}; the range is their "
        f"{int(RANGE[0] * 100)}th to "
        f"{int(RANGE[1] * 100)}th percentile"
    )
    return answer


def latest_calibration(*, tier: Tier, method: str) -> dict[str, Any] | None:
    """The newest calibration run of the tier and method (launched by an estimate), in brief."""
    run = Run.objects.filter(tier=tier, method=method, calibration=True).order_by("-pk").first()
    if run is None:
        return None
    return {"run": run.pk, "status": run.status, "learner_step": run.learner_step, "max_steps": run.max_steps}


def _range(values: list[float]) -> dict[str, float]:
    low, mid, high = _spread(values)
    return {"low": round(low, 6), "expected": round(mid, 6), "high": round(high, 6)}

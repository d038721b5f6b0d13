"""What a run will use before it starts: its steps' device time, sandbox CPU, wall time and money,
scaled from what earlier runs of the same tier and method recorded (the Usage rows the workers
write), with the range those runs spread over.

The unit of work is what a step processes: `batch_size` × `group_size` (a GRPO step's samples; an
SFT or DPO step's examples). An earlier step's device seconds per unit, times the new run's units
per step, times its steps, is one estimate of the whole; the median over earlier steps is the
figure and their 10th and 90th percentiles its range. A run's first step is not steady (its
learner loads, its caches warm): what it took beyond a steady step, and the time from a run's start
to the end of its first step, are counted once per run. Wall time is the time between consecutive
learner steps, per unit the same way. With fewer than two steps of this tier and method recorded
there is no basis, and the answer says so rather than guess.
"""

import statistics
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db.models import Sum
from django.utils import timezone

from costs.models import Price, Usage
from costs.selectors import CENT, PriceBook
from runs.models import Run
from tiers.models import Tier

HISTORY_RUNS = 20  # the newest runs of the tier and method the rates come from
RANGE = (0.1, 0.9)  # the quantiles of the per-step rates given as the range
PER_STEP_KINDS = (Usage.Kind.LEARNER, Usage.Kind.ROLLOUT)


@dataclass(frozen=True)
class StepRate:
    """One steady step of an earlier run (any step but its first), per unit of work."""

    device_seconds: float
    cpu_seconds: float
    wall_seconds: float  # since the run's step before
    device_class: str


@dataclass(frozen=True)
class RunStart:
    """What an earlier run's start cost once, beyond its steady steps: the device-seconds its first
    step took above a steady one (loading, warming), and the seconds from its start to the end of
    its first step (None when its start was not recorded)."""

    device_seconds: float
    wall_seconds: float | None


@dataclass
class History:
    steps: list[StepRate]
    starts: list[RunStart]
    runs: list[int]
    recorded_steps: int


def work_per_step(resolved: dict[str, Any]) -> int:
    """Units of work a step processes: its items times their samples.

    >>> work_per_step({"batch_size": 16, "group_size": 8}), work_per_step({"batch_size": 4})
    (128, 4)
    """
    return int(resolved.get("batch_size") or 1) * int(resolved.get("group_size") or 1)


def history(*, tier: Tier, method: str) -> History:
    """The steady steps and the starts of the newest runs of this tier and method. A step ends
    when its learner records it; a rollout of the next step may be recorded before (pipelining)."""
    runs = list(
        Run.objects.filter(tier=tier, method=method, learner_step__gt=0)
        .order_by("-pk")
        .only("pk", "resolved", "started_at")[:HISTORY_RUNS]
    )
    found = History(steps=[], starts=[], runs=[run.pk for run in runs], recorded_steps=0)
    for run in runs:
        units = work_per_step(run.resolved or {})
        used = {
            row["step"]: row
            for row in Usage.objects.filter(run=run, kind__in=PER_STEP_KINDS)
            .values("step")
            .annotate(device=Sum("device_seconds"), cpu=Sum("cpu_seconds"))
        }
        learned = list(
            Usage.objects.filter(run=run, kind=Usage.Kind.LEARNER)
            .order_by("step")
            .values_list("step", "first_recorded_at", "device_class")
        )
        if not learned:
            continue
        found.recorded_steps += len(learned)
        for (_, before, _), (step, ended, device_class) in zip(learned, learned[1:], strict=False):
            found.steps.append(
                StepRate(
                    device_seconds=used[step]["device"] / units,
                    cpu_seconds=used[step]["cpu"] / units,
                    wall_seconds=(ended - before).total_seconds() / units,
                    device_class=device_class,
                )
            )
        first, first_ended = learned[0][0], learned[0][1]
        steady = [used[step]["device"] for step, _, _ in learned[1:]]
        excess = used[first]["device"] - statistics.median(steady) if steady else 0.0
        startup = None if run.started_at is None else (first_ended - run.started_at).total_seconds()
        found.starts.append(RunStart(device_seconds=max(excess, 0.0), wall_seconds=startup))
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
    answer: dict[str, Any] = {"steps": steps, "work_per_step": units, "basis": None}
    if not past.steps:
        answer["why"] = (
            f"no run of tier {tier.name} with method {method} has recorded two steps yet: launch a "
            "short one (a few steps) and its record becomes the basis"
        )
        return answer
    start_device = statistics.median(start.device_seconds for start in past.starts)
    walls_to_first = [start.wall_seconds for start in past.starts if start.wall_seconds is not None]
    start_wall = statistics.median(walls_to_first) if walls_to_first else None
    device = [(units * steps * r.device_seconds + start_device) / 3600 for r in past.steps]
    cpu = [units * steps * r.cpu_seconds / 3600 for r in past.steps]
    walls = [units * (steps - 1) * r.wall_seconds + (start_wall or 0.0) for r in past.steps]
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
        f"start counted once; the range is their {int(RANGE[0] * 100)}th to "
        f"{int(RANGE[1] * 100)}th percentile"
    )
    return answer


def _range(values: list[float]) -> dict[str, float]:
    low, mid, high = _spread(values)
    return {"low": round(low, 6), "expected": round(mid, 6), "high": round(high, 6)}

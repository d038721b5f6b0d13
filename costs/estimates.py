"""What a run will use before it starts: its steps' device time, sandbox CPU, wall time and money,
scaled from what earlier runs of the same tier and method recorded (the Usage rows the workers
write), with the range those runs spread over.

The unit of work is what a step processes: `batch_size` × `group_size` (a GRPO step's samples; an
SFT or DPO step's examples). An earlier step's device seconds per unit, times the new run's units
per step, times its steps, is one estimate of the whole; the median over earlier steps is the
figure and their 10th and 90th percentiles its range. Wall time is the time between consecutive
learner steps, per unit the same way. With no earlier step of this tier and method there is no
basis, and the answer says so rather than guess.
"""

import statistics
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import Min, Sum
from django.utils import timezone

from costs.models import Price, Usage
from costs.selectors import CENT, PriceBook
from runs.models import Run, Tier

HISTORY_RUNS = 20  # the newest runs of the tier and method the rates come from
RANGE = (0.1, 0.9)  # the quantiles of the per-step rates given as the range
PER_STEP_KINDS = (Usage.Kind.LEARNER, Usage.Kind.ROLLOUT)


@dataclass(frozen=True)
class StepRate:
    """One recorded step of an earlier run, per unit of work."""

    device_seconds: float
    cpu_seconds: float
    wall_seconds: float | None  # None for a run's first step (nothing before it to time from)
    device_class: str


def work_per_step(resolved: dict[str, Any]) -> int:
    """Units of work a step processes: its items times their samples.

    >>> work_per_step({"batch_size": 16, "group_size": 8}), work_per_step({"batch_size": 4})
    (128, 4)
    """
    return int(resolved.get("batch_size") or 1) * int(resolved.get("group_size") or 1)


def step_rates(*, tier: Tier, method: str) -> tuple[list[StepRate], list[int]]:
    """The per-unit rates of every recorded step of the newest runs of this tier and method, and
    the runs they come from."""
    runs = list(
        Run.objects.filter(tier=tier, method=method, learner_step__gt=0)
        .order_by("-pk")
        .only("pk", "resolved")[:HISTORY_RUNS]
    )
    rates: list[StepRate] = []
    for run in runs:
        units = work_per_step(run.resolved or {})
        steps = (
            Usage.objects.filter(run=run, kind__in=PER_STEP_KINDS)
            .values("step")
            .annotate(device=Sum("device_seconds"), cpu=Sum("cpu_seconds"), started=Min("first_recorded_at"))
            .order_by("step")
        )
        classes = dict(
            Usage.objects.filter(run=run, kind=Usage.Kind.LEARNER).values_list("step", "device_class")
        )
        previous: datetime | None = None
        for row in steps:
            wall = None if previous is None else (row["started"] - previous).total_seconds()
            previous = row["started"]
            rates.append(
                StepRate(
                    device_seconds=row["device"] / units,
                    cpu_seconds=row["cpu"] / units,
                    wall_seconds=None if wall is None else wall / units,
                    device_class=classes.get(row["step"], ""),
                )
            )
    return rates, [run.pk for run in runs]


def _spread(values: list[float]) -> tuple[float, float, float]:
    """(low, median, high): the RANGE quantiles around the median (all one value when alone)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[int(RANGE[0] * 100) - 1], statistics.median(values), cuts[int(RANGE[1] * 100) - 1]


def run_estimate(*, tier: Tier, method: str, resolved: dict[str, Any], steps: int) -> dict[str, Any]:
    """The expected device-hours, sandbox CPU-hours, wall time and money of `steps` steps, each
    with its range, or no basis and why."""
    units = work_per_step(resolved)
    rates, runs = step_rates(tier=tier, method=method)
    answer: dict[str, Any] = {"steps": steps, "work_per_step": units, "basis": None}
    if not rates:
        answer["why"] = (
            f"no run of tier {tier.name} with method {method} has recorded a step yet: launch a short "
            "one (a few steps) and its record becomes the basis"
        )
        return answer
    scale = units * steps
    device = [scale * r.device_seconds / 3600 for r in rates]
    cpu = [scale * r.cpu_seconds / 3600 for r in rates]
    walls = [scale * r.wall_seconds for r in rates if r.wall_seconds is not None]
    device_class = statistics.mode([r.device_class for r in rates])
    prices, now = PriceBook.load(), timezone.now()
    per_device_hour = prices.at(Price.Unit.DEVICE_HOUR, device_class, now)
    per_cpu_hour = prices.at(Price.Unit.CPU_HOUR, "", now)
    money = [
        Decimal(repr(d)) * per_device_hour + Decimal(repr(c)) * per_cpu_hour
        for d, c in zip(device, cpu, strict=True)
    ]
    answer["basis"] = {"runs": runs, "steps": len(rates), "device_class": device_class}
    answer["device_hours"] = _range(device)
    answer["sandbox_cpu_hours"] = _range(cpu)
    answer["wall_seconds"] = _range(walls) if walls else None
    low, mid, high = _spread([float(m) for m in money])
    answer["money"] = {
        name: str(Decimal(repr(v)).quantize(CENT))
        for name, v in zip(("low", "expected", "high"), (low, mid, high), strict=True)
    }
    answer["why"] = (
        f"scaled from {len(rates)} recorded steps of {len(runs)} earlier run(s) of tier {tier.name} "
        f"({method}), by {units} units of work a step over {steps} steps; the range is their "
        f"{int(RANGE[0] * 100)}th to {int(RANGE[1] * 100)}th percentile"
    )
    return answer


def _range(values: list[float]) -> dict[str, float]:
    low, mid, high = _spread(values)
    return {"low": round(low, 6), "expected": round(mid, 6), "high": round(high, 6)}

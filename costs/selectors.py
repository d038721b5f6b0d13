"""Reads for costs: a run's units and money by component and by step, a project's by run and by
user over a period, and what a run has spent against its budget.

Money is computed here, never stored: each Usage row's units times the Price of each unit in
force when the row was recorded (a price set later applies only to units recorded after it).
"""

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import QuerySet, Sum
from django.utils import timezone

from costs.models import UNITS, Price, ProjectBudget, Usage
from projects.models import Project
from runs.models import Run

CENT = Decimal("0.000001")  # money is kept to a millionth, shown rounded by whoever shows it
MILLION = Decimal(1_000_000)
HOUR = Decimal(3600)
GB = Decimal(1_000_000_000)
MONTH_DAYS = 30


class PriceBook:
    """Every price, read once, answering "what did a unit cost at this moment for this scope"."""

    def __init__(self, prices: Iterable[Price]) -> None:
        self._prices: dict[tuple[str, str], list[Price]] = defaultdict(list)
        for price in sorted(prices, key=lambda p: (p.effective_from, p.pk or 0)):
            self._prices[(price.unit, price.scope)].append(price)

    @classmethod
    def load(cls) -> "PriceBook":
        return cls(Price.objects.all())

    def at(self, unit: str, scope: str, moment: datetime) -> Decimal:
        """The price of `unit` for `scope` in force at `moment`: the scope's own, else the
        any-scope one, else nothing (0: an operator who set no price pays nothing)."""
        for key in ((unit, scope), (unit, "")):
            in_force = [p for p in self._prices.get(key, ()) if p.effective_from <= moment]
            if in_force:
                return in_force[-1].amount
        return Decimal(0)


def _decimal(value: float | int) -> Decimal:
    return Decimal(repr(float(value))) if isinstance(value, float) else Decimal(value)


def storage_months(recorded: datetime, now: datetime) -> int:
    """Whole months a stored byte is billed for: each month it has been kept, begun counting.

    >>> from datetime import datetime, timedelta
    >>> start = datetime(2026, 1, 1)
    >>> storage_months(start, start), storage_months(start, start + timedelta(days=30))
    (1, 1)
    >>> storage_months(start, start + timedelta(days=31))
    2
    """
    days = (now - recorded).total_seconds() / 86400
    return max(1, math.ceil(days / MONTH_DAYS))


def usage_money(row: Usage, prices: PriceBook, now: datetime) -> dict[str, Decimal]:
    """The row's money by price unit, at the prices in force when it was recorded."""
    at = row.recorded_at
    money = {
        Price.Unit.DEVICE_HOUR: _decimal(row.device_seconds)
        / HOUR
        * prices.at(Price.Unit.DEVICE_HOUR, row.device_class, at),
        Price.Unit.CPU_HOUR: _decimal(row.cpu_seconds) / HOUR * prices.at(Price.Unit.CPU_HOUR, "", at),
        Price.Unit.ENGINE_MTOK_IN: Decimal(row.engine_tokens_in)
        / MILLION
        * prices.at(Price.Unit.ENGINE_MTOK_IN, row.engine, at),
        Price.Unit.ENGINE_MTOK_OUT: Decimal(row.engine_tokens_out)
        / MILLION
        * prices.at(Price.Unit.ENGINE_MTOK_OUT, row.engine, at),
        Price.Unit.GB_MONTH: Decimal(row.storage_bytes)
        / GB
        * prices.at(Price.Unit.GB_MONTH, "", at)
        * storage_months(row.first_recorded_at, now),
    }
    return {unit: value.quantize(CENT) for unit, value in money.items()}


@dataclass
class Tally:
    """Units and money summed over some Usage rows."""

    units: dict[str, float] = field(default_factory=lambda: dict.fromkeys(UNITS, 0))
    money: dict[str, Decimal] = field(
        default_factory=lambda: {unit: Decimal(0) for unit in Price.Unit.values}
    )
    rerecorded: int = 0

    def add(self, row: Usage, money: dict[str, Decimal]) -> None:
        for unit in UNITS:
            self.units[unit] += getattr(row, unit)
        for unit, value in money.items():
            self.money[unit] += value
        self.rerecorded += row.rerecorded

    @property
    def total(self) -> Decimal:
        return sum(self.money.values(), Decimal(0))

    @property
    def device_hours(self) -> float:
        return self.units["device_seconds"] / 3600

    def as_dict(self) -> dict:
        return {
            "units": self.units,
            "money": {unit: str(value) for unit, value in self.money.items()},
            "total": str(self.total),
            "device_hours": self.device_hours,
            "rerecorded": self.rerecorded,
        }


def tally(rows: Iterable[Usage], *, prices: PriceBook | None = None, now: datetime | None = None) -> Tally:
    prices, now = prices or PriceBook.load(), now or timezone.now()
    out = Tally()
    for row in rows:
        out.add(row, usage_money(row, prices, now))
    return out


def usage_of(*, run: Run) -> QuerySet[Usage]:
    return Usage.objects.filter(run=run).order_by("step", "component")


def run_cost(*, run: Run, now: datetime | None = None) -> dict:
    """A run's units and money: in all, by kind (learner, rollout, evaluation, storage), per
    step, and against its budget."""
    prices, now = PriceBook.load(), now or timezone.now()
    everything = Tally()
    by_kind: dict[str, Tally] = defaultdict(Tally)
    by_step: dict[int, Tally] = defaultdict(Tally)
    for row in usage_of(run=run):
        money = usage_money(row, prices, now)
        for into in (everything, by_kind[row.kind], by_step[row.step]):
            into.add(row, money)
    return {
        "run": run.pk,
        "currency": settings.FLYWHEEL_CURRENCY,
        **everything.as_dict(),
        "by_kind": {kind: by_kind[kind].as_dict() for kind in Usage.Kind.values if kind in by_kind},
        "steps": [{"step": step, "total": str(t.total), **t.units} for step, t in sorted(by_step.items())],
        "budget": {
            "money": None if run.budget_money is None else str(run.budget_money),
            "device_hours": run.budget_device_hours,
        },
    }


def run_spent(*, run: Run, now: datetime | None = None) -> Tally:
    return tally(Usage.objects.filter(run=run), now=now)


def runs_money(*, run_ids: list[int], now: datetime | None = None) -> dict[int, Decimal]:
    """Each run's money so far (the runs table's column); runs without usage are left out."""
    prices, now = PriceBook.load(), now or timezone.now()
    out: dict[int, Decimal] = defaultdict(Decimal)
    for row in Usage.objects.filter(run_id__in=run_ids):
        out[row.run_id] += sum(usage_money(row, prices, now).values(), Decimal(0))
    return dict(out)


def project_costs(*, project: Project, since: datetime | None = None, until: datetime | None = None) -> dict:
    """The project's units and money recorded in [since, until): in all, per run and per user
    (the run's creator)."""
    rows = Usage.objects.filter(project=project).select_related("run", "run__created_by")
    if since is not None:
        rows = rows.filter(recorded_at__gte=since)
    if until is not None:
        rows = rows.filter(recorded_at__lt=until)
    prices, now = PriceBook.load(), timezone.now()
    everything = Tally()
    per_run: dict[int, Tally] = defaultdict(Tally)
    per_user: dict[int | None, Tally] = defaultdict(Tally)
    names: dict[int, str] = {}
    users: dict[int | None, str] = {}
    for row in rows:
        money = usage_money(row, prices, now)
        user = row.run.created_by
        names[row.run_id] = row.run.name
        users[user.pk if user else None] = user.get_username() if user else ""
        for into in (everything, per_run[row.run_id], per_user[user.pk if user else None]):
            into.add(row, money)
    return {
        "project": project.pk,
        "currency": settings.FLYWHEEL_CURRENCY,
        "since": since,
        "until": until,
        **everything.as_dict(),
        "runs": [{"run": pk, "name": names[pk], **t.as_dict()} for pk, t in sorted(per_run.items())],
        "users": [
            {"user": pk, "username": users[pk], **t.as_dict()}
            for pk, t in sorted(per_user.items(), key=lambda item: users[item[0]])
        ],
        "budget": project_budget_of(project=project),
    }


def month_start(moment: datetime) -> datetime:
    return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def project_month_spent(*, project: Project, now: datetime | None = None) -> Decimal:
    """What the project's runs recorded since the start of this calendar month (UTC)."""
    now = now or timezone.now()
    rows = Usage.objects.filter(project=project, recorded_at__gte=month_start(now))
    return tally(rows, now=now).total


def project_budget_of(*, project: Project) -> dict:
    budget = ProjectBudget.objects.filter(project=project).first()
    monthly = None if budget is None or not budget.monthly else budget.monthly
    return {
        "monthly": None if monthly is None else str(monthly),
        "spent_this_month": str(project_month_spent(project=project)),
    }


def usage_totals() -> list[dict[str, Any]]:
    """Units over every run, by kind and device class: the Prometheus counters."""
    rows = (
        Usage.objects.values("kind", "device_class")
        .annotate(**{unit: Sum(unit) for unit in UNITS})
        .order_by("kind", "device_class")
    )
    return [dict(row) for row in rows]


def prices() -> QuerySet[Price]:
    return Price.objects.all()

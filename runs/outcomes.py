"""Did a run make the model better? Its final held-out results against its start, item by item.

Held-out evaluation keeps each item's result (`HeldOutResult`), so two evaluations of the same
items compare pairwise: the difference on each item, its mean, and a paired bootstrap interval on
that mean. "2 points on 80 items" then says whether it means anything: the verdict is `improved`
or `regressed` only when the whole interval lies on one side of 0, else `unchanged`.

`paired_compare` is pure; `run_outcome_settle` is the service the learner calls once its final
checkpoint is evaluated, before the run is marked succeeded.
"""

import random
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from statistics import fmean
from typing import Any

from runs.models import HeldOutResult, Run

RESAMPLES = 2000
CONFIDENCE = 0.95
METRIC = "heldout/pass_rate"


@dataclass(frozen=True)
class Comparison:
    before: float  # the mean over the paired items
    after: float
    delta: float  # after - before
    low: float  # the paired bootstrap interval on delta
    high: float
    items: int  # items measured on both sides
    improved_items: int
    regressed_items: int

    @property
    def verdict(self) -> str:
        """improved / regressed only when the interval excludes 0.

        >>> Comparison(0.5, 0.75, 0.25, 0.05, 0.45, 8, 3, 1).verdict
        'improved'
        >>> Comparison(0.5, 0.5, 0.0, -0.2, 0.2, 8, 2, 2).verdict
        'unchanged'
        """
        if self.items and self.low > 0:
            return Run.Outcome.IMPROVED.value
        if self.items and self.high < 0:
            return Run.Outcome.REGRESSED.value
        return Run.Outcome.UNCHANGED.value

    def as_dict(self) -> dict:
        return asdict(self) | {"verdict": self.verdict, "confidence": CONFIDENCE}


def bootstrap_interval(
    differences: list[float], *, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """The percentile interval (CONFIDENCE) of the mean of `differences`, resampled with
    replacement; seeded, so the same results always give the same interval.

    >>> bootstrap_interval([1.0] * 10)
    (1.0, 1.0)
    >>> low, high = bootstrap_interval([0.0, 1.0] * 20)
    >>> 0.3 < low < 0.5 < high < 0.7
    True
    """
    if not differences:
        return 0.0, 0.0
    rng = random.Random(seed)
    count = len(differences)
    means = sorted(fmean(rng.choices(differences, k=count)) for _ in range(resamples))
    tail = (1 - CONFIDENCE) / 2
    return means[int(tail * (resamples - 1))], means[int(round((1 - tail) * (resamples - 1)))]


def paired_compare(before: Mapping[Any, float], after: Mapping[Any, float]) -> Comparison:
    """Compare two evaluations item by item (items measured on one side only are left out); an
    item's key is anything sortable that names it on both sides (an item id, an (entry, item) pair).

    >>> c = paired_compare({1: 0.0, 2: 1.0, 3: 1.0}, {1: 1.0, 2: 1.0, 3: 0.0, 4: 1.0})
    >>> (c.items, c.before, c.after, c.delta, c.improved_items, c.regressed_items)
    (3, 0.6666666666666666, 0.6666666666666666, 0.0, 1, 1)
    """
    items = sorted(set(before) & set(after))
    if not items:
        return Comparison(0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0)
    differences = [after[item] - before[item] for item in items]
    low, high = bootstrap_interval(differences)
    return Comparison(
        before=fmean(before[item] for item in items),
        after=fmean(after[item] for item in items),
        delta=fmean(differences),
        low=low,
        high=high,
        items=len(items),
        improved_items=sum(difference > 0 for difference in differences),
        regressed_items=sum(difference < 0 for difference in differences),
    )


def heldout_scores(run_id: int, step: int, *, metric: str = METRIC) -> dict[int, float]:
    """Each held-out item's score at a policy version (errored items left out): 1/0 for the pass
    rate, the reward for `heldout/reward`."""
    results = HeldOutResult.objects.filter(run_id=run_id, step=step, errored=False)
    if metric == "heldout/reward":
        return {
            item: reward for item, reward in results.values_list("item_id", "reward") if reward is not None
        }
    return {item: float(passed) for item, passed in results.values_list("item_id", "passed")}


def heldout_evaluated(run_id: int, step: int) -> bool:
    return HeldOutResult.objects.filter(run_id=run_id, step=step).exists()


def run_outcome_settle(*, run: Run, step: int) -> Comparison | None:
    """Record the run's outcome: its held-out results at `step` (its final policy version)
    against those at its start (version 0: the base model, or the checkpoint it was forked
    from). None, and nothing recorded, when either side was never evaluated item by item."""
    if not (heldout_evaluated(run.pk, 0) and heldout_evaluated(run.pk, step)):
        return None
    comparison = paired_compare(heldout_scores(run.pk, 0), heldout_scores(run.pk, step))
    detail = comparison.as_dict() | {"metric": METRIC, "from_step": 0, "to_step": step}
    Run.objects.filter(pk=run.pk).update(outcome=comparison.verdict, outcome_detail=detail)
    run.outcome, run.outcome_detail = comparison.verdict, detail
    return comparison


def outcome_sentence(detail: Mapping | None) -> str:
    """The outcome in words, for the run's header, table and final event.

    >>> outcome_sentence({"verdict": "regressed", "before": 1.0, "after": 0.825, "delta": -0.175,
    ...     "low": -0.3, "high": -0.05, "items": 40, "from_step": 0, "to_step": 6})
    'regressed: held-out pass rate 100.0% → 82.5% (−17.5 points, 95% interval −30.0 to −5.0) on 40 items'
    """
    if not detail:
        return ""

    def points(value: float) -> str:
        return f"{value * 100:+.1f}".replace("-", "−")

    return (
        f"{detail['verdict']}: held-out pass rate {detail['before']:.1%} → {detail['after']:.1%} "
        f"({points(detail['delta'])} points, 95% interval {points(detail['low'])} to "
        f"{points(detail['high'])}) on {detail['items']} items"
    )


# --- item by item, between any two evaluated versions ------------------------------------------

CHANGES = ("improved", "regressed", "unchanged")


def last_evaluated_step(run_id: int) -> int | None:
    """The newest policy version of the run evaluated item by item (its final one once finished)."""
    return (
        HeldOutResult.objects.filter(run_id=run_id).order_by("-step").values_list("step", flat=True).first()
    )


def item_change(before: float, after: float) -> str:
    """How one item's score moved.

    >>> item_change(0.0, 1.0), item_change(1.0, 1.0), item_change(1.0, 0.5)
    ('improved', 'unchanged', 'regressed')
    """
    return "improved" if after > before else "regressed" if after < before else "unchanged"


GRADER_PREFIX = "heldout/reward/"


def result_score(metric: str) -> Callable[[HeldOutResult], float | None]:
    """What a held-out result scores under `metric`: `heldout/pass_rate` (1 or 0), `heldout/reward`
    (the rule's total), or `heldout/reward/<grader>` (that grader's part of a `multi` rule: None
    where it did not run)."""
    if metric.startswith(GRADER_PREFIX):
        name = metric.removeprefix(GRADER_PREFIX)
        return lambda row: row.components.get(name)
    if metric == "heldout/reward":
        return lambda row: row.reward or 0.0
    return lambda row: float(row.passed)


def heldout_item_comparison(
    *,
    before: tuple[int, int],
    after: tuple[int, int],
    metric: str = METRIC,
    change: str = "",
    kind: str = "",
    descending: bool = True,
) -> dict:
    """Two evaluations, each a (run id, policy version), on the items both measured: the paired
    summary (over every shared item) and one row per item, both completions beside each other,
    filtered by change and item kind and sorted by the change (largest first by default)."""
    sides = [
        {
            row.item_id: row
            for row in HeldOutResult.objects.filter(run_id=run, step=step, errored=False).select_related(
                "item"
            )
        }
        for run, step in (before, after)
    ]
    score = result_score(metric)
    # An item counts where both sides have the figure (a grader's only where that grader ran).
    scores: dict[int, tuple[float, float]] = {}
    for item in sorted(set(sides[0]) & set(sides[1])):
        first_score, second_score = score(sides[0][item]), score(sides[1][item])
        if first_score is not None and second_score is not None:
            scores[item] = (first_score, second_score)
    summary = paired_compare(
        {item: first for item, (first, _) in scores.items()},
        {item: second for item, (_, second) in scores.items()},
    )
    rows = []
    for item_id, (first_score, second_score) in scores.items():
        first, second = sides[0][item_id], sides[1][item_id]
        rows.append(
            {
                "item": item_id,
                "external_id": first.item.external_id,
                "kind": first.item.kind,
                "before": first_score,
                "after": second_score,
                "change": item_change(first_score, second_score),
                "before_completion": first.completion_text,
                "after_completion": second.completion_text,
            }
        )
    chosen = rows_chosen(rows, change=change, kind=kind, descending=descending)
    return {"metric": metric, "summary": summary.as_dict(), "items": chosen}


def rows_chosen(rows: list[dict], *, change: str = "", kind: str = "", descending: bool = True) -> list[dict]:
    """Per-item comparison rows of that change and item kind (either may be empty: any), sorted by
    the change, the largest gain first unless not `descending`.

    >>> rows = [{"item": 1, "kind": "code", "before": 1.0, "after": 0.0, "change": "regressed"},
    ...         {"item": 2, "kind": "code", "before": 0.0, "after": 1.0, "change": "improved"}]
    >>> [row["item"] for row in rows_chosen(rows)], rows_chosen(rows, change="regressed")[0]["item"]
    ([2, 1], 1)
    """
    kept = [
        row for row in rows if (not change or row["change"] == change) and (not kind or row["kind"] == kind)
    ]
    return sorted(kept, key=lambda row: (row["after"] - row["before"], -row["item"]), reverse=descending)

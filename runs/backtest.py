"""Backtest: score the stored trajectories of a past run with another rule version and compare.

Only trajectories the run scored are rescored. Errored ones (the infrastructure failed, so they
carry no reward) and cancelled ones are counted and left alone: rescoring them as zero would
bend both histograms. The rescoring goes through `engine.score_batch`, so sandbox graders use
the engine's pool exactly as a run does. Nothing is stored.

A backtest is bounded: at most `limit` trajectories (default BACKTEST_DEFAULT_LIMIT), the newest
first, and the result says how many the run had (`total`) and whether it was cut (`limited`).
"""

from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from django.core.exceptions import ValidationError
from django.db.models import Count, Q, QuerySet

from core.exceptions import StateError
from projects.models import Project
from rewards import engine
from rewards.models import RewardRule, RewardRuleVersion
from rewards.services import item_dict, project_judge, project_reward_models
from runs.models import Run, Trajectory

BACKTEST_DEFAULT_LIMIT = 2000
BACKTEST_MAX_LIMIT = 10000
HISTOGRAM_BINS = 10
MAX_HISTOGRAM_BINS = 50
TOP_CHANGED = 20
COMPLETION_PREVIEW_CHARS = 500
SAME = 1e-9  # rewards closer than this did not change


@dataclass
class Histogram:
    """Counts of old and new rewards on the same bins: bin i is [edges[i], edges[i+1]), the last
    one closed. Empty when no trajectory has a reward on either side."""

    edges: list[float] = field(default_factory=list)
    old: list[int] = field(default_factory=list)
    new: list[int] = field(default_factory=list)


@dataclass
class ChangedTrajectory:
    trajectory: int
    item_id: str
    old: float
    new: float
    delta: float
    old_components: dict[str, Any]
    new_components: dict[str, Any]
    errors: list[dict]  # the new scoring's grader errors
    flags: list[str]  # detectors that flag it now
    completion: str  # the start of the completion text


@dataclass
class BacktestResult:
    run: Run
    version: RewardRuleVersion
    old_version: RewardRuleVersion  # the version the run scored with
    total: int  # the run's scored trajectories
    count: int  # how many were rescored: total, or limit when that is smaller
    limit: int
    limited: bool
    skipped_errored: int  # errored in the run: no reward to compare, not rescored
    skipped_cancelled: int
    old_mean: float | None
    new_mean: float | None
    old_scored: int  # rescored trajectories with a stored reward
    new_scored: int  # ... and with a new total
    errored: int  # the new scoring hit an infrastructure failure (masked, not zero)
    ungradeable: int  # the new rule cannot judge them (no total, not errored)
    changed_count: int  # both rewards known and different
    histogram: Histogram
    changed: list[ChangedTrajectory]  # the largest |delta| first
    newly_flagged: int  # trajectories with a hacking flag the run did not record
    new_flags: dict[str, int]  # detector -> trajectories it flags now and did not then


def reward_rule_backtest(
    *,
    run: Run,
    version: RewardRuleVersion,
    limit: int | None = None,
    bins: int = HISTOGRAM_BINS,
    top: int = TOP_CHANGED,
    pool: Any = None,
    judge: Any = None,
) -> BacktestResult:
    """Rescore the newest `limit` scored trajectories of `run` with `version`; stores nothing.

    A run of another project than the rule's is refused (ValidationError on `run`); a version
    that no longer validates is a StateError (409)."""
    if run.project_id != version.rule.project_id:
        raise ValidationError({"run": f"run {run.pk} is not in the project of {version.rule.name}"})
    limit = BACKTEST_DEFAULT_LIMIT if limit is None else limit
    outcomes = Counter(dict(run.trajectories.order_by().values_list("outcome").annotate(count=Count("pk"))))
    total = outcomes[Trajectory.Outcome.SCORED]
    trajectories = scored_trajectories(run=run, limit=limit)
    pairs = [(item_dict(t.item), trajectory_sample(t)) for t in trajectories]
    judge = judge or project_judge(version.rule.project)
    try:
        scorer = project_reward_models(version.rule.project)
        results = engine.score_batch(version.spec, pairs, pool=pool, judge=judge, reward_models=scorer)
    except engine.RuleError as exc:  # saved under an older engine that accepted what this one does not
        raise StateError(
            f"version {version.number} does not validate any more: {exc}; save a fixed version"
        ) from None
    old = [t.reward for t in trajectories]
    new = [result.total for result in results]
    flag_counts = new_flag_counts(trajectories, results)
    return BacktestResult(
        run=run,
        version=version,
        old_version=run.reward_rule_version,
        total=total,
        count=len(trajectories),
        limit=limit,
        limited=total > limit,
        skipped_errored=outcomes[Trajectory.Outcome.ERRORED],
        skipped_cancelled=outcomes[Trajectory.Outcome.CANCELLED],
        old_mean=mean(old),
        new_mean=mean(new),
        old_scored=sum(value is not None for value in old),
        new_scored=sum(value is not None for value in new),
        errored=sum(result.errored for result in results),
        ungradeable=sum(result.total is None and not result.errored for result in results),
        changed_count=sum(
            a is not None and b is not None and abs(b - a) > SAME for a, b in zip(old, new, strict=True)
        ),
        histogram=histogram(old, new, bins=bins),
        changed=most_changed(trajectories, results, top=top),
        newly_flagged=sum(bool(detectors) for detectors in flag_counts),
        new_flags=dict(sorted(Counter(d for detectors in flag_counts for d in detectors).items())),
    )


def scored_trajectories(*, run: Run, limit: int) -> list[Trajectory]:
    """The run's newest `limit` scored trajectories with their items and steps."""
    return list(
        run.trajectories.filter(outcome=Trajectory.Outcome.SCORED)
        .select_related("item")
        .prefetch_related("steps")
        .order_by("-created_at", "-pk")[:limit]
    )


def trajectory_sample(trajectory: Trajectory) -> engine.Sample:
    """What the rule scores: the completion (for a code item, the solution), the steps, the tokens,
    and for an agent episode its stored final workspace (the files the check then runs against)."""
    steps = [{"kind": step.kind, **step.data()} for step in trajectory.steps.all()]
    workspace = (steps[-1].get("final_workspace") or {}) if steps else {}
    return engine.Sample(
        output_text=trajectory.completion_text,
        steps=steps,
        tokens=trajectory.completion_tokens,
        files=dict(workspace.get("files") or {}),
    )


def mean(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) / len(known) if known else None


def histogram(old: list[float | None], new: list[float | None], *, bins: int = HISTOGRAM_BINS) -> Histogram:
    """Both sides counted on `bins` equal bins spanning every known reward of either side; when
    all rewards are equal, one bin one wide around them.

    >>> h = histogram([0.0, 1.0, 1.0, None], [0.5, 1.0, 0.0, 0.0], bins=2)
    >>> h.edges, h.old, h.new
    ([0.0, 0.5, 1.0], [1, 2], [2, 2])
    """
    known_old = [value for value in old if value is not None]
    known_new = [value for value in new if value is not None]
    values = known_old + known_new
    if not values:
        return Histogram()
    low, high = min(values), max(values)
    if high - low <= SAME:
        edges = [low - 0.5, low + 0.5]
    else:
        width = (high - low) / bins
        edges = [round(low + index * width, 12) for index in range(bins)] + [high]
    return Histogram(edges, bin_counts(known_old, edges), bin_counts(known_new, edges))


def bin_counts(values: list[float], edges: list[float]) -> list[int]:
    counts = [0] * (len(edges) - 1)
    for value in values:
        counts[min(max(bisect_right(edges, value) - 1, 0), len(counts) - 1)] += 1
    return counts


def most_changed(
    trajectories: list[Trajectory], results: list[engine.ScoreResult], *, top: int
) -> list[ChangedTrajectory]:
    """The `top` trajectories whose reward moved most, largest |delta| first, then by id; only
    those with a reward on both sides (the rest are counted as errored or ungradeable)."""
    rows = [
        ChangedTrajectory(
            trajectory=t.pk,
            item_id=t.item.external_id,
            old=t.reward,
            new=result.total,
            delta=result.total - t.reward,
            old_components=dict(t.components or {}),
            new_components=dict(result.components),
            errors=result.to_dict()["errors"],
            flags=sorted({flag.detector for flag in result.flags}),
            completion=t.completion_text[:COMPLETION_PREVIEW_CHARS],
        )
        for t, result in zip(trajectories, results, strict=True)
        if t.reward is not None and result.total is not None and abs(result.total - t.reward) > SAME
    ]
    rows.sort(key=lambda row: (-abs(row.delta), row.trajectory))
    return rows[:top]


def new_flag_counts(trajectories: list[Trajectory], results: list[engine.ScoreResult]) -> list[set[str]]:
    """Per trajectory, the detectors that flag it now and did not when the run scored it."""
    out = []
    for t, result in zip(trajectories, results, strict=True):
        recorded = {flag.get("detector") for flag in t.flags or [] if isinstance(flag, dict)}
        out.append({flag.detector for flag in result.flags} - recorded)
    return out


# --- reads -----------------------------------------------------------------------------------


class TrajectoryCounts(TypedDict):
    scored_count: int
    errored_count: int


if TYPE_CHECKING:  # django-stubs' type of an annotated model; not subscriptable like this at run time
    from django_stubs_ext import WithAnnotations

    BacktestRun = WithAnnotations[Run, TrajectoryCounts]


def backtest_runs_of(*, project: Project) -> "QuerySet[BacktestRun]":
    """The project's runs a backtest may rescore, newest first, each with its trajectory counts."""
    return (
        project.runs.select_related("reward_rule_version__rule")
        .annotate(
            scored_count=Count("trajectories", filter=Q(trajectories__outcome=Trajectory.Outcome.SCORED)),
            errored_count=Count("trajectories", filter=Q(trajectories__outcome=Trajectory.Outcome.ERRORED)),
        )
        .order_by("-created_at", "-pk")
    )


def backtest_run_of(*, rule: RewardRule, run_id: int) -> Run:
    """A run of the rule's project; any other id is a bad `run` (400), whether it exists elsewhere
    or not, so the answer says nothing about other projects."""
    run = Run.objects.select_related("reward_rule_version__rule").filter(pk=run_id).first()
    if run is None or run.project_id != rule.project_id:
        raise ValidationError({"run": f"no run {run_id} in the project of {rule.name}"})
    return run

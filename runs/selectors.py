"""Reads, always through the caller's role: what a user may see and do in which project.

Pages, REST and websockets all go through `project_for` and `role_of`, so a role means the same
everywhere. An object of a project the user is not in is reported as absent (404), not forbidden.
"""

from typing import TypedDict

from django.contrib.auth.models import User
from django.db.models import Count, Max, Min, QuerySet, Sum
from django.http import Http404

from core.roles import Permission, role_allows  # noqa: F401  (re-exported)
from projects.models import Project
from projects.selectors import require, visible_project_ids
from runs.hyperparameters import BEST_METRIC
from runs.models import (
    Checkpoint,
    MetricPoint,
    Run,
    RunEvent,
    Trajectory,
    TrajectoryStep,
)

# --- runs and their record -------------------------------------------------------------------


def runs_for(*, user: User) -> QuerySet[Run]:
    return Run.objects.filter(project_id__in=visible_project_ids(user=user))


def runs_of(*, project: Project) -> QuerySet[Run]:
    return project.runs.select_related("tier", "task_set_version__task_set").order_by("-created_at", "-pk")


def run_for(*, user: User, run_id: int, permission: str = Permission.VIEW) -> Run:
    run = (
        Run.objects.select_related(
            "project",
            "tier",
            "task_set_version__task_set",
            "reward_rule_version__rule",
            "parent",
            "parent_checkpoint",
        )
        .filter(pk=run_id)
        .first()
    )
    if run is None:
        raise Http404("no such run")
    require(user=user, project_id=run.project_id, permission=permission)
    return run


def queue_positions(*, project_ids: list[int]) -> dict[int, int]:
    """Each queued run's place in its project's queue (1 starts next), in admission's order."""
    queued = Run.objects.filter(project_id__in=project_ids, status=Run.Status.QUEUED).order_by(
        "project_id", "-priority", "created_at", "pk"
    )
    positions: dict[int, int] = {}
    last_project, place = None, 0
    for run_id, project_id in queued.values_list("pk", "project_id"):
        place = place + 1 if project_id == last_project else 1
        last_project = project_id
        positions[run_id] = place
    return positions


def events_of(*, run: Run, since: int | None = None, level: str | None = None) -> QuerySet[RunEvent]:
    events = run.events.all()
    if since is not None:
        events = events.filter(pk__gt=since)
    if level:
        events = events.filter(level=level)
    return events


def metric_names_of(*, run: Run) -> QuerySet:
    """One row a metric name: its point count, first and last step, smallest and largest value."""
    return (
        MetricPoint.objects.filter(run=run)
        .values("name")
        .annotate(count=Count("pk"), last_step=Max("step"), low=Min("value"), high=Max("value"))
        .order_by("name")
    )


def latest_metrics_of(*, run: Run) -> list[dict]:
    """Per metric name: the value at its newest step, beside its range (for the run page)."""
    rows = []
    for row in metric_names_of(run=run):
        latest = (
            MetricPoint.objects.filter(run=run, name=row["name"])
            .order_by("-step", "-pk")
            .values_list("value", flat=True)
            .first()
        )
        rows.append(row | {"value": latest})
    return rows


def heldout_trend_of(*, run: Run) -> dict | None:
    """The held-out pass rate at the run's start and at its newest evaluated step, once both are
    in (the outcome says whether the change means anything, once the run is finished)."""
    points = MetricPoint.objects.filter(run=run, name="heldout/pass_rate")
    start = points.filter(step=0).values_list("value", flat=True).first()
    latest = points.filter(step__gt=0).order_by("-step", "-pk").values_list("step", "value").first()
    if start is None or latest is None:
        return None
    return {"start": start, "step": latest[0], "latest": latest[1]}


def metric_series_of(
    *, run: Run, names: list[str] | None = None, since_step: int | None = None, max_points: int | None = None
) -> list[dict]:
    """The points of each metric, by step; past `max_points` a series is downsampled so that each
    bucket keeps its smallest and largest value, and a spike survives any zoom level."""
    points = MetricPoint.objects.filter(run=run)
    if names:
        points = points.filter(name__in=names)
    if since_step is not None:
        points = points.filter(step__gte=since_step)
    series: dict[str, list[tuple[int, float]]] = {}
    for name, step, value in points.order_by("name", "step", "pk").values_list("name", "step", "value"):
        series.setdefault(name, []).append((step, value))
    return [
        {
            "name": name,
            "count": len(values),
            "downsampled": max_points is not None and len(values) > max_points,
            "points": downsample(values, max_points),
        }
        for name, values in series.items()
    ]


class StepAxes(TypedDict):
    wall_seconds: dict[str, float]  # step -> seconds since the run's first metric point
    tokens: dict[str, int]  # step -> completion tokens learned up to and including it


def step_axes_of(*, run: Run, steps: set[int] | None = None) -> StepAxes:
    """Each learner step's place on the other x-axes charts offer: wall seconds since the run's
    first metric point, and the completion tokens learned from up to and including the step.
    `steps` limits the answer to the steps a (downsampled) series holds: a million-step run
    answers for its 2,000 points, not a million."""
    wall: dict[str, float] = {}
    if start := MetricPoint.objects.filter(run=run).aggregate(at=Min("created_at"))["at"]:
        points = MetricPoint.objects.filter(run=run)
        if steps is not None:  # read where the (run, name, step) index leads, not every row
            points = points.filter(step__in=steps, name__in=_names_of(run))
        firsts = points.values("step").annotate(at=Min("created_at")).order_by("step")
        wall = {str(row["step"]): round((row["at"] - start).total_seconds(), 3) for row in firsts}
    learned = (
        Trajectory.objects.filter(run=run, learned_in_step__isnull=False)
        .values("learned_in_step")
        .annotate(tokens=Sum("completion_tokens"))
        .order_by("learned_in_step")
    )
    tokens: dict[str, int] = {}
    total = 0
    for row in learned:
        total += row["tokens"] or 0
        if steps is None or row["learned_in_step"] in steps:
            tokens[str(row["learned_in_step"])] = total
    return {"wall_seconds": wall, "tokens": tokens}


def _names_of(run: Run) -> list[str]:
    return list(MetricPoint.objects.filter(run=run).values_list("name", flat=True).distinct())


def downsample(points: list[tuple[int, float]], max_points: int | None) -> list[tuple[int, float]]:
    """At most `max_points` (2 or more) of `points`, sorted by step: each of max_points // 2
    buckets of consecutive points keeps its minimum and its maximum, in step order (the first
    of equal values). Vectorised: a million points take a few milliseconds.

    >>> downsample([(0, 1.0), (1, 9.0), (2, 2.0), (3, 3.0), (4, -5.0), (5, 4.0)], 4)
    [(0, 1.0), (1, 9.0), (4, -5.0), (5, 4.0)]
    """
    if max_points is None or len(points) <= max_points:
        return points
    import numpy as np  # here, not at the top: a third of a web worker's start-up, for long series only

    buckets = max(max_points // 2, 1)
    size = -(-len(points) // buckets)  # ceiling: every point falls in a bucket
    values = np.fromiter((value for _, value in points), dtype=np.float64, count=len(points))
    rows = -(-len(points) // size)
    pad = rows * size - len(points)
    low = np.argmin(np.concatenate([values, np.full(pad, np.inf)]).reshape(rows, size), axis=1)
    high = np.argmax(np.concatenate([values, np.full(pad, -np.inf)]).reshape(rows, size), axis=1)
    offsets = np.arange(rows) * size
    kept = np.unique(np.concatenate([low + offsets, high + offsets]))
    return [points[i] for i in kept.tolist()]


def trajectories_for(*, user: User) -> QuerySet[Trajectory]:
    return Trajectory.objects.filter(run__project_id__in=visible_project_ids(user=user)).select_related(
        "item"
    )


def trajectories_filtered(
    trajectories: QuerySet[Trajectory],
    *,
    run: int | None = None,
    outcome: str | None = None,
    policy_version: int | None = None,
    min_reward: float | None = None,
    max_reward: float | None = None,
    step: int | None = None,
    batch: int | None = None,
    item: int | None = None,
    task: str | None = None,
    flagged: bool | None = None,
    flag: str | None = None,
    label: str | None = None,
    after: int | None = None,
) -> QuerySet[Trajectory]:
    """Filters of the trajectory browser and REST alike. `step` is the learner step that learned
    it, `task` the item's external id, `label` a review label ("unreviewed": none yet), `after`
    only those with a larger id (what a live page has not shown yet)."""
    wanted = {
        "run_id": run,
        "outcome": outcome,
        "policy_version": policy_version,
        "reward__gte": min_reward,
        "reward__lte": max_reward,
        "learned_in_step": step,
        "batch_id": batch,
        "item_id": item,
        "item__external_id": task,
        "pk__gt": after,
    }
    trajectories = trajectories.filter(
        **{key: value for key, value in wanted.items() if value not in (None, "")}
    )
    if flagged is not None:
        trajectories = trajectories.exclude(flags=[]) if flagged else trajectories.filter(flags=[])
    if flag:
        trajectories = trajectories.filter(flags__icontains=f'"{flag}"')
    if label == "unreviewed":
        trajectories = trajectories.filter(reviews__isnull=True)
    elif label:
        trajectories = trajectories.filter(reviews__label=label).distinct()
    return trajectories


def group_of(*, trajectory: Trajectory) -> QuerySet[Trajectory]:
    """Every completion sampled for the same prompt in the same batch, in sample order."""
    return Trajectory.objects.filter(
        run_id=trajectory.run_id, batch_id=trajectory.batch_id, item_id=trajectory.item_id
    ).order_by("sample_index", "pk")


def trajectory_for(*, user: User, trajectory_id: int, permission: str = Permission.VIEW) -> Trajectory:
    trajectory = Trajectory.objects.select_related("run__project", "item").filter(pk=trajectory_id).first()
    if trajectory is None:
        raise Http404("no such trajectory")
    require(user=user, project_id=trajectory.run.project_id, permission=permission)
    return trajectory


def steps_of(*, trajectory: Trajectory, index: int | None = None) -> QuerySet[TrajectoryStep]:
    steps = trajectory.steps.all()
    return steps if index is None else steps.filter(index=index)


def test_results_of(*, trajectory: Trajectory) -> list[dict]:
    """Each test's outcome where the trajectory's code was tested (its last step's tool result):
    name, passed, outcome, message, and expected and actual where the assertion exposed them."""
    last = trajectory.steps.order_by("-index").first()
    result = last.data().get("tool_result") if last is not None else None
    tests = result.get("tests") if isinstance(result, dict) else None
    return [test for test in tests if isinstance(test, dict)] if isinstance(tests, list) else []


def checkpoints_for(*, user: User) -> QuerySet[Checkpoint]:
    return Checkpoint.objects.filter(run__project_id__in=visible_project_ids(user=user))


def checkpoint_for(*, user: User, checkpoint_id: int, permission: str = Permission.VIEW) -> Checkpoint:
    checkpoint = Checkpoint.objects.select_related("run__project").filter(pk=checkpoint_id).first()
    if checkpoint is None:
        raise Http404("no such checkpoint")
    require(user=user, project_id=checkpoint.run.project_id, permission=permission)
    return checkpoint


def checkpoint_of_run_for(
    *, user: User, run_id: int, step: int, permission: str = Permission.VIEW
) -> Checkpoint:
    """The run's checkpoint at `step`, if the user's role in its project allows `permission`."""
    run = run_for(user=user, run_id=run_id, permission=permission)
    checkpoint = Checkpoint.objects.select_related("run__project").filter(run=run, step=step).first()
    if checkpoint is None:
        raise Http404(f"run {run_id} has no checkpoint at step {step}")
    return checkpoint


# --- checkpoints' held-out scores and the best one --------------------------------------------

HELDOUT_REWARD = "heldout/reward"


def checkpoint_scores_of(*, run: Run) -> dict[int, dict[str, float]]:
    """Each checkpoint's held-out figures by checkpoint id: the `heldout/*` points a run's
    evaluation wrote at its policy version's step ({} where it was not evaluated)."""
    versions = dict(run.checkpoints.values_list("policy_version", "pk"))
    scores: dict[int, dict[str, float]] = {pk: {} for pk in versions.values()}
    points = MetricPoint.objects.filter(run=run, name__startswith="heldout/", step__in=list(versions))
    for name, step, value in points.order_by("step", "pk").values_list("name", "step", "value"):
        scores[versions[step]][name] = value  # a rewritten point: the newest wins
    return scores


def best_metric_of(run: Run) -> str:
    """What names the run's best checkpoint (runs launched before the setting: the pass rate)."""
    return str(run.resolved.get("best_metric") or BEST_METRIC)


def checkpoint_best(run: Run) -> Checkpoint | None:
    """The checkpoint with the highest held-out `best_metric` (ties: the higher mean held-out
    reward, then the earlier step); None while no checkpoint has that figure."""
    best = checkpoint_best_id(run, checkpoint_scores_of(run=run))
    return None if best is None else run.checkpoints.get(pk=best)


def checkpoint_best_id(run: Run, scores: dict[int, dict[str, float]]) -> int | None:
    """The best checkpoint's id among `scores` (checkpoint_scores_of's answer), or None."""
    metric = best_metric_of(run)
    steps = dict(run.checkpoints.values_list("pk", "step"))
    ranked = [
        (values[metric], values.get(HELDOUT_REWARD, float("-inf")), -steps[pk], pk)
        for pk, values in scores.items()
        if metric in values
    ]
    return max(ranked)[-1] if ranked else None


def checkpoint_default(run: Run) -> Checkpoint | None:
    """What Export, Try and Train on reviews start from unless told otherwise: the best
    checkpoint, else (nothing evaluated yet) the newest."""
    return checkpoint_best(run) or run.checkpoints.order_by("-step").first()


def checkpoint_rows_of(*, run: Run, limit: int) -> list[dict]:
    """The run page's checkpoint table, newest first: each checkpoint with its held-out scores
    (`heldout`, {} where not evaluated), pass rate and mean reward (None: not evaluated), and
    whether it is the best."""
    scores = checkpoint_scores_of(run=run)
    best = checkpoint_best_id(run, scores)
    return [
        {
            "checkpoint": checkpoint,
            "heldout": scores[checkpoint.pk],
            "pass_rate": scores[checkpoint.pk].get("heldout/pass_rate"),
            "reward": scores[checkpoint.pk].get(HELDOUT_REWARD),
            "best": checkpoint.pk == best,
        }
        for checkpoint in run.checkpoints.order_by("-step")[:limit]
    ]

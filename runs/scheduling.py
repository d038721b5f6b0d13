"""Admission: which queued runs start now, within quotas of what active runs hold.

A run holds, while active (starting, running, pausing, cancelling), one learner worker per process
of its learner (`gpu_workers`): each rank holds one device, a GPU on a GPU host. Rollout workers
are not held by any run: they are a pool whose batches every active run's steps share in turn, so
no quota counts them. Each project has quotas of active runs and of GPU workers (its
ProjectQuota, else FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS and FLYWHEEL_PROJECT_MAX_GPU_WORKERS), and each
user quotas across projects (FLYWHEEL_USER_MAX_ACTIVE_RUNS, FLYWHEEL_USER_MAX_GPU_WORKERS; 0 for
either GPU quota or the user's runs: no limit).

Within a project, runs start in order of priority (higher first), then age, and the line holds: a
run that does not fit the project's quotas waits, and the runs behind it wait too (a small run
never overtakes a larger one above it, which would otherwise wait for ever). Two waits do not hold
the line: a run whose creator's quota is in use (the next user's run may start), and a run that
needs more GPU workers than a quota allows at all (it can never start until an owner or operator
raises it). Each queued run says why it waits (`queue_reason`), from the same walk admission does.
"""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial

from django.conf import settings
from django.db import transaction

from core.exceptions import StateError
from runs import tasks
from runs.learners import algorithm_get
from runs.lifecycle import run_transition
from runs.models import ProjectQuota, Run

S = Run.Status
BUSY = (S.STARTING, S.RUNNING, S.PAUSING, S.CANCELLING)
ORDER = ("-priority", "created_at", "pk")  # admission's order within a project
NEXT = "next to start when the scheduler runs (every few seconds)"


def gpu_workers(run: Run) -> int:
    """The learner workers (GPUs on a GPU host) the run holds while active: one per process of its
    learner, its `learner_processes` hyperparameter else FLYWHEEL_LEARNER_PROCESSES, for an
    algorithm registered as distributed; one for any other."""
    algorithm = algorithm_get(run.method)
    if algorithm is None or not algorithm.distributed:
        return 1
    return int((run.resolved or {}).get("learner_processes") or 0) or settings.FLYWHEEL_LEARNER_PROCESSES


@dataclass(frozen=True)
class Limits:
    """A project's quotas: active runs, and GPU workers (0: no limit); `default_*`: the server's
    settings, not set for the project."""

    active_runs: int
    gpu_workers: int
    default_active_runs: bool = True
    default_gpu_workers: bool = True


@dataclass
class Held:
    """What active runs hold: how many runs, how many GPU workers."""

    runs: int = 0
    gpu_workers: int = 0

    def add(self, workers: int) -> None:
        self.runs += 1
        self.gpu_workers += workers


@dataclass
class Wait:
    """Why a queued run waits, and whether the runs behind it in its project wait for it."""

    reason: str
    holds_line: bool


@dataclass
class Plan:
    """A project's queue walked in admission's order: each queued run and why it waits (None: it
    starts now, or at the scheduler's next tick)."""

    limits: Limits
    held: Held
    queue: list[tuple[Run, int, str | None]] = field(default_factory=list)


def project_limits(project_ids: Iterable[int]) -> dict[int, Limits]:
    rows = ProjectQuota.objects.filter(project_id__in=list(project_ids))
    chosen = {row.project_id: row for row in rows}
    limits = {}
    for project_id in project_ids:
        row = chosen.get(project_id)
        runs = None if row is None else row.max_active_runs
        workers = None if row is None else row.max_gpu_workers
        limits[project_id] = Limits(
            active_runs=settings.FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS if runs is None else runs,
            gpu_workers=settings.FLYWHEEL_PROJECT_MAX_GPU_WORKERS if workers is None else workers,
            default_active_runs=runs is None,
            default_gpu_workers=workers is None,
        )
    return limits


def project_limit(project_id: int) -> int:
    """The project's quota of active runs."""
    return project_limits([project_id])[project_id].active_runs


def held_now() -> tuple[dict[int, Held], dict[int, Held]]:
    """What active runs hold now, by project and by creator."""
    by_project: dict[int, Held] = defaultdict(Held)
    by_user: dict[int, Held] = defaultdict(Held)
    active = Run.objects.filter(status__in=BUSY).only(
        "pk", "project_id", "created_by_id", "method", "resolved"
    )
    for run in active:
        workers = gpu_workers(run)
        by_project[run.project_id].add(workers)
        if run.created_by_id is not None:
            by_user[run.created_by_id].add(workers)
    return by_project, by_user


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def wait_of(run: Run, need: int, limits: Limits, project: Held, user: Held | None) -> Wait | None:
    """Why `run`, needing `need` GPU workers, cannot start beside what its project and its creator
    hold; None when it fits."""
    user_runs, user_workers = settings.FLYWHEEL_USER_MAX_ACTIVE_RUNS, settings.FLYWHEEL_USER_MAX_GPU_WORKERS
    if limits.gpu_workers and need > limits.gpu_workers:
        quota = _plural(limits.gpu_workers, "GPU worker")
        return Wait(f"it needs {need} GPU workers, more than the project's quota of {quota}", False)
    if user_workers and need > user_workers:
        quota = _plural(user_workers, "GPU worker")
        return Wait(f"it needs {need} GPU workers, more than a user's quota of {quota}", False)
    if project.runs >= limits.active_runs:
        quota = _plural(limits.active_runs, "active run")
        return Wait(f"the project's quota of {quota} is in use ({project.runs} active)", True)
    if limits.gpu_workers and project.gpu_workers + need > limits.gpu_workers:
        quota = _plural(limits.gpu_workers, "GPU worker")
        held = f"{project.gpu_workers} held" + ("" if need == 1 else f", it needs {need}")
        return Wait(f"the project's quota of {quota} is in use ({held})", True)
    user = user or Held()
    if user_runs and user.runs >= user_runs:
        return Wait(f"its creator's quota of {_plural(user_runs, 'active run')} is in use", False)
    if user_workers and user.gpu_workers + need > user_workers:
        quota = _plural(user_workers, "GPU worker")
        return Wait(f"its creator's quota of {quota} is in use ({user.gpu_workers} held)", False)
    return None


def plan(queued: list[Run], limits: Limits, project: Held, users: dict[int, Held]) -> Plan:
    """Walk a project's queued runs (in admission's order) as admission does: each that fits
    starts and holds its workers; the first that does not fit the project's quotas holds the line.
    `project` and `users` are updated with what the starting runs would hold."""
    walked = Plan(limits=limits, held=Held(project.runs, project.gpu_workers))
    line: tuple[Run, str] | None = None
    for run in queued:
        need = gpu_workers(run)
        user = users.get(run.created_by_id) if run.created_by_id is not None else None
        wait = wait_of(run, need, limits, walked.held, user)
        if line is not None and (wait is None or wait.holds_line):
            walked.queue.append(
                (run, need, f"behind {line[0].name} (higher in the queue), which waits: {line[1]}")
            )
            continue
        if wait is not None:
            walked.queue.append((run, need, wait.reason))
            if wait.holds_line:
                line = (run, wait.reason)
            continue
        walked.queue.append((run, need, None))
        walked.held.add(need)
        if run.created_by_id is not None:
            users.setdefault(run.created_by_id, Held()).add(need)
    return walked


def _queued(project_ids: Iterable[int]) -> dict[int, list[Run]]:
    queues: dict[int, list[Run]] = defaultdict(list)
    for run in Run.objects.filter(project_id__in=list(project_ids), status=S.QUEUED).order_by(*ORDER):
        queues[run.project_id].append(run)
    return queues


def plans(project_ids: Iterable[int]) -> dict[int, Plan]:
    """Each project's queue as admission would walk it now, in a few queries however many."""
    project_ids = sorted(set(project_ids))
    limits, queues = project_limits(project_ids), _queued(project_ids)
    by_project, by_user = held_now()
    return {
        project_id: plan(queues.get(project_id, []), limits[project_id], by_project[project_id], by_user)
        for project_id in project_ids
    }


def runs_admit() -> list[int]:
    """Claim queued runs within each project's and each user's quotas; return the ids started."""
    started = []
    project_ids = Run.objects.filter(status=S.QUEUED).values_list("project_id", flat=True).distinct()
    for project_id in sorted(project_ids):
        started += _admit_project(project_id)
    return started


def _admit_project(project_id: int) -> list[int]:
    started = []
    with transaction.atomic():
        walked = plans([project_id])[project_id]
        for run, _, reason in walked.queue:
            if reason is not None:
                continue
            try:
                run_transition(run, allowed=(S.QUEUED,), to=S.STARTING, message="starting")
            except StateError:  # another scheduler took it first: harmless
                continue
            started.append(run.pk)
            transaction.on_commit(partial(_start_learner, run.pk))
    return started


def queue_reasons(runs: list[Run]) -> dict[int, str]:
    """Why each queued run of `runs` has not started, in words, in a few queries however many."""
    queued = {run.pk for run in runs if run.status == S.QUEUED}
    if not queued:
        return {}
    walked = plans({run.project_id for run in runs if run.pk in queued})
    return {
        run.pk: reason or NEXT
        for project in walked.values()
        for run, _, reason in project.queue
        if run.pk in queued
    }


def queue_reason(run: Run) -> str | None:
    """Why a queued run has not started, in words; None when it is not queued."""
    return queue_reasons([run]).get(run.pk)


UNSET = object()  # a quota field not given: left as it is


def quota_set(*, project_id: int, max_active_runs: object = UNSET, max_gpu_workers: object = UNSET) -> None:
    """Set a project's quotas: the fields given; None returns one to the server's default. Runs
    start at once where the new quotas leave room."""
    changes = {
        name: value
        for name, value in (("max_active_runs", max_active_runs), ("max_gpu_workers", max_gpu_workers))
        if value is not UNSET
    }
    quota, _ = ProjectQuota.objects.update_or_create(project_id=project_id, defaults=changes)
    if quota.max_active_runs is None and quota.max_gpu_workers is None:
        quota.delete()  # both back to the defaults: the project has no quota of its own
    transaction.on_commit(lambda: tasks.runs_schedule.delay())


def _start_learner(run_id: int) -> None:
    tasks.learner_supervise.delay(run_id)


@dataclass
class ProjectQueue:
    """One project on the queue page: its quotas, what its active runs hold, and its queue."""

    project_id: int
    limits: Limits
    held: Held
    active: list[tuple[Run, int]]
    queue: list[tuple[int, Run, int, str]]  # position, run, GPU workers it needs, why it waits


def queue_overview(project_ids: Iterable[int]) -> list[ProjectQueue]:
    """The projects among `project_ids` with an active or queued run, for the queue page."""
    project_ids = sorted(set(project_ids))
    walked = plans(project_ids)
    by_project, _ = held_now()
    active: dict[int, list[tuple[Run, int]]] = defaultdict(list)
    busy = Run.objects.filter(project_id__in=project_ids, status__in=BUSY).order_by(*ORDER)
    for run in busy.select_related("created_by"):
        active[run.project_id].append((run, gpu_workers(run)))
    return [
        ProjectQueue(
            project_id=project_id,
            limits=walked[project_id].limits,
            held=by_project.get(project_id, Held()),
            active=active[project_id],
            queue=[
                (position, run, need, reason or NEXT)
                for position, (run, need, reason) in enumerate(walked[project_id].queue, start=1)
            ],
        )
        for project_id in project_ids
        if active[project_id] or walked[project_id].queue
    ]

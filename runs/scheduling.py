"""Admission: which queued runs start now. Each project has a quota of active runs (its
ProjectQuota, else FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS), and each user may have at most
FLYWHEEL_USER_MAX_ACTIVE_RUNS active across projects (0: no limit); within those, runs start in
order of priority (higher first), then age. A queued run says why it waits (`queue_reason`)."""

from collections import Counter
from functools import partial

from django.conf import settings
from django.db import transaction

from core.exceptions import StateError
from runs import tasks
from runs.lifecycle import run_transition
from runs.models import ProjectQuota, Run

S = Run.Status
BUSY = (S.STARTING, S.RUNNING, S.PAUSING, S.CANCELLING)


def project_limit(project_id: int) -> int:
    quota = (
        ProjectQuota.objects.filter(project_id=project_id).values_list("max_active_runs", flat=True).first()
    )
    return settings.FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS if quota is None else quota


def _busy_by_user() -> Counter:
    return Counter(Run.objects.filter(status__in=BUSY).values_list("created_by_id", flat=True))


def runs_admit() -> list[int]:
    """Claim queued runs within each project's and each user's quota; return the ids started."""
    started = []
    project_ids = Run.objects.filter(status=S.QUEUED).values_list("project_id", flat=True).distinct()
    for project_id in sorted(project_ids):
        started += _admit_project(project_id)
    return started


def _admit_project(project_id: int) -> list[int]:
    started = []
    user_limit = settings.FLYWHEEL_USER_MAX_ACTIVE_RUNS
    with transaction.atomic():
        busy = Run.objects.filter(project_id=project_id, status__in=BUSY).count()
        room = project_limit(project_id) - busy
        by_user = _busy_by_user()
        queued = Run.objects.filter(project_id=project_id, status=S.QUEUED).order_by(
            "-priority", "created_at", "pk"
        )
        for run in queued:
            if room <= 0:
                break
            if user_limit and run.created_by_id is not None and by_user[run.created_by_id] >= user_limit:
                continue  # its owner's quota is in use: the next run in line may start
            try:
                run_transition(run, allowed=(S.QUEUED,), to=S.STARTING, message="starting")
            except StateError:  # another scheduler took it first: harmless
                continue
            room -= 1
            by_user[run.created_by_id] += 1
            started.append(run.pk)
            transaction.on_commit(partial(_start_learner, run.pk))
    return started


def queue_reasons(runs: list[Run]) -> dict[int, str]:
    """Why each queued run of `runs` has not started, in words, in a few queries however many."""
    queued = [run for run in runs if run.status == S.QUEUED]
    if not queued:
        return {}
    project_ids = {run.project_id for run in queued}
    quotas = ProjectQuota.objects.filter(project_id__in=project_ids)
    limits = {project_id: settings.FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS for project_id in project_ids}
    limits |= dict(quotas.values_list("project_id", "max_active_runs"))
    active = Run.objects.filter(status__in=BUSY)
    busy = Counter(active.filter(project_id__in=project_ids).values_list("project_id", flat=True))
    user_limit = settings.FLYWHEEL_USER_MAX_ACTIVE_RUNS
    creators = {run.created_by_id for run in queued if run.created_by_id is not None}
    mine: Counter = Counter()
    if user_limit and creators:
        mine = Counter(active.filter(created_by_id__in=creators).values_list("created_by_id", flat=True))
    return {
        run.pk: _reason(limits[run.project_id], busy[run.project_id], user_limit, mine[run.created_by_id])
        for run in queued
    }


def _reason(limit: int, busy: int, user_limit: int, mine: int) -> str:
    if busy >= limit:
        runs = "run" if limit == 1 else "runs"
        return f"the project's quota of {limit} active {runs} is in use ({busy} active)"
    if user_limit and mine >= user_limit:
        runs = "run" if user_limit == 1 else "runs"
        return f"its creator's quota of {user_limit} active {runs} is in use"
    return "next to start when the scheduler runs (every few seconds)"


def queue_reason(run: Run) -> str | None:
    """Why a queued run has not started, in words; None when it is not queued."""
    return queue_reasons([run]).get(run.pk)


def quota_set(*, project_id: int, max_active_runs: int | None) -> None:
    """Set a project's quota of active runs; None returns it to FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS.
    Runs start at once where the new quota leaves room."""
    if max_active_runs is None:
        ProjectQuota.objects.filter(project_id=project_id).delete()
    else:
        ProjectQuota.objects.update_or_create(
            project_id=project_id, defaults={"max_active_runs": max_active_runs}
        )
    transaction.on_commit(lambda: tasks.runs_schedule.delay())


def _start_learner(run_id: int) -> None:
    tasks.learner_supervise.delay(run_id)

"""Admission: which queued runs start now. Per project, at most FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS
runs are active; the others wait in order of priority (higher first), then age."""

from django.conf import settings
from django.db import transaction

from core.exceptions import StateError
from runs import tasks
from runs.lifecycle import run_transition
from runs.models import Run

S = Run.Status
BUSY = (S.STARTING, S.RUNNING, S.PAUSING, S.CANCELLING)


def runs_admit() -> list[int]:
    """Claim queued runs within each project's quota; return the ids that were started."""
    started = []
    project_ids = Run.objects.filter(status=S.QUEUED).values_list("project_id", flat=True).distinct()
    for project_id in list(project_ids):
        started += _admit_project(project_id)
    return started


def _admit_project(project_id: int) -> list[int]:
    started = []
    with transaction.atomic():
        busy = Run.objects.filter(project_id=project_id, status__in=BUSY).count()
        room = settings.FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS - busy
        queued = Run.objects.filter(project_id=project_id, status=S.QUEUED).order_by(
            "-priority", "created_at", "pk"
        )
        for run in queued[: max(room, 0)]:
            try:
                run_transition(run, allowed=(S.QUEUED,), to=S.STARTING, message="starting")
            except StateError:  # another scheduler took it first: harmless
                continue
            started.append(run.pk)
            transaction.on_commit(lambda run_id=run.pk: _start_learner(run_id))
    return started


def _start_learner(run_id: int) -> None:
    tasks.learner_supervise.delay(run_id)

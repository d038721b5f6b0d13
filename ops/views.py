"""The operations page: the overview rendered on the server (escaped), refreshed in place by
static/ops.js every few seconds, as the runs list refreshes its section."""

from datetime import datetime

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.timesince import timesince
from django.views.decorators.http import require_GET

from core.callers import caller
from ops import selectors
from ops.api import REFUSED

REFRESH_SECONDS = 2
KIND_LABELS = {
    "task_failed": "task failed",
    "worker_restarted": "worker restarted",
    "run_failed": "run failed",
    "learner_restarted": "learner restarted",
}


@login_required
@require_GET
def ops_page(request: HttpRequest) -> HttpResponse:
    if not selectors.ops_may_view(caller(request)):
        raise PermissionDenied(REFUSED)
    overview = shown(selectors.ops_overview(user=caller(request)))
    context = {"ops": overview, "refresh_seconds": REFRESH_SECONDS}
    return render(request, "ops/ops.html", context)


def shown(overview: dict) -> dict:
    """The overview with its timestamps as datetimes and ages in words ("4 s", "3 minutes")."""
    for worker in overview["workers"]:
        worker["started_at"] = _datetime(worker.get("started_at"))
        worker["last_seen_at"] = _datetime(worker.get("last_seen_at"))
        worker["started_ago"] = ago(worker["started_at"])
        worker["last_seen_ago"] = ago(worker["last_seen_at"])
        for task in worker["tasks"]:
            task["since"] = _datetime(task.get("since"))
            task["for"] = ago(task["since"])
    for failure in overview["failures"]:
        failure["at"] = _datetime(failure.get("at"))
        failure["ago"] = ago(failure["at"])
        failure["label"] = KIND_LABELS.get(failure["kind"], failure["kind"])
    return overview


def ago(moment: datetime | None) -> str:
    """Seconds while it is under a minute (a heartbeat's age matters by the second), else words."""
    if moment is None:
        return ""
    seconds = (timezone.now() - moment).total_seconds()
    return f"{max(0, round(seconds))} s" if seconds < 60 else timesince(moment, depth=1)


def _datetime(value: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if value else None
    except ValueError:
        return None


def ops_link(request: HttpRequest) -> dict:
    """For the navigation: whether to show the operations link (asked only when a page shows it)."""
    return {"may_operate": lambda: selectors.ops_may_view(caller(request))}

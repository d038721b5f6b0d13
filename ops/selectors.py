"""Reads for the operations page, its REST twin and the Prometheus gauges: the workers' heartbeats
(ops/heartbeats.py), the broker's queues, Redis and the database, recent failures and restarts.

Workers are shared by every project, so who may look (`ops_may_view`) is every project owner and
staff; what they see differs only where a run is named: staff see every run, an owner sees the runs
of the projects they belong to, and "a run of another project" for the rest (no name, no error
message, which may quote a task).
"""

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db import connection
from django.utils import timezone
from redis import Redis

from core.roles import Role
from ops.heartbeats import (
    ALIVE_KEY,
    EVENTS_KEY,
    RECORD_KEY,
    SANDBOX_PIDS_KEY,
    SANDBOXES_KEY,
    SENT_AT_HEADER,
    WORKERS_KEY,
    redis_client,
)
from projects.models import Membership
from runs.models import RolloutBatch, Run, RunEvent

FAILURES_SHOWN = 50
FAILURES_SINCE = timedelta(hours=24)
PRIORITY_SEPARATOR = "\x06\x16"  # kombu's Redis transport: a queue's priority levels are lists of their own
PRIORITY_STEPS = (0, 3, 6, 9)
# Tasks whose first argument names a run, or a rollout batch of one (a task takes ids, never payloads).
RUN_TASKS = ("workers.learner.supervise", "workers.eval.policy")
BATCH_TASKS = ("workers.rollout.batch",)
SANDBOX_COUNTS = ("live", "busy", "idle", "replaced")


def ops_may_view(user: User | AnonymousUser) -> bool:
    """Staff, and the owners of any project: the people who run Flywheel for a team."""
    if not user.is_authenticated:
        return False
    return user.is_staff or Membership.objects.filter(user=user, role=Role.OWNER).exists()


@dataclass(frozen=True)
class Viewer:
    """Which runs a caller may see named: all (staff) or those of their projects."""

    everything: bool
    project_ids: frozenset[int]

    @classmethod
    def of(cls, user: User) -> "Viewer":
        if user.is_staff:
            return cls(everything=True, project_ids=frozenset())
        projects = Membership.objects.filter(user=user).values_list("project_id", flat=True)
        return cls(everything=False, project_ids=frozenset(projects))

    def sees(self, project_id: int | None) -> bool:
        return self.everything or project_id in self.project_ids


# --- health ------------------------------------------------------------------------------------


def database_health() -> dict:
    started = time.perf_counter()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - health reports any failure as text
        return {"ok": False, "latency_ms": None, "vendor": connection.vendor, "detail": _failure(exc)}
    latency = round((time.perf_counter() - started) * 1000, 2)
    return {"ok": True, "latency_ms": latency, "vendor": connection.vendor, "detail": "ok"}


def redis_health(client: Redis) -> dict:
    started = time.perf_counter()
    try:
        client.ping()
        latency = round((time.perf_counter() - started) * 1000, 2)
        info = client.info()
    except Exception as exc:  # noqa: BLE001
        detail = _failure(exc)
        return {"ok": False, "latency_ms": None, "detail": detail, "version": "", "used_memory_bytes": None}
    return {
        "ok": True,
        "latency_ms": latency,
        "detail": "ok",
        "version": str(info.get("redis_version", "")),
        "used_memory_bytes": int(info.get("used_memory", 0)),
    }


def _failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


# --- workers -----------------------------------------------------------------------------------


def _text(value: bytes | str) -> str:
    """A Redis reply as text (the client answers bytes unless told to decode)."""
    return value.decode() if isinstance(value, bytes) else value


def workers_read(client: Redis) -> list[dict]:
    """Every worker with a record, alive or not, by name; forgetting those whose records lapsed."""
    names = sorted(_text(name) for name in client.smembers(WORKERS_KEY))
    if not names:
        return []
    pipe = client.pipeline()
    for name in names:
        pipe.get(RECORD_KEY.format(name=name))
        pipe.exists(ALIVE_KEY.format(name=name))
    replies = pipe.execute()
    workers, lapsed = [], []
    for index, name in enumerate(names):
        raw, alive = replies[2 * index], replies[2 * index + 1]
        if raw is None:
            lapsed.append(name)
            continue
        record = json.loads(raw)
        record["state"] = "alive" if alive else ("stopped" if record.get("state") == "stopped" else "gone")
        if record["state"] != "alive":
            record["tasks"] = []  # what it ran when last seen is not running any more
        record["last_seen_at"] = record.pop("beat_at", None)
        record["sandboxes"] = sandboxes_read(client, name) if alive else _no_sandboxes()
        workers.append(record)
    if lapsed:
        client.srem(WORKERS_KEY, *lapsed)
    return workers


def sandboxes_read(client: Redis, worker: str) -> dict[str, int]:
    """The sum of the worker's processes' pool counts (a process that died has dropped out)."""
    pids = sorted(_text(pid) for pid in client.smembers(SANDBOX_PIDS_KEY.format(name=worker)))
    total = _no_sandboxes()
    if not pids:
        return total
    values = client.mget([SANDBOXES_KEY.format(name=worker, pid=pid) for pid in pids])
    gone = [pid for pid, value in zip(pids, values, strict=True) if value is None]
    for value in values:
        if value is not None:
            counts = json.loads(value)
            for key in SANDBOX_COUNTS:
                total[key] += int(counts.get(key, 0))
    if gone:
        client.srem(SANDBOX_PIDS_KEY.format(name=worker), *gone)
    return total


def _no_sandboxes() -> dict[str, int]:
    return dict.fromkeys(SANDBOX_COUNTS, 0)


# --- queues ------------------------------------------------------------------------------------


def queue_keys(queue: str) -> list[str]:
    return [queue if step == 0 else f"{queue}{PRIORITY_SEPARATOR}{step}" for step in PRIORITY_STEPS]


def queues_read(client: Redis, workers: list[dict]) -> list[dict]:
    """Each queue's waiting messages, the age of the oldest, and its workers alive and busy."""
    names = list(settings.CELERY_WORKER_QUEUES)
    names += sorted({q for worker in workers for q in worker.get("queues", [])} - set(names))
    pipe = client.pipeline()
    for name in names:
        for key in queue_keys(name):
            pipe.llen(key)
            pipe.lindex(key, -1)  # kombu pushes on the left and takes from the right: the oldest
    replies = pipe.execute()
    now = time.time()
    queues, per_queue = [], 2 * len(PRIORITY_STEPS)
    for index, name in enumerate(names):
        chunk = replies[index * per_queue : (index + 1) * per_queue]
        waiting = sum(chunk[0::2])
        sent_at = (_sent_at(message) for message in chunk[1::2] if message is not None)
        sent = [value for value in sent_at if value is not None]
        serving = [w for w in workers if w["state"] == "alive" and name in w.get("queues", [])]
        queues.append(
            {
                "name": name,
                "waiting": waiting,
                "oldest_wait_seconds": round(max(0.0, now - min(sent)), 1) if sent else None,
                "workers_alive": len(serving),
                "workers_busy": sum(1 for w in serving if w["tasks"]),
                "running": sum(len(w["tasks"]) for w in serving),
            }
        )
    return queues


def _sent_at(message: bytes) -> float | None:
    try:
        value = json.loads(message).get("headers", {}).get(SENT_AT_HEADER)
    except (ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) else None


# --- what runs where, and what failed -----------------------------------------------------------


def runs_of_tasks(entries: Iterable[dict]) -> dict[tuple[str, int], Run]:
    """(task name, first id) -> the run it works for, for tasks that work for a run."""
    run_ids, batch_ids = set(), set()
    for entry in entries:
        first = (entry.get("args") or [None])[0]
        if first is None:
            continue
        if entry.get("task") in RUN_TASKS:
            run_ids.add(first)
        elif entry.get("task") in BATCH_TASKS:
            batch_ids.add(first)
    batches = dict(RolloutBatch.objects.filter(pk__in=batch_ids).values_list("pk", "run_id"))
    runs = Run.objects.only("id", "name", "project_id").in_bulk(run_ids | set(batches.values()))
    found = {(task, run_id): runs[run_id] for task in RUN_TASKS for run_id in run_ids if run_id in runs}
    for batch_id, run_id in batches.items():
        for task in BATCH_TASKS:
            found[(task, batch_id)] = runs[run_id]
    return found


def run_summary(run: Run | None, viewer: Viewer) -> dict | None:
    if run is None:
        return None
    if not viewer.sees(run.project_id):
        return {"id": None, "name": "a run of another project", "project": None, "hidden": True}
    return {"id": run.pk, "name": run.name, "project": run.project_id, "hidden": False}


def _run_for(entry: dict, runs: dict[tuple[str, int], Run]) -> Run | None:
    first = (entry.get("args") or [None])[0]
    return runs.get((entry.get("task", ""), first)) if first is not None else None


def tasks_shown(workers: list[dict], viewer: Viewer) -> None:
    """Each running task as the viewer may see it: its kind, since when, and its run if visible."""
    runs = runs_of_tasks(task for worker in workers for task in worker["tasks"])
    for worker in workers:
        shown = []
        for task in worker["tasks"]:
            since = task.get("since")
            shown.append(
                {
                    "task": task.get("task", ""),
                    "since": _iso(since) if since else None,
                    "pid": task.get("pid"),
                    "run": run_summary(_run_for(task, runs), viewer),
                }
            )
        worker["tasks"] = shown


def failures_read(client: Redis | None, viewer: Viewer) -> list[dict]:
    """Recent task failures and worker restarts (Redis), failed runs and learner restarts (the
    record), newest first."""
    events = [json.loads(raw) for raw in client.lrange(EVENTS_KEY, 0, FAILURES_SHOWN - 1)] if client else []
    runs = runs_of_tasks(event for event in events if event.get("kind") == "task_failed")
    shown = []
    for event in events:
        run = _run_for(event, runs) if event.get("kind") == "task_failed" else None
        summary = run_summary(run, viewer)
        # Only a task of a run the viewer may see, or any task for staff, shows what it said.
        private = event.get("kind") == "task_failed" and not (
            viewer.everything or (run is not None and viewer.sees(run.project_id))
        )
        message = event.get("message", "")
        if private:
            message = f"{event.get('error', 'error')} (details are shown to members of the run's project)"
        elif event.get("error"):
            message = f"{event['error']}: {message}"
        shown.append(
            {
                "at": event.get("at"),
                "kind": event.get("kind", ""),
                "worker": event.get("worker", ""),
                "task": event.get("task", ""),
                "message": message,
                "run": summary,
            }
        )
    shown += _record_failures(viewer)
    shown.sort(key=lambda item: item["at"] or "", reverse=True)
    return shown[:FAILURES_SHOWN]


def _record_failures(viewer: Viewer) -> list[dict]:
    since = timezone.now() - FAILURES_SINCE
    failed = Run.objects.filter(status=Run.Status.FAILED, updated_at__gte=since)
    restarts = RunEvent.objects.filter(kind="restart", created_at__gte=since).select_related("run")
    if not viewer.everything:
        failed = failed.filter(project_id__in=viewer.project_ids)
        restarts = restarts.filter(run__project_id__in=viewer.project_ids)
    items = [
        {
            "at": (run.finished_at or run.updated_at).isoformat(),
            "kind": "run_failed",
            "worker": "",
            "task": "",
            "message": _first_line(run.error),
            "run": run_summary(run, viewer),
        }
        for run in failed.order_by("-updated_at")[:FAILURES_SHOWN]
    ]
    items += [
        {
            "at": event.created_at.isoformat(),
            "kind": "learner_restarted",
            "worker": "",
            "task": "",
            "message": event.message[:500],
            "run": run_summary(event.run, viewer),
        }
        for event in restarts.order_by("-created_at")[:FAILURES_SHOWN]
    ]
    return items


def _first_line(error: object) -> str:
    """A failed run's reason without the learner's log that follows it (the run page shows that)."""
    message = error.get("message", "") if isinstance(error, dict) else str(error or "")
    return (message.strip().splitlines() or ["failed"])[0][:500]


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat()


# --- everything at once -------------------------------------------------------------------------


def cluster_read() -> dict:
    """The cluster as it is, for anyone allowed: no run named yet (`ops_overview` adds what the
    viewer may see; the Prometheus gauges use this as it is)."""
    client = redis_client()
    redis = redis_health(client)
    workers = workers_read(client) if redis["ok"] else []
    queues = queues_read(client, workers) if redis["ok"] else []
    alive = [worker for worker in workers if worker["state"] == "alive"]
    sandboxes = _no_sandboxes()
    for worker in alive:
        for key in SANDBOX_COUNTS:
            sandboxes[key] += worker["sandboxes"][key]
    database = database_health()
    served = {queue["name"]: queue["workers_alive"] for queue in queues}
    healthy = redis["ok"] and database["ok"] and all(served.get(q) for q in settings.CELERY_WORKER_QUEUES)
    return {
        "status": "ok" if healthy else "degraded",
        "generated_at": timezone.now().isoformat(),
        "redis": redis,
        "database": database,
        "queues": queues,
        "workers": workers,
        "sandboxes": sandboxes,
        "client": client if redis["ok"] else None,
    }


def ops_overview(*, user: User) -> dict:
    viewer = Viewer.of(user)
    cluster = cluster_read()
    client = cluster.pop("client")
    tasks_shown(cluster["workers"], viewer)
    cluster["failures"] = failures_read(client, viewer)
    cluster["scope"] = "all" if viewer.everything else "own_projects"
    return cluster

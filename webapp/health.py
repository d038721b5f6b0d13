"""/healthz: the database, Redis, the live Celery workers of each queue, and whether the sandboxes
of each rollout and eval worker work (each checks them when it starts: `manage.py check_sandboxes`)."""

import json
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.http import HttpRequest, JsonResponse
from redis import Redis

from core.ops_access import ops_allowed
from webapp.celery import SAMPLING_QUEUES
from webapp.celery import app as celery_app

WORKER_PROBE_SECONDS = 1.0
WORKER_CACHE_SECONDS = 5
SANDBOX_CHECK_KEY = "flywheel:sandbox-check:{worker}"
SANDBOX_CHECK_KEEP_SECONDS = 30 * 24 * 3600  # only live workers' checks are shown; this drops the rest


def database_ok() -> tuple[bool, str]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True, connection.vendor
    except Exception as exc:  # noqa: BLE001 - health reports any failure as text
        return False, f"{type(exc).__name__}: {exc}"


def redis_ok() -> tuple[bool, str]:
    try:
        redis_client().ping()
        return True, "ok"
    except Exception as exc:  # noqa: BLE001
        return False, f"{type(exc).__name__}: {exc}"


def workers_by_queue() -> dict[str, list[str]]:
    """Ask every worker which queues it consumes (broadcast over Redis; cached a few seconds)."""
    cached = cache.get("healthz:workers")
    if cached is not None:
        return cached
    # A connection of its own each time: a pooled one may be a socket that a restarted Redis closed.
    with celery_app.connection_for_write() as connection:
        inspect = celery_app.control.inspect(timeout=WORKER_PROBE_SECONDS, connection=connection)
        replies = inspect.active_queues() or {}
    queues: dict[str, list[str]] = {name: [] for name in settings.CELERY_WORKER_QUEUES}
    for worker, consumed in replies.items():
        for queue in consumed:
            queues.setdefault(queue["name"], []).append(worker)
    cache.set("healthz:workers", queues, WORKER_CACHE_SECONDS)
    return queues


def redis_client() -> Redis:
    return Redis.from_url(settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1)


def sandbox_check_record(worker: str, checks: list[dict]) -> None:
    """What a worker's sandbox check found, for /healthz to show while the worker lives."""
    value = json.dumps({"ok": all(check["ok"] for check in checks), "backends": checks})
    redis_client().set(SANDBOX_CHECK_KEY.format(worker=worker), value, ex=SANDBOX_CHECK_KEEP_SECONDS)


def sandbox_checks(workers: list[str]) -> dict[str, dict]:
    """Each live sandbox worker's last check; `ok: null` until its first one is in."""
    if not workers:
        return {}
    values = redis_client().mget([SANDBOX_CHECK_KEY.format(worker=worker) for worker in workers])
    pending: dict[str, Any] = {"ok": None, "backends": []}
    checks = zip(workers, values, strict=True)
    return {worker: json.loads(value) if value else pending for worker, value in checks}


def healthz(request: HttpRequest) -> JsonResponse:
    db_ok, db_detail = database_ok()
    r_ok, r_detail = redis_ok()
    queues = workers_by_queue() if r_ok else {name: [] for name in settings.CELERY_WORKER_QUEUES}
    sandbox_workers = sorted({worker for queue in SAMPLING_QUEUES for worker in queues.get(queue, [])})
    sandboxes = sandbox_checks(sandbox_workers) if r_ok else {}
    healthy = db_ok and r_ok and all(queues.get(name) for name in settings.CELERY_WORKER_QUEUES)
    healthy = healthy and all(check["ok"] is not False for check in sandboxes.values())
    body = {
        "status": "ok" if healthy else "degraded",
        "database": {"ok": db_ok, "detail": db_detail},
        "redis": {"ok": r_ok, "detail": r_detail},
        "queues": {
            name: {"workers": len(workers), "names": sorted(workers)} for name, workers in queues.items()
        },
        "sandboxes": sandboxes,
    }
    if not ops_allowed(request):  # the bare answer; the detail is for operators (core/ops_access.py)
        body = {"status": body["status"]}
    return JsonResponse(body, status=200 if healthy else 503)

"""/healthz: the database, Redis, and the live Celery workers of each queue."""

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.http import HttpRequest, JsonResponse
from redis import Redis

from webapp.celery import app as celery_app

WORKER_PROBE_SECONDS = 1.0
WORKER_CACHE_SECONDS = 5


def database_ok() -> tuple[bool, str]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True, connection.vendor
    except Exception as exc:  # noqa: BLE001 - health reports any failure as text
        return False, f"{type(exc).__name__}: {exc}"


def redis_ok() -> tuple[bool, str]:
    try:
        Redis.from_url(settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1).ping()
        return True, "ok"
    except Exception as exc:  # noqa: BLE001
        return False, f"{type(exc).__name__}: {exc}"


def workers_by_queue() -> dict[str, list[str]]:
    """Ask every worker which queues it consumes (broadcast over Redis; cached a few seconds)."""
    cached = cache.get("healthz:workers")
    if cached is not None:
        return cached
    replies = celery_app.control.inspect(timeout=WORKER_PROBE_SECONDS).active_queues() or {}
    queues: dict[str, list[str]] = {name: [] for name in settings.CELERY_WORKER_QUEUES}
    for worker, consumed in replies.items():
        for queue in consumed:
            queues.setdefault(queue["name"], []).append(worker)
    cache.set("healthz:workers", queues, WORKER_CACHE_SECONDS)
    return queues


def healthz(request: HttpRequest) -> JsonResponse:
    db_ok, db_detail = database_ok()
    r_ok, r_detail = redis_ok()
    queues = workers_by_queue() if r_ok else {name: [] for name in settings.CELERY_WORKER_QUEUES}
    healthy = db_ok and r_ok and all(queues.get(name) for name in settings.CELERY_WORKER_QUEUES)
    body = {
        "status": "ok" if healthy else "degraded",
        "database": {"ok": db_ok, "detail": db_detail},
        "redis": {"ok": r_ok, "detail": r_detail},
        "queues": {
            name: {"workers": len(workers), "names": sorted(workers)} for name, workers in queues.items()
        },
    }
    return JsonResponse(body, status=200 if healthy else 503)

"""Redis outages: what keeps working and what says so.

Redis is the broker, the channel layer and the cache. When it is unreachable:
- the cache fails open (`FailOpenRedisCache`): reads miss, writes are dropped, so the API's
  throttle lets requests through and every read keeps answering from the database;
- writes answer 503 (`RedisOutageMiddleware`): most of them enqueue work or notify viewers, and
  a write that commits but cannot enqueue would be half done; one rule a client can retry on;
- /healthz says 503 with the reason (webapp.health); live pages fall back to polling REST.
A circuit breaker keeps a dead Redis from costing every request a connection attempt: after a
failure Redis is presumed down for BREAKER_SECONDS, then tried again, so everything resumes by
itself within that once Redis is back.
"""

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from django.http import HttpRequest, HttpResponse, JsonResponse
from redis import Redis
from redis.exceptions import RedisError

from core.exceptions import error_body

logger = logging.getLogger(__name__)
BREAKER_SECONDS = 2.0
RETRY_AFTER_SECONDS = 5
UNSAFE = ("POST", "PUT", "PATCH", "DELETE")
NEVER_REFUSED = ("/accounts/",)  # signing in and out needs only the database


class _Breaker:
    """Whether Redis is presumed down, shared by the threads of a process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._checked_at = 0.0
        self._up = True

    def is_open(self) -> bool:
        return time.monotonic() < self._down_until

    def trip(self, exc: Exception) -> None:
        with self._lock:
            if not self.is_open():
                logger.warning("Redis is unreachable (%s); failing open for %.0f s", exc, BREAKER_SECONDS)
            self._down_until = time.monotonic() + BREAKER_SECONDS
            self._up = False

    def redis_up(self) -> bool:
        """A ping at most once per BREAKER_SECONDS; the answer in between."""
        if self.is_open():
            return False
        now = time.monotonic()
        if now - self._checked_at < BREAKER_SECONDS and self._up:
            return True
        try:
            Redis.from_url(settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5).ping()
        except RedisError as exc:
            self.trip(exc)
            return False
        with self._lock:
            self._checked_at, self._up = now, True
        return True


breaker = _Breaker()


def redis_up() -> bool:
    return breaker.redis_up()


def _fail_open(default: Any) -> Callable:
    def wrap(method: Callable) -> Callable:
        def call(self, *args, **kwargs):
            if breaker.is_open():
                return default
            try:
                return method(self, *args, **kwargs)
            except RedisError as exc:
                breaker.trip(exc)
                return default

        call.__name__ = method.__name__
        return call

    return wrap


_clients: dict[tuple, RedisCacheClient] = {}
_clients_lock = threading.Lock()


def shared_client(servers: list[str], options: dict[str, Any]) -> RedisCacheClient:
    """One client, and so one connection pool, per process and server list. Django keeps a cache
    object per context, and under ASGI every request runs in a new context: with Django's own
    client each request opened a new pool and a new TCP connection to Redis (a fifth of a list
    request's time). redis-py's pools notice a fork and start afresh in the child."""
    key = (tuple(servers), tuple(sorted((name, repr(value)) for name, value in options.items())))
    with _clients_lock:
        if key not in _clients:
            _clients[key] = RedisCacheClient(servers, **options)
        return _clients[key]


class FailOpenRedisCache(RedisCache):
    """Django's Redis cache, answering as an empty cache while Redis is unreachable, on a
    connection pool shared by the process."""

    @property
    def _cache(self) -> RedisCacheClient:
        # Set by RedisCache.__init__, which django-stubs does not declare.
        return shared_client(self._servers, self._options)  # type: ignore[attr-defined]

    get_many = _fail_open({})(RedisCache.get_many)
    has_key = _fail_open(False)(RedisCache.has_key)
    set = _fail_open(None)(RedisCache.set)
    set_many = _fail_open([])(RedisCache.set_many)
    add = _fail_open(False)(RedisCache.add)
    touch = _fail_open(False)(RedisCache.touch)
    delete = _fail_open(False)(RedisCache.delete)
    delete_many = _fail_open(None)(RedisCache.delete_many)

    def get(self, key, default=None, version=None):  # the caller's default, not a fixed one
        if breaker.is_open():
            return default
        try:
            return super().get(key, default, version)
        except RedisError as exc:
            breaker.trip(exc)
            return default


class RedisOutageMiddleware:
    """While Redis is unreachable, a write answers 503 before it does anything: in the API's
    error shape under /api/, as plain text elsewhere. Reads pass."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method in UNSAFE and not request.path.startswith(NEVER_REFUSED) and not redis_up():
            return outage_response(request)
        return self.get_response(request)


def outage_response(request: HttpRequest) -> HttpResponse:
    message = (
        "Redis (the work queue) is unreachable, so writes are refused for now; reads still work. "
        "Retry shortly."
    )
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse(
            error_body(503, message, code="service_unavailable"), status=503
        )
    else:
        response = HttpResponse(message, status=503, content_type="text/plain; charset=utf-8")
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response

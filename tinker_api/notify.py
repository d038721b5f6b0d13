"""Wake-ups through Redis, so neither a held poll nor an idle learner has to look at the database
every few milliseconds: a finished request pushes to its own key (the poll waiting on it wakes),
and a queued one to its model's (its learner wakes). The database stays the record: a wake-up only
says "look now", each waiter looks again after a short bound even without one, and a Redis that
fails costs latency, never an answer.
"""

import asyncio
import logging
import time
import weakref

import redis
import redis.asyncio
from django.conf import settings

logger = logging.getLogger(__name__)
KEEP_SECONDS = 60  # a wake-up nobody waited for is dropped after this
MAX_WAIT = 1.0  # the longest wait between looks at the record, wake-up or not
_sync_client: redis.Redis | None = None
# One async client (and connection pool) per event loop: a server process has one; tests make many.
_async_clients: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, redis.asyncio.Redis]" = (
    weakref.WeakKeyDictionary()
)


def done_key(request_key: str) -> str:
    return f"flywheel:tinker:done:{request_key}"


def work_key(model_pk: int) -> str:
    return f"flywheel:tinker:work:{model_pk}"


def _client() -> redis.Redis:
    global _sync_client
    if _sync_client is None:
        _sync_client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    return _sync_client


def _push(key: str) -> None:
    try:
        pipeline = _client().pipeline()
        pipeline.lpush(key, 1)
        pipeline.expire(key, KEEP_SECONDS)
        pipeline.execute()
    except (redis.RedisError, OSError) as exc:
        logger.warning("Tinker wake-up on %s not sent (%s): its waiter looks again shortly", key, exc)


def request_finished(request_key: str) -> None:
    _push(done_key(request_key))


def work_queued(model_pk: int) -> None:
    _push(work_key(model_pk))


def work_wait(model_pk: int, seconds: float) -> None:
    """Block until work is queued for the model or `seconds` (at most MAX_WAIT) pass."""
    seconds = min(seconds, MAX_WAIT)
    if seconds <= 0:  # BLPOP's timeout 0 would wait for ever
        return
    try:
        _client().blpop([work_key(model_pk)], timeout=seconds)
    except (redis.RedisError, OSError):
        time.sleep(seconds)


async def finished_wait(request_key: str, seconds: float) -> None:
    """Wait until the request is said to have finished or `seconds` (at most MAX_WAIT) pass."""
    seconds = min(seconds, MAX_WAIT)
    if seconds <= 0:  # BLPOP's timeout 0 would wait for ever
        return
    loop = asyncio.get_running_loop()
    client = _async_clients.get(loop)
    if client is None:
        client = _async_clients[loop] = redis.asyncio.Redis.from_url(
            settings.REDIS_URL, socket_timeout=MAX_WAIT + 2, socket_connect_timeout=2
        )
    try:
        await client.blpop([done_key(request_key)], timeout=seconds)
    except (redis.RedisError, OSError):
        await asyncio.sleep(seconds)

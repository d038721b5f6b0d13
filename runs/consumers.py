"""Websockets: check the caller's role, join the project's or the run's group, forward its messages."""

import asyncio
import logging
import weakref

import redis.asyncio
from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from core.events import project_group, run_group
from core.roles import Permission
from projects import selectors as project_selectors
from runs import selectors
from runs.models import Run

# Close codes in the 4000 range are the application's; these mirror HTTP's meaning.
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_TRY_AGAIN_LATER = 1013  # the channel layer's Redis is unreachable: no message would arrive

LAYER_CHECK_SECONDS = 2.0
logger = logging.getLogger(__name__)


class _LayerWatch:
    """The channel layer is Redis pub/sub, which reconnects on its own and so never tells a
    consumer that Redis went away: its viewers would sit on a socket that says "live" and hears
    nothing. One task a process pings Redis while viewers are connected and, when it does not
    answer, closes their sockets; pages then refresh over REST and reconnect with back-off, and a
    reconnect succeeds once Redis is back (joining a group needs it)."""

    def __init__(self) -> None:
        self.consumers: set[AsyncJsonWebsocketConsumer] = set()
        self.task: asyncio.Task | None = None

    def add(self, consumer: AsyncJsonWebsocketConsumer) -> None:
        self.consumers.add(consumer)
        loop = asyncio.get_running_loop()
        # One loop a server process; a test's loops come and go, and a closed one's task never ends.
        if self.task is None or self.task.done() or self.task.get_loop() is not loop:
            self.task = loop.create_task(self._watch())

    def discard(self, consumer: AsyncJsonWebsocketConsumer) -> None:
        self.consumers.discard(consumer)

    async def _watch(self) -> None:
        client = redis.asyncio.Redis.from_url(
            settings.REDIS_URL, socket_timeout=LAYER_CHECK_SECONDS, socket_connect_timeout=LAYER_CHECK_SECONDS
        )
        try:
            while self.consumers:
                await asyncio.sleep(LAYER_CHECK_SECONDS)
                try:
                    await client.ping()
                except (redis.RedisError, OSError) as exc:
                    logger.warning("Redis unreachable (%s): closing %d websockets", exc, len(self.consumers))
                    for consumer in list(self.consumers):
                        self.consumers.discard(consumer)
                        await consumer.close(code=CLOSE_TRY_AGAIN_LATER)
        finally:
            await client.aclose()


_layer_watch = _LayerWatch()
# One client (and connection pool) per event loop: a server process has one loop; tests make many.
_ping_clients: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, redis.asyncio.Redis]" = (
    weakref.WeakKeyDictionary()
)


async def _layer_reachable() -> bool:
    """Whether the channel layer's Redis answers within LAYER_CHECK_SECONDS (one ping, no retries)."""
    loop = asyncio.get_running_loop()
    client = _ping_clients.get(loop)
    if client is None:
        client = _ping_clients[loop] = redis.asyncio.Redis.from_url(
            settings.REDIS_URL,
            socket_timeout=LAYER_CHECK_SECONDS,
            socket_connect_timeout=LAYER_CHECK_SECONDS,
            retry=Retry(NoBackoff(), 0),
        )
    try:
        await client.ping()
    except (redis.RedisError, OSError) as exc:
        logger.warning("Redis unreachable (%s): refusing a new websocket", exc)
        return False
    return True


class OutageGuard:
    """ASGI middleware before the consumers: while the channel layer's Redis does not answer, a new
    websocket is accepted and closed at once with the code the open sockets got
    (CLOSE_TRY_AGAIN_LATER), so that pages back off and poll REST either way. Closing before
    accepting would reach a browser as 1006 with no code; and a consumer cannot even start then
    (it subscribes to its own channel first, which raises)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket" or await _layer_reachable():
            return await self.inner(scope, receive, send)
        if (await receive())["type"] == "websocket.connect":
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": CLOSE_TRY_AGAIN_LATER})


async def _join(consumer: AsyncJsonWebsocketConsumer, group: str) -> None:
    consumer.group = group
    await consumer.channel_layer.group_add(group, consumer.channel_name)
    _layer_watch.add(consumer)


async def _leave(consumer: AsyncJsonWebsocketConsumer) -> None:
    _layer_watch.discard(consumer)
    if hasattr(consumer, "group"):
        try:
            await consumer.channel_layer.group_discard(consumer.group, consumer.channel_name)
        except (redis.RedisError, OSError):  # Redis is gone: its subscription went with it
            pass


@database_sync_to_async
def _role(user, project_id: int) -> str | None:
    role = project_selectors.role_of(user=user, project_id=project_id)
    return role if role is not None and selectors.role_allows(role, Permission.VIEW) else None


class _ForwardingConsumer(AsyncJsonWebsocketConsumer):
    """Forwards its group's messages to the socket without touching the database."""

    forwarded: frozenset[str] = frozenset()

    async def dispatch(self, message: dict) -> None:
        # Channels closes stale database connections before every handler: a thread-pool hop per
        # message per viewer (a fifth of a web process's time with 200 viewers of a run, bench-live).
        # Forwarding a group message uses no connection, so it skips that; connect still has it.
        if message["type"] in self.forwarded:
            await getattr(self, get_handler_name(message))(message)
            return
        await super().dispatch(message)


class ProjectConsumer(_ForwardingConsumer):
    forwarded = frozenset({"project.event"})

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        project_id = int(self.scope["url_route"]["kwargs"]["project_id"])
        if await _role(user, project_id) is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        await _join(self, project_group(project_id))
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await _leave(self)

    async def project_event(self, message: dict) -> None:
        await self.send_json({"event": message["event"], "payload": message["payload"]})


@database_sync_to_async
def _run_project(run_id: int) -> int | None:
    return Run.objects.filter(pk=run_id).values_list("project_id", flat=True).first()


class RunConsumer(_ForwardingConsumer):
    """One run's live messages: status, event (alerts included), metrics, policy, rollout.

    Messages are notifications; a client re-fetches over REST on (re)connect."""

    forwarded = frozenset({"run.message"})

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        project_id = await _run_project(run_id)
        if project_id is None or await _role(user, project_id) is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        await _join(self, run_group(run_id))
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await _leave(self)

    async def run_message(self, message: dict) -> None:
        await self.send_json({"event": message["event"], "payload": message["payload"]})

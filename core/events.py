"""Notifications to browsers watching a project, sent only after the transaction commits.

Websocket messages are notifications (at most once); the record stays in the database and
clients re-fetch it over REST when they (re)connect.
"""

import asyncio
import logging
import os
import threading
from typing import Any

import redis
from channels.layers import get_channel_layer
from channels_redis.pubsub import RedisPubSubChannelLayer, RedisPubSubLoopLayer
from django.db import transaction


def project_group(project_id: int) -> str:
    return f"project-{project_id}"


def project_event(project_id: int, event_type: str, payload: dict[str, Any]) -> None:
    message = {"type": "project.event", "event": event_type, "payload": payload}
    transaction.on_commit(lambda: _send(project_group(project_id), message))


logger = logging.getLogger(__name__)


SEND_TIMEOUT = 5.0
_sender: tuple[int, asyncio.AbstractEventLoop] | None = None
_sender_lock = threading.Lock()


def _sender_loop() -> asyncio.AbstractEventLoop:
    """One long-lived event loop a process for sending: the channel layer keeps its Redis
    connections per loop, so a loop per message (async_to_sync) would reconnect every time.
    Made again in a forked child, where the parent's loop thread does not exist."""
    global _sender
    with _sender_lock:
        if _sender is None or _sender[0] != os.getpid() or _sender[1].is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="flywheel-notify", daemon=True).start()
            _sender = (os.getpid(), loop)
        return _sender[1]


_publisher: tuple[int, Any, Any] | None = None  # (pid, the layer's naming, a Redis client per host)
_publisher_lock = threading.Lock()


def _publish(layer: Any, group: str, message: dict[str, Any]) -> bool:
    """On the Redis pub/sub layer, a group message is one PUBLISH of the layer's own encoding to
    the layer's channel for the group: sent here with a plain Redis client in the writer's thread
    (0.15 ms), not through an event loop in another thread (0.6 ms of this process's CPU, half of
    a learner's metrics step). False for any other layer."""
    global _publisher
    if not isinstance(layer, RedisPubSubChannelLayer):
        return False
    with _publisher_lock:
        if _publisher is None or _publisher[0] != os.getpid():
            # The layer's own naming and sharding (no connection, no event loop: just its rules).
            naming = RedisPubSubLoopLayer(**layer._kwargs, channel_layer=layer)
            _publisher = (os.getpid(), naming, {})
        _, naming, clients = _publisher
    channel = naming._get_group_channel_name(group)
    host = dict(naming._get_shard(channel).host)
    if "address" not in host:  # a Sentinel or keyword host: the layer's own path
        return False
    address = host.pop("address")
    if address not in clients:
        options = {"socket_timeout": SEND_TIMEOUT, "socket_connect_timeout": SEND_TIMEOUT} | host
        clients[address] = redis.Redis.from_url(address, **options)
    clients[address].publish(channel, layer.serialize(message))
    return True


def _send(group: str, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        if _publish(layer, group, message):
            return
        # Waiting keeps messages in order and reports a failure here; it costs one round trip.
        asyncio.run_coroutine_threadsafe(layer.group_send(group, message), _sender_loop()).result(
            timeout=SEND_TIMEOUT
        )
    except Exception as exc:  # noqa: BLE001 - a lost notification must never undo or fail the write
        logger.warning("could not notify %s of %s: %s", group, message["event"], exc)


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


def run_event(run_id: int, event_type: str, payload: dict[str, Any]) -> None:
    """Announce a change of one run (status, event, metrics) to its live viewers."""
    message = {"type": "run.message", "event": event_type, "payload": payload}
    transaction.on_commit(lambda: _send(run_group(run_id), message))

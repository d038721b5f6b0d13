"""Following a run live: its websocket's messages, with the REST record filling any gap.

Websocket messages are notifications (at most once), so on every (re)connect the run and the events
since the last one seen are fetched over REST first; the follow ends when the run is terminal."""

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from websockets.asyncio.client import connect as connect_async
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect
from websockets.typing import Origin

from flywheel._http import AsyncTransport, Transport
from flywheel._records import Record
from flywheel.errors import FlywheelError

logger = logging.getLogger("flywheel")
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
CHECK_SECONDS = 5.0


def websocket_url(http_url: str, run_id: int) -> str:
    """
    >>> websocket_url("https://fly.example.com/", 7)
    'wss://fly.example.com/ws/runs/7/'
    """
    base = http_url.rstrip("/")
    scheme, rest = base.split("://", 1)
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/ws/runs/{run_id}/"


def follow(transport: Transport, run_id: int, *, reconnects: int = 20) -> Iterator[dict[str, Any]]:
    """Yield {"event": name, "payload": ...} for the run until it ends: "run" (the run over REST,
    first and last), "event" (its events, none missed), "status", "metrics", "policy", "rollout"."""
    last_event = 0
    run = transport.json("GET", f"/api/v1/runs/{run_id}")
    yield {"event": "run", "payload": run}
    failures = 0
    while True:
        # The run first, then its events: a run seen terminal has all its events in the record.
        run = transport.json("GET", f"/api/v1/runs/{run_id}")
        for event in _events_since(transport, run_id, last_event):
            last_event = max(last_event, event["id"])
            yield {"event": "event", "payload": event}
        if run["status"] in TERMINAL:
            yield {"event": "run", "payload": run}
            return
        try:
            headers = {"Authorization": f"Bearer {transport.token}"}
            with connect(
                websocket_url(transport.url, run_id), additional_headers=headers, origin=Origin(transport.url)
            ) as ws:
                failures = 0
                for message in _messages(ws, transport, run_id):
                    if message["event"] == "event":
                        if message["payload"].get("id", 0) <= last_event:
                            continue
                        last_event = message["payload"]["id"]
                    yield message
                    if message["event"] == "status" and message["payload"].get("status") in TERMINAL:
                        break
        except InvalidStatus as exc:
            raise FlywheelError(f"the server refused the websocket of run {run_id}: {exc}") from exc
        except (ConnectionClosed, OSError) as exc:
            failures += 1
            if failures > reconnects:
                raise FlywheelError(f"lost the websocket of run {run_id} {failures} times: {exc}") from exc
            logger.warning("flywheel: websocket of run %s closed (%s); reconnecting", run_id, exc)
            time.sleep(min(30.0, 0.5 * 2**failures))


def _messages(ws, transport: Transport, run_id: int) -> Iterator[dict[str, Any]]:
    while True:
        try:
            raw = ws.recv(timeout=CHECK_SECONDS)
        except TimeoutError:
            # Quiet: the run may have ended while a message was lost; the record says.
            status = transport.json("GET", f"/api/v1/runs/{run_id}")["status"]
            if status in TERMINAL:
                return
            continue
        yield Record.wrap(json.loads(raw))


def _events_since(transport: Transport, run_id: int, since: int) -> Iterator[dict[str, Any]]:
    return transport.pages(f"/api/v1/runs/{run_id}/events", {"since": since, "limit": 200})


async def follow_async(
    transport: AsyncTransport, run_id: int, *, reconnects: int = 20
) -> AsyncIterator[dict[str, Any]]:
    """follow(), on the async transport and websockets' asyncio client: the same messages."""
    last_event = 0
    run = await transport.json("GET", f"/api/v1/runs/{run_id}")
    yield {"event": "run", "payload": run}
    failures = 0
    while True:
        run = await transport.json("GET", f"/api/v1/runs/{run_id}")
        async for event in transport.pages(
            f"/api/v1/runs/{run_id}/events", {"since": last_event, "limit": 200}
        ):
            last_event = max(last_event, event["id"])
            yield {"event": "event", "payload": event}
        if run["status"] in TERMINAL:
            yield {"event": "run", "payload": run}
            return
        try:
            headers = {"Authorization": f"Bearer {transport.token}"}
            async with connect_async(
                websocket_url(transport.url, run_id), additional_headers=headers, origin=Origin(transport.url)
            ) as ws:
                failures = 0
                async for message in _messages_async(ws, transport, run_id):
                    if message["event"] == "event":
                        if message["payload"].get("id", 0) <= last_event:
                            continue
                        last_event = message["payload"]["id"]
                    yield message
                    if message["event"] == "status" and message["payload"].get("status") in TERMINAL:
                        break
        except InvalidStatus as exc:
            raise FlywheelError(f"the server refused the websocket of run {run_id}: {exc}") from exc
        except (ConnectionClosed, OSError) as exc:
            failures += 1
            if failures > reconnects:
                raise FlywheelError(f"lost the websocket of run {run_id} {failures} times: {exc}") from exc
            logger.warning("flywheel: websocket of run %s closed (%s); reconnecting", run_id, exc)
            await asyncio.sleep(min(30.0, 0.5 * 2**failures))


async def _messages_async(ws, transport: AsyncTransport, run_id: int) -> AsyncIterator[dict[str, Any]]:
    while True:
        try:
            raw = await asyncio.wait_for(ws.recv(), CHECK_SECONDS)  # websockets: cancelling recv is safe
        except TimeoutError:
            status = (await transport.json("GET", f"/api/v1/runs/{run_id}"))["status"]
            if status in TERMINAL:
                return
            continue
        yield Record.wrap(json.loads(raw))

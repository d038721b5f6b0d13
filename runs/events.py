"""Notifications to browsers watching a project, sent only after the transaction commits.

Websocket messages are notifications (at most once); the record stays in the database and
clients re-fetch it over REST when they (re)connect.
"""

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction


def project_group(project_id: int) -> str:
    return f"project-{project_id}"


def project_event(project_id: int, event_type: str, payload: dict[str, Any]) -> None:
    message = {"type": "project.event", "event": event_type, "payload": payload}
    transaction.on_commit(lambda: _send(project_group(project_id), message))


logger = logging.getLogger(__name__)


def _send(group: str, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, message)
    except Exception as exc:  # noqa: BLE001 - a lost notification must never undo or fail the write
        logger.warning("could not notify %s of %s: %s", group, message["event"], exc)


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


def run_event(run_id: int, event_type: str, payload: dict[str, Any]) -> None:
    """Announce a change of one run (status, event, metrics) to its live viewers."""
    message = {"type": "run.message", "event": event_type, "payload": payload}
    transaction.on_commit(lambda: _send(run_group(run_id), message))

"""Notifications to browsers watching a project, sent only after the transaction commits.

Websocket messages are notifications (at most once); the record stays in the database and
clients re-fetch it over REST when they (re)connect.
"""

from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction


def project_group(project_id: int) -> str:
    return f"project-{project_id}"


def project_event(project_id: int, event_type: str, payload: dict[str, Any]) -> None:
    message = {"type": "project.event", "event": event_type, "payload": payload}
    transaction.on_commit(lambda: _send(project_group(project_id), message))


def _send(group: str, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(group, message)

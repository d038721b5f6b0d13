"""Request body limits, enforced before authentication and before a body is read.

Two limits, by what the body is: a file upload (`multipart/form-data`: task set and reward rule
imports) may be `FLYWHEEL_MAX_UPLOAD_MB`; any other body (JSON, forms) `FLYWHEEL_MAX_BODY_MB`.
A body over its limit is answered 413 in the API's error shape and never read:
`BodyLimitMiddleware` wraps the ASGI application, so a declared `Content-Length` over the limit is
refused before Django (authentication included) runs, and a body without one (chunked) is
counted as it arrives and cut off at the limit. The server (uvicorn) hands the application a body
as it reads it, holding back the client while the application does not read: nothing of a
refused body is kept. (Daphne, by contrast, reads a whole body and queues it in memory first.)
"""

import json
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

MB = 1024 * 1024
Scope = dict[str, Any]
Message = dict[str, Any]


def body_limit(content_type: str) -> int:
    """The most bytes a body of this content type may hold."""
    if content_type.split(";", 1)[0].strip().lower() == "multipart/form-data":
        return settings.FLYWHEEL_MAX_UPLOAD_MB * MB
    return settings.FLYWHEEL_MAX_BODY_MB * MB


def limit_setting(content_type: str) -> str:
    if content_type.split(";", 1)[0].strip().lower() == "multipart/form-data":
        return "FLYWHEEL_MAX_UPLOAD_MB"
    return "FLYWHEEL_MAX_BODY_MB"


def too_large_body(content_type: str, length: int | None) -> bytes:
    """The 413 answer's body, in the API's one error shape."""
    limit = body_limit(content_type)
    size = f"{length / MB:.1f} MB" if length is not None else f"over {limit // MB} MB"
    what = "a file upload" if limit_setting(content_type) == "FLYWHEEL_MAX_UPLOAD_MB" else "a request body"
    error = {
        "code": "payload_too_large",
        "message": (
            f"the request body is {size}; {what} may be at most {limit // MB} MB "
            f"(the server's {limit_setting(content_type)})"
        ),
        "param": "body",
        "details": [],
    }
    return json.dumps({"error": error}).encode()


def header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


def declared_length(scope: Scope) -> int | None:
    raw = header(scope, b"content-length").strip()
    return int(raw) if raw.isdigit() else None


class BodyLimitMiddleware:
    """ASGI middleware: refuse an HTTP request whose body is over its limit, unread."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        content_type = header(scope, b"content-type")
        limit = body_limit(content_type)
        length = declared_length(scope)
        if length is not None and length > limit:
            await respond_too_large(send, content_type, length)
            return
        received = 0
        cut_off = False
        started = False

        async def counted_receive() -> Message:
            nonlocal received, cut_off
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # The application sees the client go away; this middleware answers 413.
                    cut_off = True
                    return {"type": "http.disconnect"}
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, counted_receive, tracked_send)
        if cut_off and not started:
            await respond_too_large(send, content_type, None)


async def respond_too_large(send, content_type: str, length: int | None) -> None:
    body = too_large_body(content_type, length)
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})

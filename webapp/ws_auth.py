"""Websocket authentication: the browser's session, or a bearer token for REST clients."""

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from django.contrib.auth.models import AnonymousUser

from runs import selectors
from runs.services import token_digest


@database_sync_to_async
def _user_for(raw_token: str):
    return selectors.user_for_token(digest=token_digest(raw_token)) or AnonymousUser()


class BearerTokenMiddleware:
    """Uses `Authorization: Bearer <token>` when present; otherwise keeps the session's user."""

    def __init__(self, inner) -> None:
        self.inner = inner

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers", []))
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth.lower().startswith("bearer "):
            scope = dict(scope, user=await _user_for(auth[7:].strip()))
        return await self.inner(scope, receive, send)


def SessionOrTokenAuthMiddleware(inner):  # noqa: N802 (named like the middleware it builds)
    return AuthMiddlewareStack(BearerTokenMiddleware(inner))

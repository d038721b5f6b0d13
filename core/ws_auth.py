"""Websocket authentication: the browser's session, or a bearer token for REST clients. The app that
owns tokens passes `user_for_digest` (the wiring in webapp/asgi.py), so the core imports no domain app."""

from collections.abc import Callable
from typing import Any

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.security.websocket import AllowedHostsOriginValidator
from django.contrib.auth.models import AnonymousUser

from core import lockout
from core.tokens import token_digest

UserForDigest = Callable[[str], Any]


@database_sync_to_async
def _user_for(raw_token: str, address: str, user_for_digest: UserForDigest):
    """The token's user; anonymous (refused by every consumer) for an unknown token, counted for
    the token and its address unless they are locked out already (core/lockout.py)."""
    digest = token_digest(raw_token)
    user = user_for_digest(digest)
    if user is None and lockout.token_locked_for(address, digest) == 0:
        lockout.token_failure_record(address, digest)
    return user or AnonymousUser()


class BearerTokenMiddleware:
    """Uses `Authorization: Bearer <token>` when present; otherwise keeps the session's user."""

    def __init__(self, inner, user_for_digest: UserForDigest) -> None:
        self.inner = inner
        self.user_for_digest = user_for_digest

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers", []))
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth.lower().startswith("bearer "):
            scope = dict(
                scope,
                user=await _user_for(auth[7:].strip(), lockout.scope_address(scope), self.user_for_digest),
            )
        return await self.inner(scope, receive, send)


def SessionOrTokenAuthMiddleware(inner, user_for_digest: UserForDigest):  # noqa: N802 (a middleware's name)
    return AuthMiddlewareStack(BearerTokenMiddleware(inner, user_for_digest))


def has_bearer(scope) -> bool:
    return dict(scope.get("headers", [])).get(b"authorization", b"").lower().startswith(b"bearer ")


class OriginValidatorUnlessBearer:
    """A browser's websocket (its session cookie rides along by itself) must come from an allowed
    origin, against cross-site hijacking. A client with a bearer token need not send an Origin:
    a page cannot set that header on a websocket, so the token was given on purpose (a script)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.checked = AllowedHostsOriginValidator(inner)

    async def __call__(self, scope, receive, send):
        if has_bearer(scope):
            return await self.inner(scope, receive, send)
        return await self.checked(scope, receive, send)

"""Websocket authentication: the browser's session, or a bearer token for REST clients."""

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.security.websocket import AllowedHostsOriginValidator
from django.contrib.auth.models import AnonymousUser

from runs import selectors
from runs.services import token_digest
from webapp import lockout


@database_sync_to_async
def _user_for(raw_token: str, address: str):
    """The token's user; anonymous (refused by every consumer) for an unknown token, counted for
    the token and its address unless they are locked out already (webapp/lockout.py)."""
    digest = token_digest(raw_token)
    user = selectors.user_for_token(digest=digest)
    if user is None and lockout.token_locked_for(address, digest) == 0:
        lockout.token_failure_record(address, digest)
    return user or AnonymousUser()


class BearerTokenMiddleware:
    """Uses `Authorization: Bearer <token>` when present; otherwise keeps the session's user."""

    def __init__(self, inner) -> None:
        self.inner = inner

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers", []))
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth.lower().startswith("bearer "):
            scope = dict(scope, user=await _user_for(auth[7:].strip(), lockout.scope_address(scope)))
        return await self.inner(scope, receive, send)


def SessionOrTokenAuthMiddleware(inner):  # noqa: N802 (named like the middleware it builds)
    return AuthMiddlewareStack(BearerTokenMiddleware(inner))


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

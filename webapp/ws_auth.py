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
    """The token's user; anonymous (refused by every consumer) for an unknown token or while the
    address is locked out after failed sign-ins (webapp/lockout.py)."""
    if lockout.locked_for(address) > 0:
        return AnonymousUser()
    user = selectors.user_for_token(digest=token_digest(raw_token))
    if user is None:
        lockout.failure_record(address, what="API token")
    return user or AnonymousUser()


class BearerTokenMiddleware:
    """Uses `Authorization: Bearer <token>` when present; otherwise keeps the session's user."""

    def __init__(self, inner) -> None:
        self.inner = inner

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers", []))
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth.lower().startswith("bearer "):
            address = (scope.get("client") or ["unknown"])[0]
            scope = dict(scope, user=await _user_for(auth[7:].strip(), address))
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

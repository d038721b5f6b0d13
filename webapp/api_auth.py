"""Bearer token authentication for REST clients. Kept apart from webapp.api because DRF imports
authentication classes while its own views module is still loading."""

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from django.db import OperationalError, connection
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from runs import selectors
from runs.models import ApiToken
from runs.services import token_digest
from webapp import lockout

# A read must not write on every request (on SQLite a write waits for any other writer): a token's
# last use is recorded to the minute.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def token_used(token: ApiToken) -> None:
    """Record the token's use, best effort: on SQLite a request never queues behind another
    writer (a long import) for this bookkeeping; a later request records it instead."""
    now = timezone.now()
    if token.last_used_at is not None and now - token.last_used_at < LAST_USED_RESOLUTION:
        return
    try:
        with _short_lock_wait():
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    except OperationalError:  # the database is locked by a writer right now
        pass


@contextmanager
def _short_lock_wait(milliseconds: int = 200) -> Iterator[None]:
    if connection.vendor != "sqlite":
        yield
        return
    usual = int(connection.settings_dict.get("OPTIONS", {}).get("timeout", 5) * 1000)
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA busy_timeout = {milliseconds}")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"PRAGMA busy_timeout = {usual}")


class BearerTokenAuthentication(BaseAuthentication):
    keyword = "bearer"

    def authenticate(self, request: Request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword.encode():
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <token>'")
        digest = token_digest(parts[1].decode("latin-1"))
        token = selectors.token_for(digest=digest)
        if token is None:
            # A valid token is never refused (no one guesses 43 random characters); a guesser is.
            address = lockout.client_address(request._request)
            if (left := lockout.token_locked_for(address, digest)) > 0:
                raise exceptions.Throttled(wait=left, detail=lockout.token_lockout_message(left))
            lockout.token_failure_record(address, digest)
            raise exceptions.AuthenticationFailed("the token is unknown or revoked")
        token_used(token)
        return token.user, digest

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "webapp.api_auth.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer"}

"""The API's bearer tokens: a digest names a live ApiToken (core.auth parses the header and locks
out guessers)."""

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from django.db import OperationalError, connection
from django.utils import timezone

from core.auth import BearerTokenAuthentication
from projects import selectors
from projects.models import ApiToken

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


class ApiTokenAuthentication(BearerTokenAuthentication):
    def token_lookup(self, digest: str) -> tuple[object, ApiToken] | None:
        token = selectors.token_for(digest=digest)
        return None if token is None else (token.user, token)

    def token_used(self, token: ApiToken) -> None:
        token_used(token)

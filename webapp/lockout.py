"""Failed sign-ins are counted per account and per address; too many lock both out for a while.

FLYWHEEL_LOGIN_MAX_FAILURES failures within FLYWHEEL_LOGIN_LOCKOUT_SECONDS lock the account (from
every address) and the address (for every account) for FLYWHEEL_LOGIN_LOCKOUT_SECONDS: while
locked, even the right password or a valid token is refused. What counts as a failure: a wrong
password (the sign-in page, the admin's), an unknown or revoked API token (REST or websocket),
counted for its address (a token names no account). Every failure and lockout is logged to the
`flywheel.security` logger. The counts live in the cache (Redis): if it cannot be reached, sign-ins
are not throttled rather than refused, and that is logged too.
"""

import logging
import time

from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.forms import AuthenticationForm
from django.core.cache import cache
from django.http import HttpRequest

log = logging.getLogger("flywheel.security")
PREFIX = "lockout"


def client_address(request: HttpRequest) -> str:
    return request.META.get("REMOTE_ADDR") or "unknown"


def _keys(kind: str, address: str, username: str | None) -> list[str]:
    keys = [f"{PREFIX}:{kind}:address:{address}"]
    if username:
        keys.append(f"{PREFIX}:{kind}:account:{username.lower()}")
    return keys


def locked_for(address: str, username: str | None = None) -> int:
    """Seconds left of the lockout of this address or account; 0 when neither is locked."""
    try:
        until = cache.get_many(_keys("until", address, username)).values()
    except Exception as exc:  # noqa: BLE001 - an unreachable cache must not refuse every sign-in
        log.warning("sign-in lockout not checked: the cache failed: %s", exc)
        return 0
    left = max((float(value) - time.time() for value in until), default=0)
    return max(0, int(left + 0.999))


def failure_record(address: str, username: str | None = None, *, what: str = "sign-in") -> None:
    """Count a failed sign-in; lock the address or account that reaches the limit."""
    window = settings.FLYWHEEL_LOGIN_LOCKOUT_SECONDS
    limit = settings.FLYWHEEL_LOGIN_MAX_FAILURES
    who = f"account {username!r} from {address}" if username else f"address {address}"
    try:
        for key in _keys("failures", address, username):
            cache.add(key, 0, timeout=window)
            failures = cache.incr(key)
            if failures >= limit:
                lock = key.replace(":failures:", ":until:")
                cache.set(lock, time.time() + window, timeout=window)
                cache.delete(key)
                locked = key.split(":", 2)[2].replace(":", " ", 1)
                log.warning("locked out %s for %d s after %d failed %ss", locked, window, failures, what)
    except Exception as exc:  # noqa: BLE001
        log.warning("failed %s by %s not counted: the cache failed: %s", what, who, exc)
        return
    log.info("failed %s by %s", what, who)


def failures_forget(username: str) -> None:
    """A successful sign-in clears its account's count (never its address's: an attacker signing in
    to an account of their own must not reset the count of the address they guess from)."""
    try:
        cache.delete(f"{PREFIX}:failures:account:{username.lower()}")
    except Exception as exc:  # noqa: BLE001
        log.warning("sign-in count of %r not cleared: the cache failed: %s", username, exc)


def forget(address: str, username: str | None = None) -> None:
    """Clear the counts and lockouts of an address (and an account): `manage.py`-shell unlocking."""
    try:
        cache.delete_many(_keys("failures", address, username) + _keys("until", address, username))
    except Exception as exc:  # noqa: BLE001
        log.warning("lockout of %s not cleared: the cache failed: %s", address, exc)


def lockout_message(seconds: int) -> str:
    return f"too many failed sign-ins; try again in {max(1, (seconds + 59) // 60)} min"


class LockoutModelBackend(ModelBackend):
    """Django's password check, refused while the account or the address is locked out, and
    counting its failures. Every password sign-in goes through it: the sign-in page and the admin."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        address = client_address(request) if request is not None else "unknown"
        if username is None:
            username = kwargs.get(get_user_model().USERNAME_FIELD)
        if (left := locked_for(address, username)) > 0:
            log.warning("refused sign-in of account %r from %s: locked out for %d s", username, address, left)
            if request is not None:
                request.lockout_seconds = left
            return None
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            failure_record(address, username)
        elif username:
            failures_forget(username)
        return user


class LockoutAuthenticationForm(AuthenticationForm):
    """The sign-in form, saying so when the refusal is a lockout rather than a wrong password."""

    def clean(self):
        try:
            return super().clean()
        except forms.ValidationError:
            if seconds := getattr(self.request, "lockout_seconds", 0):
                raise forms.ValidationError(lockout_message(seconds), code="locked_out") from None
            raise

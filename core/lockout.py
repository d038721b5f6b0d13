"""Failed sign-ins are counted per account and per address; too many lock both out for a while.

Passwords: FLYWHEEL_LOGIN_MAX_FAILURES wrong passwords within FLYWHEEL_LOGIN_LOCKOUT_SECONDS lock
the account (from every address) and the address (for every account) for
FLYWHEEL_LOGIN_LOCKOUT_SECONDS: while locked, even the right password is refused (the sign-in
page, the admin's).

API tokens (REST or websocket): as many unknown or revoked tokens lock out that token and bad tokens
from that address, never a valid token. A token is 43 random characters: no one guesses one, so a
valid token is always let in, while a guesser (or a script with a revoked token) is answered 429
without its address's other users, behind the same proxy or NAT, losing their access. Token
failures are counted apart from passwords, so a broken script does not lock its address's
password sign-ins either.

The address is the peer's, or, when the peer is one of FLYWHEEL_TRUSTED_PROXIES, the one the proxy
names in FLYWHEEL_CLIENT_ADDRESS_HEADER (the rightmost one not itself a trusted proxy: what the
client sent to the first proxy cannot be trusted). Every failure and lockout is logged to the
`flywheel.security` logger. The counts live in the cache (Redis): if it cannot be reached, sign-ins
are not throttled rather than refused, and that is logged too.
"""

import ipaddress
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
    header = request.headers.get(settings.FLYWHEEL_CLIENT_ADDRESS_HEADER)
    return address_behind_proxies(request.META.get("REMOTE_ADDR") or "unknown", header)


def scope_address(scope: dict) -> str:
    """client_address of an ASGI scope (a websocket)."""
    wanted = settings.FLYWHEEL_CLIENT_ADDRESS_HEADER.lower().encode("latin-1")
    header = next((value for name, value in scope.get("headers", []) if name.lower() == wanted), None)
    peer = (scope.get("client") or ["unknown"])[0]
    return address_behind_proxies(peer, None if header is None else header.decode("latin-1"))


def address_behind_proxies(peer: str, forwarded: str | None) -> str:
    """The peer, unless it is a trusted proxy: then the rightmost address of the forwarded header
    that is not a trusted proxy (the ones left of it were written by the client itself)."""
    if not forwarded or not _trusted_proxy(peer):
        return peer
    hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
    for hop in reversed(hops):
        if not _trusted_proxy(hop):
            return hop if _is_address(hop) else peer
    return hops[0] if hops and _is_address(hops[0]) else peer


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _trusted_proxy(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in ipaddress.ip_network(net, strict=False) for net in settings.FLYWHEEL_TRUSTED_PROXIES)


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
        token_forget(address)
    except Exception as exc:  # noqa: BLE001
        log.warning("lockout of %s not cleared: the cache failed: %s", address, exc)


def lockout_message(seconds: int) -> str:
    return f"too many failed sign-ins; try again in {max(1, (seconds + 59) // 60)} min"


# --- API tokens: the failing token and the guessing address, never a valid token ----------------


def _token_keys(kind: str, address: str, digest: str) -> list[str]:
    return [f"{PREFIX}:{kind}:token-address:{address}", f"{PREFIX}:{kind}:token:{digest[:16]}"]


def token_locked_for(address: str, digest: str) -> int:
    """Seconds left of the lockout of bad tokens from this address, or of this token; 0 when neither."""
    try:
        until = cache.get_many(_token_keys("until", address, digest)).values()
    except Exception as exc:  # noqa: BLE001 - an unreachable cache must not refuse every client
        log.warning("API token lockout not checked: the cache failed: %s", exc)
        return 0
    left = max((float(value) - time.time() for value in until), default=0)
    return max(0, int(left + 0.999))


def token_failure_record(address: str, digest: str) -> None:
    """Count an unknown or revoked token, for its address and for the token itself."""
    window = settings.FLYWHEEL_LOGIN_LOCKOUT_SECONDS
    limit = settings.FLYWHEEL_LOGIN_MAX_FAILURES
    labels = [f"unknown API tokens from address {address}", f"API token sha256:{digest[:12]}"]
    try:
        for key, label in zip(_token_keys("failures", address, digest), labels, strict=True):
            cache.add(key, 0, timeout=window)
            failures = cache.incr(key)
            if failures >= limit:
                cache.set(key.replace(":failures:", ":until:"), time.time() + window, timeout=window)
                cache.delete(key)
                log.warning("locked out %s for %d s after %d failures", label, window, failures)
    except Exception as exc:  # noqa: BLE001
        log.warning("unknown API token from %s not counted: the cache failed: %s", address, exc)
        return
    log.info("unknown or revoked API token sha256:%s from %s", digest[:12], address)


def token_forget(address: str, digest: str = "") -> None:
    try:
        cache.delete_many(_token_keys("failures", address, digest) + _token_keys("until", address, digest))
    except Exception as exc:  # noqa: BLE001
        log.warning("token lockout of %s not cleared: the cache failed: %s", address, exc)


def token_lockout_message(seconds: int) -> str:
    minutes = max(1, (seconds + 59) // 60)
    return f"too many unknown or revoked API tokens from this address; try again in {minutes} min"


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

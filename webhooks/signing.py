"""Webhook signatures, as Stripe signs its events: `Flywheel-Signature: t=<unix time>,v1=<hex>`,
where the hex is HMAC-SHA256 of f"{t}.{body}" under the webhook's secret. The timestamp inside the
signed text lets a receiver refuse replays of an old delivery."""

import hashlib
import hmac
import time
from collections.abc import Sequence


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The hex HMAC-SHA256 of `{timestamp}.{body}`.

    >>> signature("whsec_test", 1700000000, b'{"a":1}')[:16]
    '38877139021993b8'
    """
    signed = f"{timestamp}.".encode() + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def signature_header(secrets: str | Sequence[str], body: bytes, timestamp: int | None = None) -> str:
    """`t=<timestamp>,v1=<hex>`, with one `v1=` per secret (the old and the new one, after a rotation).

    >>> signature_header(["whsec_new", "whsec_old"], b"{}", timestamp=1700000000).count(",v1=")
    2
    """
    timestamp = int(time.time()) if timestamp is None else timestamp
    keys = [secrets] if isinstance(secrets, str) else list(secrets)
    return f"t={timestamp}," + ",".join(f"v1={signature(key, timestamp, body)}" for key in keys)


def signature_verify(
    secret: str, header: str, body: bytes | str, tolerance_s: int = 300, now: float | None = None
) -> bool:
    """True when `header` signs exactly `body` with `secret`, at most `tolerance_s` seconds from
    now. Every `v1=` in the header is tried, so a sender may sign with an old and a new secret.

    >>> header = signature_header("whsec_test", b"{}", timestamp=1700000000)
    >>> signature_verify("whsec_test", header, "{}", now=1700000060)
    True
    >>> signature_verify("whsec_test", header, "{ }", now=1700000060)
    False
    >>> signature_verify("whsec_test", header, "{}", now=1700000000 + 301)
    False
    """
    raw = body.encode() if isinstance(body, str) else body
    timestamp, candidates = None, []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t" and value.isdigit():
            timestamp = int(value)
        elif key == "v1":
            candidates.append(value)
    if timestamp is None or not candidates:
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance_s:
        return False
    expected = signature(secret, timestamp, raw)
    return any(hmac.compare_digest(expected, candidate) for candidate in candidates)

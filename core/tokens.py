"""API tokens are stored as digests: the raw token is shown once, at creation, and never kept."""

import hashlib


def token_digest(raw_token: str) -> str:
    # Tokens carry 256 random bits, so a plain SHA-256 is enough; no slow password hash needed.
    return hashlib.sha256(raw_token.encode()).hexdigest()

"""Bearer token authentication for REST clients. Kept apart from core.api because DRF imports
authentication classes while its own views module is still loading.

The core parses the header and locks out guessers; the app that owns tokens says what a digest
names (`token_lookup`) and records a token's use (`token_used`), so the core imports no domain app."""

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from core import lockout
from core.tokens import token_digest


class BearerTokenAuthentication(BaseAuthentication):
    """`Authorization: Bearer <token>`; subclasses find the token for its digest."""

    keyword = "bearer"

    def token_lookup(self, digest: str) -> tuple[Any, Any] | None:
        """(user, token) for a live token with this digest, else None."""
        raise NotImplementedError

    def token_used(self, token: Any) -> None:
        """Record the token's use (best effort); nothing by default."""

    def authenticate(self, request: Request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword.encode():
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <token>'")
        digest = token_digest(parts[1].decode("latin-1"))
        found = self.token_lookup(digest)
        if found is None:
            # A valid token is never refused (no one guesses 43 random characters); a guesser is.
            address = lockout.client_address(request._request)
            if (left := lockout.token_locked_for(address, digest)) > 0:
                raise exceptions.Throttled(wait=left, detail=lockout.token_lockout_message(left))
            lockout.token_failure_record(address, digest)
            raise exceptions.AuthenticationFailed("the token is unknown or revoked")
        user, token = found
        self.token_used(token)
        return user, digest

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "core.auth.BearerTokenAuthentication"
    match_subclasses = True
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer"}

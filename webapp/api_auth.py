"""Bearer token authentication for REST clients. Kept apart from webapp.api because DRF imports
authentication classes while its own views module is still loading."""

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from runs import selectors
from runs.models import ApiToken
from runs.services import token_digest
from webapp import lockout


class BearerTokenAuthentication(BaseAuthentication):
    keyword = "bearer"

    def authenticate(self, request: Request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword.encode():
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <token>'")
        address = lockout.client_address(request._request)
        if (left := lockout.locked_for(address)) > 0:
            raise exceptions.Throttled(wait=left, detail=f"{lockout.lockout_message(left)} (this address)")
        digest = token_digest(parts[1].decode("latin-1"))
        user = selectors.user_for_token(digest=digest)
        if user is None:
            lockout.failure_record(address, what="API token")
            raise exceptions.AuthenticationFailed("the token is unknown or revoked")
        ApiToken.objects.filter(digest=digest).update(last_used_at=timezone.now())
        return user, digest

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "webapp.api_auth.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer"}

"""The signed-in user of a request, typed for the services and selectors that act for them.

`request.user` is `User | AnonymousUser` to a type checker; every view that reaches a service is
behind login or token authentication, so an anonymous caller there is a wiring bug, refused as 403
(DRF turns Django's PermissionDenied into its own 403 answer)."""

from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from rest_framework.request import Request


def caller(request: HttpRequest | Request) -> User:
    """The authenticated user behind a request; PermissionDenied for an anonymous one."""
    user = request.user
    if isinstance(user, AnonymousUser) or not user.is_authenticated:
        raise PermissionDenied("sign in first")
    return user

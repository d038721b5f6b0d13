"""Who is calling the OpenAI-compatible endpoints (/v1/: serving's, and the fine-tuning and Tinker
adapters built on it): a Flywheel API token as the bearer key, or the signed-in browser (the
playground) with its CSRF token, within the REST API's per-user rate. Every refusal is OpenAI's error
object. Not a view module, so the other apps' views import it without importing serving's views."""

import math

from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import CsrfViewMiddleware
from rest_framework import exceptions
from rest_framework.request import Request

from core.throttling import RedisRateThrottle
from inference.openai_protocol import OpenAIError
from projects.token_auth import ApiTokenAuthentication


def _csrf_ok(request: HttpRequest) -> bool:
    check = CsrfViewMiddleware(_never_called)
    check.process_request(request)
    return check.process_view(request, _never_called, (), {}) is None


def _never_called(request: HttpRequest) -> HttpResponse:
    """The next handler and the view the CSRF middleware is given: a check alone calls neither."""
    raise AssertionError("the CSRF check called its view")


def caller(request: HttpRequest) -> User:
    """The authenticated caller, within the REST API's per-user rate (FLYWHEEL_API_RATE, one
    budget for both): an OpenAI 429 past it."""
    user = _authenticated(request)
    throttle = RedisRateThrottle()
    checked = Request(request)
    checked.user = user
    if not throttle.allow_request(checked, None):
        wait = max(1, math.ceil(throttle.wait() or 1))
        message = f"Rate limit reached ({throttle.rate} per user): retry in {wait} s"
        raise OpenAIError(429, message, None, "rate_limit_exceeded", {"Retry-After": str(wait)})
    return user


def _authenticated(request: HttpRequest) -> User:
    """The user behind the bearer token, or the signed-in browser user (whose POSTs carry the CSRF
    token); an OpenAI 401 for anyone else."""
    if request.headers.get("Authorization"):
        try:
            found = ApiTokenAuthentication().authenticate(Request(request))
        except exceptions.Throttled as exc:
            raise OpenAIError(429, str(exc.detail), None, "rate_limit_exceeded") from exc
        except exceptions.AuthenticationFailed as exc:
            raise OpenAIError(401, f"Incorrect API key: {exc.detail}", None, "invalid_api_key") from exc
        if found is None:
            raise OpenAIError(401, "Authorization must be 'Bearer <token>'", None, "invalid_api_key")
        return found[0]
    if isinstance(request.user, User) and request.user.is_authenticated:
        if request.method == "POST" and not _csrf_ok(request):
            raise OpenAIError(403, "CSRF check failed: send the page's CSRF token", None, "csrf_failed")
        return request.user
    raise OpenAIError(
        401,
        "You didn't provide an API key: send a Flywheel API token as 'Authorization: Bearer <token>'.",
        None,
        "invalid_api_key",
    )

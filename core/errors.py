"""Error pages: JSON in the API's one error shape under /api/, HTML elsewhere; and bad input that
would reach the database as a 500 turned into the client's error it is."""

import re

from django.core.exceptions import SuspiciousOperation
from django.db import DataError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.defaults import bad_request as html_bad_request
from django.views.defaults import page_not_found
from django.views.defaults import server_error as html_server_error

from core.api import INT64_MAX, error_body

DIGITS = re.compile(r"^[+-]?\d+$")


def is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api(request):
        return JsonResponse(error_body(404, "no such endpoint or object"), status=404)
    return page_not_found(request, exception)


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Django's own refusals (a body or a form over its limits, a bad Host): the error shape."""
    if is_api(request):
        message = str(exception) if isinstance(exception, SuspiciousOperation) and str(exception) else ""
        return JsonResponse(error_body(400, message or "bad request"), status=400)
    return html_bad_request(request, exception)  # type: ignore[arg-type]  # Django always passes one


def server_error(request: HttpRequest) -> HttpResponse:
    if is_api(request):
        return JsonResponse(error_body(500, "internal error; it has been logged"), status=500)
    return html_server_error(request)


def out_of_range_answer(request: HttpRequest, param: str | None) -> HttpResponse:
    bound = f"Ensure this value is less than or equal to {INT64_MAX}."  # DRF's words for the same
    message = f"{param}: {bound}" if param else "a number is out of range"
    if is_api(request):
        details = [{"param": param, "message": bound}] if param else []
        return JsonResponse(error_body(400, message, param, details), status=400)
    raise Http404(message)


def oversized_parameter(request: HttpRequest, kwargs: dict) -> str | None:
    """The name of a path, query or form parameter holding an integer beyond 64 bits."""
    for name, value in kwargs.items():
        if isinstance(value, int) and abs(value) > INT64_MAX:
            return name
    for source in (request.GET, request.POST if request.content_type != "multipart/form-data" else {}):
        for name, value in source.items():
            if DIGITS.match(value.strip()) and len(value) < 4000 and abs(int(value)) > INT64_MAX:
                return name
    return None


class OutOfRangeMiddleware:
    """An id in the path beyond what a 64-bit column holds answers 400 naming it (API) or 404
    (pages) before any view runs; a number that still overflows the database on the way in
    (a page's filter, say) answers the same instead of a 500."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_view(self, request: HttpRequest, view_func, view_args, view_kwargs) -> HttpResponse | None:
        for name, value in view_kwargs.items():
            if isinstance(value, int) and value > INT64_MAX:
                return out_of_range_answer(request, name)
        return None

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        # SQLite: "Python int too large to convert to SQLite INTEGER"; PostgreSQL: out of range.
        overflow = isinstance(exception, OverflowError) or (
            isinstance(exception, DataError) and "out of range" in str(exception)
        )
        if not overflow:
            return None
        match = getattr(request, "resolver_match", None)
        return out_of_range_answer(request, oversized_parameter(request, match.kwargs if match else {}))

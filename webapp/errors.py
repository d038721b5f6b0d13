"""Error pages: JSON in the API's one error shape under /api/, HTML elsewhere."""

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.defaults import page_not_found
from django.views.defaults import server_error as html_server_error

from webapp.api import error_body


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse(error_body(404, "no such endpoint or object"), status=404)
    return page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse(error_body(500, "internal error; it has been logged"), status=500)
    return html_server_error(request)

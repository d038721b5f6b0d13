"""Which client method speaks to which REST operation. Every method of a resource that calls the
API is marked with `@endpoint(METHOD, PATH)`; the test suite compares these with the server's
OpenAPI schema, so an operation without a client method fails it."""

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
ENDPOINT_ATTRIBUTE = "__flywheel_endpoint__"


def endpoint(method: str, path: str) -> Callable[[F], F]:
    """Mark a method as the client's way to `method path` (path below /api/v1, as in the schema)."""

    def mark(function: F) -> F:
        setattr(function, ENDPOINT_ATTRIBUTE, (method.upper(), path))
        return function

    return mark


def endpoints_of(obj: object) -> dict[tuple[str, str], str]:
    """(method, path) → 'resource.method' for every marked method of a client's resources."""
    found = {}
    for resource_name in dir(obj):
        if resource_name.startswith("_"):
            continue
        resource = getattr(obj, resource_name)
        for name in dir(type(resource)):
            mark = getattr(getattr(type(resource), name, None), ENDPOINT_ATTRIBUTE, None)
            if mark is not None:
                found[mark] = f"{resource_name}.{name}"
    return found

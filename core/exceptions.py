"""Exceptions every app raises, and the one error shape the API core answers them in."""


class StateError(Exception):
    """The object's current state does not allow this change (answers 409)."""


CODES = {
    400: "invalid_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    415: "unsupported_media_type",
    422: "unprocessable",
    429: "rate_limited",
    503: "service_unavailable",
}


def error_body(
    status_code: int,
    message: str,
    param: str | None = None,
    details: list | None = None,
    code: str | None = None,
) -> dict:
    return {
        "error": {
            "code": code or CODES.get(status_code, "error"),
            "message": message,
            "param": param,
            "details": details or [],
        }
    }

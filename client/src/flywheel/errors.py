"""Exceptions that carry the API's error shape: `{"error": {"code", "message", "param", "details"}}`."""

from typing import Any


class FlywheelError(Exception):
    """Anything the client raises on purpose."""


class ConfigurationError(FlywheelError):
    """The client is missing its URL or token, or was given a bad one."""


class APIError(FlywheelError):
    """The server answered with an error status; its code, message, param and details are kept."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str = "error",
        param: str | None = None,
        details: list[dict[str, Any]] | None = None,
        method: str = "",
        url: str = "",
    ) -> None:
        self.status, self.code, self.message = status, code, message
        self.param, self.details = param, details or []
        self.method, self.url = method, url
        super().__init__(f"{status} {code}: {message}" + (f" ({method} {url})" if method else ""))

    @classmethod
    def from_response(
        cls, status: int, body: Any, text: str, *, method: str = "", url: str = ""
    ) -> "APIError":
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            code, param, details = str(error.get("code") or "error"), error.get("param"), error.get("details")
            message = str(error.get("message") or text)
        else:  # not the API's error shape (a proxy's page, say): its text is the message
            code, param, details = "error", None, None
            message = (text.strip() or f"HTTP {status}")[:500]
        kind = ERRORS_BY_STATUS.get(status, ServerError if status >= 500 else APIError)
        return kind(status, message, code=code, param=param, details=details, method=method, url=url)


class BadRequestError(APIError):
    """400: the request is invalid; `details` names every bad field (and, for an import, the line)."""


class UnauthenticatedError(APIError):
    """401: no token, or a revoked or unknown one."""


class ForbiddenError(APIError):
    """403: your role in the project does not allow this."""


class NotFoundError(APIError):
    """404: no such object, or one of a project you are not a member of."""


class ConflictError(APIError):
    """409: the object's state does not allow this (nothing changed)."""


class UnprocessableError(APIError):
    """422: understood but refused, e.g. an idempotency key reused with another body."""


class RateLimitedError(APIError):
    """429: too many requests (retried with backoff before this is raised)."""


class ServerError(APIError):
    """5xx: the server failed (retried with backoff before this is raised)."""


ERRORS_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequestError,
    401: UnauthenticatedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    422: UnprocessableError,
    429: RateLimitedError,
}

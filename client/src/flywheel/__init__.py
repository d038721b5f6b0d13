"""Flywheel's Python client: every REST resource, live runs over websockets, and trace logging.

from flywheel import Client
client = Client()  # FLYWHEEL_URL, FLYWHEEL_TOKEN
for run in client.runs.list(status="running"):
    print(run["id"], run["name"])
"""

from flywheel.client import Client
from flywheel.errors import (
    APIError,
    BadRequestError,
    ConfigurationError,
    ConflictError,
    FlywheelError,
    ForbiddenError,
    NotFoundError,
    RateLimitedError,
    ServerError,
    UnauthenticatedError,
    UnprocessableError,
)

__version__ = "0.1.0"
__all__ = [
    "APIError",
    "BadRequestError",
    "Client",
    "ConfigurationError",
    "ConflictError",
    "FlywheelError",
    "ForbiddenError",
    "NotFoundError",
    "RateLimitedError",
    "ServerError",
    "UnauthenticatedError",
    "UnprocessableError",
]

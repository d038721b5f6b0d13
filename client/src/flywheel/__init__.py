"""Flywheel's Python client: every REST resource, live runs over websockets, and trace logging.

from flywheel import Client
client = Client()  # FLYWHEEL_URL, FLYWHEEL_TOKEN
for run in client.runs.list(status="running"):
    print(run.id, run.name)  # or run["id"]: answers are Records, dicts with attribute access

from flywheel import AsyncFlywheel
async with AsyncFlywheel() as client:
    run = await client.runs.get(7)
"""

from flywheel._records import (
    Checkpoint,
    Project,
    Record,
    RewardRule,
    RewardRuleVersion,
    Run,
    RunEvent,
    TaskSet,
    TaskSetVersion,
    Tier,
)
from flywheel.client import AsyncFlywheel, Client, Flywheel
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

__version__ = "0.2.0"
__all__ = [
    "APIError",
    "AsyncFlywheel",
    "BadRequestError",
    "Checkpoint",
    "Client",
    "ConfigurationError",
    "ConflictError",
    "Flywheel",
    "FlywheelError",
    "ForbiddenError",
    "NotFoundError",
    "Project",
    "RateLimitedError",
    "Record",
    "RewardRule",
    "RewardRuleVersion",
    "Run",
    "RunEvent",
    "ServerError",
    "TaskSet",
    "TaskSetVersion",
    "Tier",
    "UnauthenticatedError",
    "UnprocessableError",
]

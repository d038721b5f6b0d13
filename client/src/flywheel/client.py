"""The Flywheel clients: `Client()` (also `Flywheel`) and `AsyncFlywheel()` read FLYWHEEL_URL and
FLYWHEEL_TOKEN (or take url= and token=) and hold one resource object per REST resource. Both are
built from the same resource classes (`RESOURCES`, their methods declared with `@endpoint`): the
async client puts them on an AsyncTransport, so each method answers a coroutine (lists: an async
iterator) and nothing is written twice."""

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

from flywheel import _follow
from flywheel._batcher import TraceBatcher
from flywheel._http import JSON, AsyncTransport, Transport
from flywheel.errors import ConfigurationError
from flywheel.resources import (
    Checkpoints,
    Costs,
    Episodes,
    EvalSuites,
    Me,
    Ops,
    Projects,
    Reviews,
    RewardModels,
    RewardRules,
    Runs,
    Sweeps,
    Tasks,
    TaskSets,
    Tiers,
    Tokens,
    Traces,
    Trajectories,
    Webhooks,
)

DEFAULT_URL = "http://127.0.0.1:8000"
RESOURCES = {
    "me": Me,
    "projects": Projects,
    "task_sets": TaskSets,
    "tasks": Tasks,
    "tiers": Tiers,
    "tokens": Tokens,
    "runs": Runs,
    "trajectories": Trajectories,
    "checkpoints": Checkpoints,
    "reward_rules": RewardRules,
    "reviews": Reviews,
    "webhooks": Webhooks,
    "traces": Traces,
    "reward_models": RewardModels,
    "eval_suites": EvalSuites,
    "ops": Ops,
    "costs": Costs,
    "sweeps": Sweeps,
    "episodes": Episodes,
}
TRACE_FIELDS = {
    "prompt",
    "messages",
    "completion",
    "model",
    "tier",
    "score",
    "success",
    "feedback",
    "latency_ms",
    "metadata",
    "timestamp",
}


class _Resources:
    """The resource attributes both clients hold (spelled out for editors and type checkers)."""

    me: Me
    projects: Projects
    task_sets: TaskSets
    tasks: Tasks
    tiers: Tiers
    tokens: Tokens
    runs: Runs
    trajectories: Trajectories
    checkpoints: Checkpoints
    reward_rules: RewardRules
    reviews: Reviews
    webhooks: Webhooks
    traces: Traces
    reward_models: RewardModels
    eval_suites: EvalSuites
    ops: Ops
    costs: Costs
    sweeps: Sweeps
    episodes: Episodes

    def _attach_resources(self, transport: Transport | AsyncTransport) -> None:
        for name, resource in RESOURCES.items():
            setattr(self, name, resource(transport))


def _configuration(url: str | None, token: str | None, project: int | None) -> tuple[str, str, int | None]:
    url = url or os.environ.get("FLYWHEEL_URL") or DEFAULT_URL
    token = token or os.environ.get("FLYWHEEL_TOKEN", "")
    env_project = os.environ.get("FLYWHEEL_PROJECT", "")
    if project is None and env_project.isdigit():
        project = int(env_project)
    return url, token, project


class Client(_Resources):
    """A Flywheel server, as its REST API and websockets offer it.

    >>> client = Client(url="http://127.0.0.1:8000", token="fw_example")
    >>> {"runs", "task_sets", "checkpoints"} <= set(vars(client))
    True
    >>> client.close()
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        project: int | None = None,
        timeout: float = 60.0,
        max_retries: int = 4,
        trace_batch_size: int = 100,
        trace_flush_interval: float = 1.0,
        http: httpx.Client | None = None,
    ) -> None:
        url, token, self.project = _configuration(url, token, project)
        self._transport = Transport(url=url, token=token, timeout=timeout, max_retries=max_retries, http=http)
        self._trace_batch_size, self._trace_flush_interval = trace_batch_size, trace_flush_interval
        self._batcher: TraceBatcher | None = None
        self._attach_resources(self._transport)

    @property
    def url(self) -> str:
        return self._transport.url

    def follow(self, run: int | JSON) -> Iterator[JSON]:
        """The run's live messages over its websocket until it ends (see flywheel._follow)."""
        run_id = run["id"] if isinstance(run, dict) else int(run)
        return _follow.follow(self._transport, run_id)

    def log_trace(self, *, id: str | None = None, project: int | None = None, **fields: Any) -> str:  # noqa: A002
        """Queue a trace for the background batcher and return its id (made up when not given).

        Fields as `POST /api/v1/traces` takes them: prompt or messages, completion, model or tier,
        score, success, feedback ({"thumbs", "correction", "comment"}), latency_ms, metadata,
        timestamp. Reporting an id again (with only `feedback`, say) updates that trace.
        """
        unknown = sorted(set(fields) - TRACE_FIELDS)
        if unknown:
            known = ", ".join(sorted(TRACE_FIELDS))
            raise TypeError(f"log_trace() got unknown fields {', '.join(unknown)}; known: {known}")
        project = project if project is not None else self.project
        if project is None:
            raise ConfigurationError(
                "log_trace needs a project: Client(project=...), FLYWHEEL_PROJECT or project="
            )
        trace_id = id or str(uuid.uuid4())
        if self._batcher is None:
            self._batcher = TraceBatcher(
                lambda p, batch: self.traces.ingest(p, batch),
                batch_size=self._trace_batch_size,
                interval=self._trace_flush_interval,
            )
        self._batcher.put(project, {"id": trace_id} | {k: v for k, v in fields.items() if v is not None})
        return trace_id

    def flush(self) -> None:
        """Send every trace queued by log_trace now."""
        if self._batcher is not None:
            self._batcher.flush()

    def close(self) -> None:
        if self._batcher is not None:
            self._batcher.close()
        self._transport.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


Flywheel = Client


class AsyncFlywheel(_Resources):
    """The same resources and methods as Client, on httpx.AsyncClient: `await` each call, and
    `async for` over lists and exports.

    >>> import asyncio
    >>> async def names():
    ...     async with AsyncFlywheel(url="http://127.0.0.1:8000", token="fw_example") as client:
    ...         return {"runs", "task_sets", "checkpoints"} <= set(vars(client))
    >>> asyncio.run(names())
    True
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        project: int | None = None,
        timeout: float = 60.0,
        max_retries: int = 4,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        url, token, self.project = _configuration(url, token, project)
        self._transport = AsyncTransport(
            url=url, token=token, timeout=timeout, max_retries=max_retries, http=http
        )
        self._attach_resources(self._transport)

    @property
    def url(self) -> str:
        return self._transport.url

    def follow(self, run: int | JSON) -> AsyncIterator[JSON]:
        """The run's live messages, as Client.follow gives them: `async for message in ...`."""
        run_id = run["id"] if isinstance(run, dict) else int(run)
        return _follow.follow_async(self._transport, run_id)

    async def close(self) -> None:
        await self._transport.close()

    async def __aenter__(self) -> "AsyncFlywheel":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

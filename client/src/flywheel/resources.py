"""One class per REST resource. Lists are iterators over every page (`limit` sets the page size);
creating calls send an idempotency key (pass `idempotency_key=` to choose it, e.g. to retry a
create across processes); everything returns the API's JSON objects as `Record`s (dicts that
read their keys as attributes too).

Each method is written once and works on either transport: on `Transport` (Client) it answers
the value, on `AsyncTransport` (AsyncFlywheel) a coroutine to await, and a list an async iterator.
A method must therefore only build the request and return the transport's answer."""

from __future__ import annotations

import builtins  # `builtins.list` where a class's own `list` method would shadow it
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from flywheel._endpoints import endpoint
from flywheel._http import JSON, AsyncTransport, Transport
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


class Readable(Protocol):
    """An open binary file, or anything that reads like one (the command line's progress bar file)."""

    def read(self, size: int = -1, /) -> bytes: ...


class Resource:
    """The calls every resource makes. Each answers `Any` to a type checker because the answer
    depends on the transport: the value on a Transport, a coroutine of it (a list: an async iterator)
    on an AsyncTransport. The public methods' annotations name the sync client's answers."""

    def __init__(self, transport: Transport | AsyncTransport) -> None:
        self._t = transport

    # `shape`: the Record class of the answer's object (or of each object of a list).
    def _get(self, path: str, shape: type[Record] = Record, **params: Any) -> Any:
        return self._t.json("GET", path, params=params, shape=shape)

    def _list(self, path: str, shape: type[Record] = Record, **params: Any) -> Any:
        return self._t.pages(path, params, shape=shape)

    def _post(
        self, path: str, body: Any = None, *, idempotency_key: str | None = None, shape: type[Record] = Record
    ) -> Any:
        return self._t.json("POST", path, json_body=body, idempotency_key=idempotency_key, shape=shape)

    def _upload(self, path: str, *, shape: type[Record] = Record, **request: Any) -> Any:
        """A multipart POST: `request` holds the transport's files=, data= and idempotency_key=."""
        return self._t.json("POST", path, shape=shape, **request)

    def _patch(self, path: str, body: Any, shape: type[Record] = Record) -> Any:
        return self._t.json("PATCH", path, json_body=body, shape=shape)

    def _delete(self, path: str) -> Any:
        # Returned, not dropped: on an AsyncTransport it is the coroutine the caller awaits.
        return self._t.json("DELETE", path)

    def _lines(self, path: str, params: dict[str, Any] | None = None) -> Any:
        return self._t.lines(path, params)

    def _download(self, path: str, out: str | os.PathLike, **request: Any) -> Any:
        return self._t.download(path, out, **request)


def _body(**fields: Any) -> JSON:
    """Fields that were given (None means: leave it to the server's default)."""
    return {key: value for key, value in fields.items() if value is not None}


class Me(Resource):
    @endpoint("GET", "/me")
    def get(self) -> Record:
        """The caller and their role in each project."""
        return self._get("/api/v1/me")


class Projects(Resource):
    @endpoint("GET", "/projects")
    def list(self, *, limit: int | None = None) -> Iterator[Project]:
        return self._list("/api/v1/projects", limit=limit, shape=Project)

    @endpoint("POST", "/projects")
    def create(
        self, name: str, *, description: str | None = None, idempotency_key: str | None = None
    ) -> Project:
        return self._post(
            "/api/v1/projects",
            _body(name=name, description=description),
            idempotency_key=idempotency_key,
            shape=Project,
        )

    @endpoint("GET", "/projects/{id}")
    def get(self, project: int) -> Project:
        return self._get(f"/api/v1/projects/{project}", shape=Project)

    @endpoint("PATCH", "/projects/{id}")
    def update(self, project: int, *, name: str | None = None, description: str | None = None) -> Project:
        return self._patch(
            f"/api/v1/projects/{project}", _body(name=name, description=description), shape=Project
        )

    @endpoint("DELETE", "/projects/{id}")
    def delete(self, project: int) -> None:
        return self._delete(f"/api/v1/projects/{project}")

    @endpoint("GET", "/projects/{id}/quota")
    def quota(self, project: int) -> Record:
        """The project's quotas of active runs (`max_active_runs`, `default`) and of GPU workers
        (`max_gpu_workers`, 0: no limit; `gpu_workers_default`), with their use (`active`,
        `gpu_workers`) and `queued`."""
        return self._get(f"/api/v1/projects/{project}/quota")

    @endpoint("PATCH", "/projects/{id}/quota")
    def set_quota(self, project: int, **quotas: int | None) -> Record:
        """Owners: `max_active_runs` (runs of the project active at once) and/or `max_gpu_workers`
        (learner workers, GPUs on a GPU host, its active runs may hold; 0: no limit), the ones
        given; None returns one to the server's default. Queued runs start where they leave room."""
        return self._patch(f"/api/v1/projects/{project}/quota", quotas)

    @endpoint("GET", "/projects/{id}/members")
    def members(self, project: int, *, limit: int | None = None) -> Iterator[Record]:
        return self._list(f"/api/v1/projects/{project}/members", limit=limit)

    @endpoint("POST", "/projects/{id}/members")
    def add_member(self, project: int, username: str, role: str) -> Record:
        return self._post(f"/api/v1/projects/{project}/members", {"username": username, "role": role})

    @endpoint("PATCH", "/projects/{id}/members/{user_id}")
    def set_role(self, project: int, user: int, role: str) -> Record:
        return self._patch(f"/api/v1/projects/{project}/members/{user}", {"role": role})

    @endpoint("DELETE", "/projects/{id}/members/{user_id}")
    def remove_member(self, project: int, user: int) -> None:
        return self._delete(f"/api/v1/projects/{project}/members/{user}")


class TaskSets(Resource):
    @endpoint("GET", "/task-sets")
    def list(self, *, project: int | None = None, limit: int | None = None) -> Iterator[TaskSet]:
        return self._list("/api/v1/task-sets", project=project, limit=limit, shape=TaskSet)

    @endpoint("POST", "/task-sets")
    def create(
        self,
        project: int,
        name: str,
        *,
        description: str | None = None,
        file: str | os.PathLike | Readable | None = None,
        format: str | None = None,  # the API's own name for it
        split_seed: int | None = None,
        heldout_fraction: float | None = None,
        dry_run: bool = False,
        idempotency_key: str | None = None,
    ) -> TaskSet:
        """Create a task set. With `file` (a path or an open binary file), the set is created with
        the file as its first version (`version`), or, when the file has any error, not at all:
        BadRequestError, whose `details` name each line and field. `dry_run`: validate only."""
        if file is None:
            body = _body(project=project, name=name, description=description)
            return self._post("/api/v1/task-sets", body, idempotency_key=idempotency_key, shape=TaskSet)
        # A path is opened by the transport, only while the request is sent (by either transport).
        upload_name = Path(
            file if isinstance(file, (str, os.PathLike)) else getattr(file, "name", "tasks.jsonl")
        ).name
        data = _body(
            project=project,
            name=name,
            description=description,
            format=format,
            split_seed=split_seed,
            heldout_fraction=heldout_fraction,
            dry_run="true" if dry_run else None,
        )
        return self._upload(
            "/api/v1/task-sets",
            files={"file": (upload_name, file)},
            data=data,
            idempotency_key=idempotency_key,
            shape=TaskSet,
        )

    @endpoint("GET", "/task-sets/{id}")
    def get(self, task_set: int) -> TaskSet:
        return self._get(f"/api/v1/task-sets/{task_set}", shape=TaskSet)

    @endpoint("PATCH", "/task-sets/{id}")
    def update(self, task_set: int, *, name: str | None = None, description: str | None = None) -> TaskSet:
        return self._patch(
            f"/api/v1/task-sets/{task_set}", _body(name=name, description=description), shape=TaskSet
        )

    @endpoint("POST", "/task-sets/{id}/import")
    def import_file(
        self,
        task_set: int,
        file: str | os.PathLike | Readable,
        *,
        dry_run: bool = False,
        format: str | None = None,  # the API's own name for it
        split_seed: int | None = None,
        heldout_fraction: float | None = None,
        verify_references: bool = False,
        idempotency_key: str | None = None,
    ) -> TaskSetVersion:
        """Import a JSONL or CSV file (a path or an open binary file) as a new version. A file with
        any error imports nothing and raises BadRequestError, whose `details` name each line and field.
        `format`: auto (the default: published HumanEval, MBPP, APPS, CodeContests and LiveCodeBench
        lines are recognised by their fields), or one of them to force it.
        `verify_references`: then run each code item's reference against its tests (`references`)."""
        # A path is opened by the transport, only while the request is sent (by either transport).
        name = Path(
            file if isinstance(file, (str, os.PathLike)) else getattr(file, "name", "tasks.jsonl")
        ).name
        data = _body(
            dry_run="true" if dry_run else None,
            format=format,
            split_seed=split_seed,
            heldout_fraction=heldout_fraction,
            verify_references="true" if verify_references else None,
        )
        return self._upload(
            f"/api/v1/task-sets/{task_set}/import",
            files={"file": (name, file)},
            data=data,
            idempotency_key=idempotency_key,
            shape=TaskSetVersion,
        )

    @endpoint("GET", "/task-sets/{id}/versions")
    def versions(self, task_set: int, *, limit: int | None = None) -> Iterator[TaskSetVersion]:
        return self._list(f"/api/v1/task-sets/{task_set}/versions", limit=limit, shape=TaskSetVersion)

    @endpoint("GET", "/task-sets/{id}/versions/{number}")
    def version(self, task_set: int, number: int) -> TaskSetVersion:
        return self._get(f"/api/v1/task-sets/{task_set}/versions/{number}", shape=TaskSetVersion)

    @endpoint("GET", "/task-sets/{id}/versions/{number}/export")
    def export(self, task_set: int, number: int) -> Iterator[Record]:
        """The version's items as the file it was made from, one object a line."""
        return self._lines(f"/api/v1/task-sets/{task_set}/versions/{number}/export")

    @endpoint("POST", "/task-sets/{id}/versions/{number}/verify")
    def verify(self, task_set: int, number: int) -> Record:
        """Run each code item's reference_solution against its own tests in the sandbox: `broken`
        names every item whose reference fails, with the reason."""
        return self._post(f"/api/v1/task-sets/{task_set}/versions/{number}/verify", {})

    @endpoint("POST", "/task-sets/{id}/versions/{number}/split")
    def resplit(
        self, task_set: int, number: int, *, split_seed: int, heldout_fraction: float | None = None
    ) -> Record:
        body = _body(split_seed=split_seed, heldout_fraction=heldout_fraction)
        return self._post(f"/api/v1/task-sets/{task_set}/versions/{number}/split", body)


class Tasks(Resource):
    @endpoint("GET", "/tasks")
    def list(
        self,
        *,
        version: int | None = None,
        kind: str | None = None,
        split: str | None = None,
        q: str | None = None,
        limit: int | None = None,
    ) -> Iterator[Record]:
        return self._list("/api/v1/tasks", version=version, kind=kind, split=split, q=q, limit=limit)

    @endpoint("GET", "/tasks/{id}")
    def get(self, task: int) -> Record:
        return self._get(f"/api/v1/tasks/{task}")


class Tiers(Resource):
    @endpoint("GET", "/tiers")
    def list(self, *, project: int | None = None, limit: int | None = None) -> Iterator[Tier]:
        return self._list("/api/v1/tiers", project=project, limit=limit, shape=Tier)

    @endpoint("POST", "/tiers")
    def create(
        self, project: int, name: str, base_model: str, *, idempotency_key: str | None = None, **settings: Any
    ) -> Tier:
        """A tier; `settings` are its other fields (precision, temperature, max_new_tokens, ...)."""
        body = {"project": project, "name": name, "base_model": base_model} | settings
        return self._post("/api/v1/tiers", body, idempotency_key=idempotency_key, shape=Tier)

    @endpoint("GET", "/tiers/{id}")
    def get(self, tier: int) -> Tier:
        return self._get(f"/api/v1/tiers/{tier}", shape=Tier)

    @endpoint("PATCH", "/tiers/{id}")
    def update(self, tier: int, **settings: Any) -> Tier:
        return self._patch(f"/api/v1/tiers/{tier}", settings, shape=Tier)

    @endpoint("DELETE", "/tiers/{id}")
    def delete(self, tier: int) -> None:
        return self._delete(f"/api/v1/tiers/{tier}")

    @endpoint("POST", "/tiers/{id}/evaluate")
    def evaluate(self, tier: int, *, idempotency_key: str | None = None, **request: Any) -> Record:
        """Measure a checkpoint under this tier (and others: `tiers=[...]`) on held-out items."""
        return self._post(f"/api/v1/tiers/{tier}/evaluate", request, idempotency_key=idempotency_key)

    @endpoint("GET", "/tier-evaluations/{id}")
    def evaluation(self, evaluation: int) -> Record:
        return self._get(f"/api/v1/tier-evaluations/{evaluation}")


class Tokens(Resource):
    @endpoint("GET", "/tokens")
    def list(self, *, limit: int | None = None) -> Iterator[Record]:
        return self._list("/api/v1/tokens", limit=limit)

    @endpoint("POST", "/tokens")
    def create(self, name: str, *, default_project: int | None = None) -> Record:
        """A new token; its secret is in the answer this once. `default_project` is where the
        OpenAI-compatible routes act when a call sends no OpenAI-Project header."""
        return self._post("/api/v1/tokens", _body(name=name, default_project=default_project))

    @endpoint("DELETE", "/tokens/{id}")
    def revoke(self, token: int) -> None:
        return self._delete(f"/api/v1/tokens/{token}")


class Runs(Resource):
    @endpoint("GET", "/runs")
    def list(
        self, *, project: int | None = None, status: str | None = None, limit: int | None = None
    ) -> Iterator[Run]:
        return self._list("/api/v1/runs", project=project, status=status, limit=limit, shape=Run)

    @endpoint("POST", "/runs")
    def launch(
        self,
        *,
        project: int,
        name: str,
        task_set_version: int,
        reward_rule_version: int,
        tier: int,
        method: str = "grpo",
        hyperparameters: dict[str, Any] | None = None,
        max_steps: int | None = None,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> Run:
        """Launch a run. A run that would fail at its first step raises BadRequestError naming every
        reason. `options`: max_wall_seconds, max_sandbox_cpu_seconds, budget_money, budget_device_hours,
        priority, train_split, eval_split."""
        body = _body(
            project=project,
            name=name,
            task_set_version=task_set_version,
            reward_rule_version=reward_rule_version,
            tier=tier,
            method=method,
            hyperparameters=hyperparameters,
            max_steps=max_steps,
        )
        return self._post("/api/v1/runs", body | options, idempotency_key=idempotency_key, shape=Run)

    @endpoint("GET", "/runs/{id}")
    def get(self, run: int) -> Run:
        return self._get(f"/api/v1/runs/{run}", shape=Run)

    @endpoint("POST", "/runs/{id}/pause")
    def pause(self, run: int) -> Run:
        return self._post(f"/api/v1/runs/{run}/pause", shape=Run)

    @endpoint("POST", "/runs/{id}/resume")
    def resume(self, run: int) -> Run:
        return self._post(f"/api/v1/runs/{run}/resume", shape=Run)

    @endpoint("POST", "/runs/{id}/cancel")
    def cancel(self, run: int) -> Run:
        return self._post(f"/api/v1/runs/{run}/cancel", shape=Run)

    @endpoint("POST", "/runs/{id}/retry")
    def retry(self, run: int) -> Run:
        return self._post(f"/api/v1/runs/{run}/retry", shape=Run)

    @endpoint("POST", "/runs/{id}/clone")
    def clone(self, run: int, *, idempotency_key: str | None = None, **changes: Any) -> Run:
        return self._post(f"/api/v1/runs/{run}/clone", changes, idempotency_key=idempotency_key, shape=Run)

    @endpoint("GET", "/runs/{id}/events")
    def events(
        self, run: int, *, since: int | None = None, level: str | None = None, limit: int | None = None
    ) -> Iterator[RunEvent]:
        """Newest first; with `since` (an event id), the later ones oldest first."""
        return self._list(f"/api/v1/runs/{run}/events", since=since, level=level, limit=limit, shape=RunEvent)

    @endpoint("GET", "/runs/{id}/metrics")
    def metrics(
        self,
        run: int,
        *,
        names: builtins.list[str] | None = None,
        since_step: int | None = None,
        max_points: int | None = None,
    ) -> Record:
        params: JSON = {"name": names, "since_step": since_step, "max_points": max_points}
        return self._get(f"/api/v1/runs/{run}/metrics", **params)

    @endpoint("GET", "/runs/{id}/heldout-compare")
    def heldout_compare(
        self,
        run: int,
        *,
        against: int | None = None,
        step: int | None = None,
        against_step: int | None = None,
        change: str | None = None,
        kind: str | None = None,
        metric: str | None = None,
    ) -> Record:
        """Held-out results item by item against another run (a control) or this run's start,
        with a paired bootstrap interval on the change."""
        params: JSON = {"against": against, "step": step, "against_step": against_step, "change": change}
        return self._get(f"/api/v1/runs/{run}/heldout-compare", **params, kind=kind, metric=metric)

    @endpoint("GET", "/runs/{id}/monitors")
    def monitors(self, run: int) -> Record:
        return self._get(f"/api/v1/runs/{run}/monitors")

    @endpoint("PATCH", "/runs/{id}/monitors")
    def set_monitors(
        self, run: int, *, thresholds: dict[str, float | None] | None = None, **changes: Any
    ) -> Record:
        return self._patch(f"/api/v1/runs/{run}/monitors", _body(thresholds=thresholds) | changes)

    @endpoint("GET", "/runs/{id}/train-on-reviews")
    def review_training_preview(self, run: int) -> Record:
        """What Train on reviews would make of the run's reviews, for SFT and for DPO."""
        return self._get(f"/api/v1/runs/{run}/train-on-reviews")

    @endpoint("POST", "/runs/{id}/train-on-reviews")
    def train_on_reviews(
        self,
        run: int,
        method: str,
        *,
        name: str | None = None,
        max_steps: int | None = None,
        hyperparameters: dict[str, Any] | None = None,
        task_set_name: str | None = None,
        idempotency_key: str | None = None,
    ) -> Record:
        body = _body(
            method=method,
            name=name,
            max_steps=max_steps,
            hyperparameters=hyperparameters,
            task_set_name=task_set_name,
        )
        return self._post(f"/api/v1/runs/{run}/train-on-reviews", body, idempotency_key=idempotency_key)

    @endpoint("GET", "/review-trainings/{id}")
    def review_training(self, training: int) -> Record:
        """A Train on reviews' result: the reviews run's held-out lift over its control (paired,
        with the interval), beside each run's figure against the parent checkpoint; `training` is
        the id the train_on_reviews answer gives."""
        return self._get(f"/api/v1/review-trainings/{training}")


class Trajectories(Resource):
    @endpoint("GET", "/trajectories")
    def list(self, *, run: int | None = None, limit: int | None = None, **filters: Any) -> Iterator[Record]:
        """Filters: outcome, policy_version, min_reward, max_reward, step, batch, item, task,
        flagged, flag, label, after."""
        return self._list("/api/v1/trajectories", run=run, limit=limit, **filters)

    @endpoint("GET", "/trajectories/{id}")
    def get(self, trajectory: int) -> Record:
        return self._get(f"/api/v1/trajectories/{trajectory}")

    @endpoint("GET", "/trajectories/{id}/steps")
    def steps(self, trajectory: int, *, index: int | None = None) -> Iterator[Record]:
        return self._list(f"/api/v1/trajectories/{trajectory}/steps", index=index)

    @endpoint("GET", "/trajectories/{id}/group")
    def group(self, trajectory: int) -> Iterator[Record]:
        return self._list(f"/api/v1/trajectories/{trajectory}/group")


class Checkpoints(Resource):
    @endpoint("GET", "/checkpoints")
    def list(self, *, run: int | None = None, limit: int | None = None) -> Iterator[Checkpoint]:
        return self._list("/api/v1/checkpoints", run=run, limit=limit, shape=Checkpoint)

    @endpoint("GET", "/checkpoints/{id}")
    def get(self, checkpoint: int) -> Checkpoint:
        return self._get(f"/api/v1/checkpoints/{checkpoint}", shape=Checkpoint)

    @endpoint("POST", "/checkpoints/{id}/fork")
    def fork(self, checkpoint: int, *, idempotency_key: str | None = None, **changes: Any) -> Record:
        return self._post(f"/api/v1/checkpoints/{checkpoint}/fork", changes, idempotency_key=idempotency_key)

    @endpoint("GET", "/runs/{id}/checkpoints/{step}/export")
    def export(
        self,
        run: int,
        step: int,
        out: str | os.PathLike,
        *,
        archive: str = "tar.gz",
        weights: str = "full",
        progress: Callable[[int], Any] | None = None,
    ) -> Path:
        """Download the checkpoint of `run` at `step` as a save_pretrained folder with a model card,
        archived (`tar.gz` or `zip`), to the file `out`; `weights="adapter"` keeps a LoRA run's
        adapter apart from its base. Streamed to disk, never held in memory; `progress` is told
        the bytes of each chunk."""
        return self._download(
            f"/api/v1/runs/{run}/checkpoints/{step}/export",
            out,
            params={"archive": archive, "weights": weights},
            progress=progress,
        )


class RewardRules(Resource):
    @endpoint("GET", "/reward-rules")
    def list(self, *, project: int | None = None, limit: int | None = None) -> Iterator[RewardRule]:
        return self._list("/api/v1/reward-rules", project=project, limit=limit, shape=RewardRule)

    @endpoint("POST", "/reward-rules")
    def create(
        self,
        project: int,
        name: str,
        spec: JSON,
        *,
        description: str | None = None,
        idempotency_key: str | None = None,
    ) -> RewardRule:
        body = _body(project=project, name=name, spec=spec, description=description)
        return self._post("/api/v1/reward-rules", body, idempotency_key=idempotency_key, shape=RewardRule)

    @endpoint("POST", "/reward-rules/validate")
    def validate(self, spec: JSON, *, item_kind: str | None = None) -> Record:
        return self._post("/api/v1/reward-rules/validate", _body(spec=spec, item_kind=item_kind))

    @endpoint("POST", "/reward-rules/import-openai")
    def import_openai(self, project: int, name: str, grader: JSON, **fields: Any) -> Record:
        body = {"project": project, "name": name, "grader": grader} | fields
        return self._post("/api/v1/reward-rules/import-openai", body)

    @endpoint("GET", "/reward-rules/{id}")
    def get(self, rule: int) -> RewardRule:
        return self._get(f"/api/v1/reward-rules/{rule}", shape=RewardRule)

    @endpoint("PATCH", "/reward-rules/{id}")
    def update(self, rule: int, **changes: Any) -> RewardRule:
        """A changed `spec` makes a new version; a version a run used is never modified."""
        return self._patch(f"/api/v1/reward-rules/{rule}", changes, shape=RewardRule)

    @endpoint("DELETE", "/reward-rules/{id}")
    def delete(self, rule: int) -> None:
        return self._delete(f"/api/v1/reward-rules/{rule}")

    @endpoint("GET", "/reward-rules/{id}/versions")
    def versions(self, rule: int, *, limit: int | None = None) -> Iterator[RewardRuleVersion]:
        return self._list(f"/api/v1/reward-rules/{rule}/versions", limit=limit, shape=RewardRuleVersion)

    @endpoint("GET", "/reward-rules/{id}/versions/{number}")
    def version(self, rule: int, number: int) -> RewardRuleVersion:
        return self._get(f"/api/v1/reward-rules/{rule}/versions/{number}", shape=RewardRuleVersion)

    @endpoint("GET", "/reward-rules/{id}/versions/{number}/openai")
    def openai(self, rule: int, number: int) -> Record:
        """The version as OpenAI grader JSON."""
        return self._get(f"/api/v1/reward-rules/{rule}/versions/{number}/openai")

    @endpoint("GET", "/reward-rules/{id}/diff")
    def diff(self, rule: int, from_version: int, to_version: int) -> Record:
        versions: JSON = {"from": from_version, "to": to_version}  # `from` is a keyword in Python
        return self._get(f"/api/v1/reward-rules/{rule}/diff", **versions)

    @endpoint("POST", "/reward-rules/{id}/dry-run")
    def dry_run(self, rule: int, **request: Any) -> Record:
        """Score pasted items and completions: `items`, `samples`, optionally `version`, `spec`."""
        return self._post(f"/api/v1/reward-rules/{rule}/dry-run", request)

    @endpoint("POST", "/reward-rules/{id}/backtest")
    def backtest(self, rule: int, **request: Any) -> Record:
        return self._post(f"/api/v1/reward-rules/{rule}/backtest", request)


class Reviews(Resource):
    @endpoint("GET", "/reviews")
    def list(self, *, limit: int | None = None, **filters: Any) -> Iterator[Record]:
        """Filters: run, trajectory, trace, label, reviewer."""
        return self._list("/api/v1/reviews", limit=limit, **filters)

    @endpoint("POST", "/reviews")
    def label(
        self,
        label: str,
        *,
        trajectory: int | None = None,
        trace: int | None = None,
        comment: str | None = None,
    ) -> Record:
        """Label a trajectory or a trace (good, bad, reward_hack, infrastructure_error)."""
        return self._post(
            "/api/v1/reviews", _body(trajectory=trajectory, trace=trace, label=label, comment=comment)
        )

    @endpoint("GET", "/reviews/{id}")
    def get(self, review: int) -> Record:
        return self._get(f"/api/v1/reviews/{review}")

    @endpoint("DELETE", "/reviews/{id}")
    def delete(self, review: int) -> None:
        return self._delete(f"/api/v1/reviews/{review}")

    @endpoint("GET", "/reviews/export")
    def export(self, run: int, kind: str = "sft") -> Iterator[Record]:
        """The run's reviewed data (sft, dpo or dpo-task-set), one object a line; kind="labels" gives
        every label and comment (trajectory, item, reviewer, label, comment, reward, outcome, times)."""
        return self._lines("/api/v1/reviews/export", {"run": run, "kind": kind})

    @endpoint("GET", "/preferences")
    def preferences(self, *, run: int | None = None, limit: int | None = None) -> Iterator[Record]:
        return self._list("/api/v1/preferences", run=run, limit=limit)

    @endpoint("POST", "/preferences")
    def prefer(self, chosen: int, rejected: int, *, comment: str | None = None) -> Record:
        return self._post("/api/v1/preferences", _body(chosen=chosen, rejected=rejected, comment=comment))

    @endpoint("GET", "/review-queues")
    def queues(
        self,
        *,
        run: int | None = None,
        project: int | None = None,
        source: str | None = None,
        limit: int | None = None,
    ) -> Iterator[Record]:
        return self._list("/api/v1/review-queues", run=run, project=project, source=source, limit=limit)

    @endpoint("POST", "/review-queues")
    def create_queue(
        self,
        name: str,
        *,
        run: int | None = None,
        project: int | None = None,
        filters: JSON | None = None,
        trace_filters: JSON | None = None,
        limit: int | None = None,
    ) -> Record:
        """A queue over a run's trajectories (run=, filters=) or a project's traces (project=,
        trace_filters=)."""
        source = "traces" if project is not None and run is None else "trajectories"
        body = _body(
            source=source,
            name=name,
            run=run,
            project=project,
            filters=filters,
            trace_filters=trace_filters,
            limit=limit,
        )
        return self._post("/api/v1/review-queues", body)

    @endpoint("GET", "/review-queues/{id}")
    def queue(self, queue: int) -> Record:
        return self._get(f"/api/v1/review-queues/{queue}")

    @endpoint("GET", "/review-queues/{id}/items")
    def queue_items(self, queue: int, *, limit: int | None = None) -> Iterator[Record]:
        return self._list(f"/api/v1/review-queues/{queue}/items", limit=limit)

    @endpoint("POST", "/review-queues/{id}/assign")
    def assign(self, queue: int, reviewers: builtins.list[int], *, reassign: bool = False) -> Record:
        return self._post(
            f"/api/v1/review-queues/{queue}/assign", {"reviewers": reviewers, "reassign": reassign}
        )

    @endpoint("POST", "/review-queues/{id}/next")
    def next(self, queue: int) -> Record | None:
        """The caller's next item, or None when nothing is left for them."""
        return self._post(f"/api/v1/review-queues/{queue}/next")


class Webhooks(Resource):
    @endpoint("GET", "/webhooks")
    def list(self, *, project: int | None = None, limit: int | None = None) -> Iterator[Record]:
        return self._list("/api/v1/webhooks", project=project, limit=limit)

    @endpoint("POST", "/webhooks")
    def create(self, project: int, url: str, *, idempotency_key: str | None = None, **fields: Any) -> Record:
        """A webhook (`description`, `statuses`, `events`, `active`); its secret is in this answer only."""
        return self._post(
            "/api/v1/webhooks", {"project": project, "url": url} | fields, idempotency_key=idempotency_key
        )

    @endpoint("GET", "/webhooks/{id}")
    def get(self, webhook: int) -> Record:
        return self._get(f"/api/v1/webhooks/{webhook}")

    @endpoint("PATCH", "/webhooks/{id}")
    def update(self, webhook: int, **changes: Any) -> Record:
        return self._patch(f"/api/v1/webhooks/{webhook}", changes)

    @endpoint("DELETE", "/webhooks/{id}")
    def delete(self, webhook: int) -> None:
        return self._delete(f"/api/v1/webhooks/{webhook}")

    @endpoint("GET", "/webhooks/{id}/deliveries")
    def deliveries(
        self, webhook: int, *, status: str | None = None, limit: int | None = None
    ) -> Iterator[Record]:
        return self._list(f"/api/v1/webhooks/{webhook}/deliveries", status=status, limit=limit)

    @endpoint("POST", "/webhooks/{id}/deliveries/{delivery_id}/redeliver")
    def redeliver(self, webhook: int, delivery: int) -> Record:
        return self._post(f"/api/v1/webhooks/{webhook}/deliveries/{delivery}/redeliver")

    @endpoint("POST", "/webhooks/{id}/ping")
    def ping(self, webhook: int) -> Record:
        return self._post(f"/api/v1/webhooks/{webhook}/ping")

    @endpoint("POST", "/webhooks/{id}/rotate-secret")
    def rotate_secret(self, webhook: int) -> Record:
        return self._post(f"/api/v1/webhooks/{webhook}/rotate-secret")


class Traces(Resource):
    @endpoint("GET", "/traces")
    def list(
        self, *, project: int | None = None, limit: int | None = None, **filters: Any
    ) -> Iterator[Record]:
        """Filters: q, trace_id, model, tier, thumbs, success, has_correction, min_score,
        max_score, since, until, label, meta ("key:value")."""
        return self._list("/api/v1/traces", project=project, limit=limit, **filters)

    @endpoint("POST", "/traces")
    def ingest(
        self, project: int, traces: builtins.list[JSON], *, idempotency_key: str | None = None
    ) -> Record:
        """Report a batch of traces now (see Client.log_trace for background batching)."""
        return self._post(
            "/api/v1/traces", {"project": project, "traces": traces}, idempotency_key=idempotency_key
        )

    @endpoint("GET", "/traces/{id}")
    def get(self, trace: int) -> Record:
        return self._get(f"/api/v1/traces/{trace}")

    @endpoint("DELETE", "/traces/{id}")
    def delete(self, trace: int) -> None:
        return self._delete(f"/api/v1/traces/{trace}")

    @endpoint("POST", "/traces/promote")
    def promote(
        self,
        project: int,
        *,
        traces: builtins.list[int] | None = None,
        filters: JSON | None = None,
        task_set: int | None = None,
        task_set_name: str | None = None,
        split: str | None = None,
        idempotency_key: str | None = None,
    ) -> Record:
        """Traces (by id, or every one matching `filters`) to a new task-set version; the items land
        in `split` (train by default, heldout, or auto for the set's seeded rule)."""
        body = _body(
            project=project,
            traces=traces,
            filters=filters,
            task_set=task_set,
            task_set_name=task_set_name,
            split=split,
        )
        return self._post("/api/v1/traces/promote", body, idempotency_key=idempotency_key)


class RewardModels(Resource):
    @endpoint("GET", "/reward-models")
    def list(self, *, project: int | None = None, limit: int | None = None) -> Iterator[Record]:
        return self._list("/api/v1/reward-models", project=project, limit=limit)

    @endpoint("POST", "/reward-models")
    def create(
        self, project: int, name: str, *, description: str | None = None, idempotency_key: str | None = None
    ) -> Record:
        body = _body(project=project, name=name, description=description)
        return self._post("/api/v1/reward-models", body, idempotency_key=idempotency_key)

    @endpoint("GET", "/reward-models/{id}")
    def get(self, reward_model: int) -> Record:
        """The reward model with its newest version (status, held-out pair accuracy)."""
        return self._get(f"/api/v1/reward-models/{reward_model}")

    @endpoint("DELETE", "/reward-models/{id}")
    def delete(self, reward_model: int) -> None:
        return self._delete(f"/api/v1/reward-models/{reward_model}")

    @endpoint("GET", "/reward-models/{id}/versions")
    def versions(self, reward_model: int, *, limit: int | None = None) -> Iterator[Record]:
        return self._list(f"/api/v1/reward-models/{reward_model}/versions", limit=limit)

    @endpoint("POST", "/reward-models/{id}/train")
    def train(
        self,
        reward_model: int,
        task_set_version: int,
        *,
        tier: int | None = None,
        base_model: str | None = None,
        hyperparameters: JSON | None = None,
        idempotency_key: str | None = None,
    ) -> Record:
        """A new version, queued for training on the task-set version's preference pairs."""
        body = _body(
            task_set_version=task_set_version,
            tier=tier,
            base_model=base_model,
            hyperparameters=hyperparameters,
        )
        return self._post(
            f"/api/v1/reward-models/{reward_model}/train", body, idempotency_key=idempotency_key
        )

    @endpoint("POST", "/reward-models/{id}/versions/{number}/score")
    def score(
        self,
        reward_model: int,
        number: int,
        *,
        texts: builtins.list[JSON] | None = None,
        pairs: builtins.list[JSON] | None = None,
    ) -> Record:
        """Score with a trained version: `texts` ({prompt, completion}) answer `scores`; `pairs`
        ({prompt, chosen, rejected}) answer each pair's scores, margin and the share ranked right."""
        body = _body(texts=texts, pairs=pairs)
        return self._post(f"/api/v1/reward-models/{reward_model}/versions/{number}/score", body)

    @endpoint("GET", "/reward-model-versions/{id}")
    def version(self, version: int) -> Record:
        """A version: status, step of steps, loss history, held-out pair accuracy before and after."""
        return self._get(f"/api/v1/reward-model-versions/{version}")

    @endpoint("POST", "/reward-model-versions/{id}/cancel")
    def cancel(self, version: int) -> Record:
        return self._post(f"/api/v1/reward-model-versions/{version}/cancel")

    @endpoint("GET", "/runs/{id}/reward-models")
    def of_run(self, run: int) -> Iterator[Record]:
        """The reward-model versions a run's rewards used (every page)."""
        return self._list(f"/api/v1/runs/{run}/reward-models")


class EvalSuites(Resource):
    @endpoint("GET", "/eval-suites")
    def list(self, *, project: int | None = None, limit: int | None = None) -> Iterator[Record]:
        return self._list("/api/v1/eval-suites", project=project, limit=limit)

    @endpoint("POST", "/eval-suites")
    def create(
        self,
        project: int,
        name: str,
        *,
        description: str | None = None,
        entries: builtins.list[JSON] | None = None,
        sampling: JSON | None = None,
        idempotency_key: str | None = None,
    ) -> Record:
        """A suite; with `entries` ({task_set_version, split, reward_rule_version, limit}), its
        version 1 too, sampled as `sampling` says ({samples, k, temperature, pass_threshold})."""
        body = _body(project=project, name=name, description=description, entries=entries, sampling=sampling)
        return self._post("/api/v1/eval-suites", body, idempotency_key=idempotency_key)

    @endpoint("GET", "/eval-suites/{id}")
    def get(self, suite: int) -> Record:
        """The suite with its versions, newest first."""
        return self._get(f"/api/v1/eval-suites/{suite}")

    @endpoint("POST", "/eval-suites/{id}/versions")
    def add_version(
        self,
        suite: int,
        entries: builtins.list[JSON],
        *,
        sampling: JSON | None = None,
        note: str | None = None,
        idempotency_key: str | None = None,
    ) -> Record:
        body = _body(entries=entries, sampling=sampling, note=note)
        return self._post(f"/api/v1/eval-suites/{suite}/versions", body, idempotency_key=idempotency_key)

    @endpoint("POST", "/eval-suites/{id}/evaluate")
    def evaluate(
        self,
        suite: int,
        *,
        suite_version: int | None = None,
        run: int | None = None,
        version: int | None = None,
        checkpoint: int | None = None,
        tier: int | None = None,
        idempotency_key: str | None = None,
    ) -> Record:
        """Queue an evaluation of the suite (its newest version, or `suite_version`) on one target:
        a run's policy version (`run`, `version`), a `checkpoint`, or a `tier` as it is."""
        body = _body(suite_version=suite_version, run=run, version=version, checkpoint=checkpoint, tier=tier)
        return self._post(f"/api/v1/eval-suites/{suite}/evaluate", body, idempotency_key=idempotency_key)

    @endpoint("GET", "/suite-evaluations/{id}")
    def evaluation(self, evaluation: int) -> Record:
        """Its status and figures, overall and per entry."""
        return self._get(f"/api/v1/suite-evaluations/{evaluation}")

    @endpoint("GET", "/suite-evaluations/{id}/results")
    def results(
        self, evaluation: int, *, entry: int | None = None, limit: int | None = None
    ) -> Iterator[Record]:
        """Its results per item, with the first completions."""
        return self._list(f"/api/v1/suite-evaluations/{evaluation}/results", entry=entry, limit=limit)

    @endpoint("GET", "/suite-evaluations/{id}/compare")
    def compare(
        self, evaluation: int, *, against: int, change: str | None = None, kind: str | None = None
    ) -> Record:
        """This evaluation against another of the same suite version, item by item, with a paired
        bootstrap interval on the change in pass rate."""
        path = f"/api/v1/suite-evaluations/{evaluation}/compare"
        return self._get(path, against=against, change=change, kind=kind)


class Ops(Resource):
    @endpoint("GET", "/ops/overview")
    def overview(self) -> Record:
        """Workers by queue and host (alive, gone or stopped; what each runs), queue depths and the
        oldest wait, Redis and database latency, sandboxes and recent failures. Project owners
        and staff only; runs of projects the caller is not in are not named."""
        return self._get("/api/v1/ops/overview")


class Episodes(Resource):
    """Episodes of a run of `external_rollouts`, played by your own agent: `start` hands out a task
    and an episode id; the agent calls the run's policy on /v1/chat/completions as model
    `run-<id>` with the id in the `X-Flywheel-Episode` header (or `metadata={"episode_id": id}`),
    then `report`s the outcome once. `start` raises ConflictError while every episode of the open
    batches is being played: ask again shortly."""

    @endpoint("POST", "/runs/{id}/episodes")
    def start(self, run: int) -> Record:
        return self._post(f"/api/v1/runs/{run}/episodes")

    @endpoint("GET", "/runs/{id}/episodes")
    def list(self, run: int, *, status: str | None = None, limit: int | None = None) -> Iterator[Record]:
        return self._list(f"/api/v1/runs/{run}/episodes", status=status, limit=limit)

    @endpoint("GET", "/runs/{id}/episodes/{key}")
    def get(self, run: int, episode: str) -> Record:
        return self._get(f"/api/v1/runs/{run}/episodes/{episode}")

    @endpoint("GET", "/runs/{id}/episodes/counts")
    def counts(self, run: int) -> Record:
        """How many of the run's episodes are open, scoring, reported, timed out and cancelled."""
        return self._get(f"/api/v1/runs/{run}/episodes/counts")

    @endpoint("POST", "/runs/{id}/episodes/{key}/outcome")
    def report(
        self,
        run: int,
        episode: str,
        *,
        reward: float | None = None,
        components: dict[str, float] | None = None,
        final: str | None = None,
    ) -> Record:
        """End the episode with its `reward` (and per-component rewards), or with its `final`
        answer for the run's reward rule to score. Once: a second report raises ConflictError."""
        return self._post(
            f"/api/v1/runs/{run}/episodes/{episode}/outcome",
            _body(reward=reward, components=components, final=final),
        )


class Sweeps(Resource):
    """Many runs of one template over varied parameters (hyperparameters.<key>, tier, base_model,
    reward_rule_version), searched (grid, random, tpe), stopped early when losing (median, asha on
    a held-out figure) and kept within a budget (max_runs, max_device_hours, max_money) and a
    concurrency limit. Each trial is an ordinary run (`runs.get(trial["run"])`)."""

    @endpoint("POST", "/projects/{id}/sweeps")
    def create(
        self,
        project: int,
        *,
        name: str,
        template: dict[str, Any],
        parameters: list[dict[str, Any]],
        search: str = "tpe",
        idempotency_key: str | None = None,
        **settings: Any,
    ) -> Record:
        """Start a sweep. `template` holds a launch's fields (task_set_version, reward_rule_version,
        tier, method, hyperparameters, max_steps...); each parameter is {name, values} or {name,
        low, high, log}. `settings`: seed, metric, direction, early_stopping, min_steps,
        reduction_factor, max_runs, max_device_hours, max_money, concurrency. Bad input raises
        ValidationError naming each field (parameters.1.values)."""
        body = {"name": name, "template": template, "parameters": parameters, "search": search} | settings
        return self._post(f"/api/v1/projects/{project}/sweeps", body, idempotency_key=idempotency_key)

    @endpoint("GET", "/projects/{id}/sweeps")
    def list(self, project: int, *, limit: int | None = None) -> Iterator[Record]:
        return self._list(f"/api/v1/projects/{project}/sweeps", limit=limit)

    @endpoint("GET", "/projects/{id}/sweeps/{sweep_id}")
    def get(self, project: int, sweep: int) -> Record:
        """The sweep, its trials (params, state, objective, cost, why stopped), its best trial, its
        spend and, across base models, each model's lift and cost."""
        return self._get(f"/api/v1/projects/{project}/sweeps/{sweep}")

    @endpoint("POST", "/projects/{id}/sweeps/{sweep_id}/cancel")
    def cancel(self, project: int, sweep: int) -> Record:
        """Stop launching and cancel the active runs; a sweep already ended raises ConflictError."""
        return self._post(f"/api/v1/projects/{project}/sweeps/{sweep}/cancel")


class Costs(Resource):
    """What runs use and cost: units (device-seconds, CPU-seconds, tokens, storage) and money at
    the operator's prices, by kind and by step; budgets that pause a run or refuse a launch."""

    @endpoint("POST", "/runs/estimate")
    def estimate(
        self,
        *,
        project: int,
        task_set_version: int,
        reward_rule_version: int,
        tier: int,
        method: str = "grpo",
        hyperparameters: dict[str, Any] | None = None,
        max_steps: int | None = None,
        calibrate: bool = False,
        **options: Any,
    ) -> Record:
        """What a launch with these fields would use (device-hours, sandbox CPU-hours, wall seconds,
        money: each low, expected, high), from earlier runs of its tier and method; `basis` is None
        when there are none. Nothing is launched, unless `calibrate` (launchers): then a short
        calibration run of this tier, method and batch shape is launched (or the active one kept),
        shown in `calibration`, and the estimate rests on its steps once it has recorded two."""
        body = _body(
            project=project,
            task_set_version=task_set_version,
            reward_rule_version=reward_rule_version,
            tier=tier,
            method=method,
            hyperparameters=hyperparameters,
            max_steps=max_steps,
        )
        return self._post(
            "/api/v1/runs/estimate", body | ({"calibrate": True} if calibrate else {}) | options
        )

    @endpoint("GET", "/runs/{id}/cost")
    def of_run(self, run: int) -> Record:
        """The run's units and money: in all, by kind (learner, rollout, storage) and per step."""
        return self._get(f"/api/v1/runs/{run}/cost")

    @endpoint("PATCH", "/runs/{id}/budget")
    def set_run_budget(self, run: int, **budget: Any) -> Record:
        """Owners: `budget_money` and/or `budget_device_hours` (None removes one); a run paused at
        its budget then goes on with `runs.resume`."""
        return self._patch(f"/api/v1/runs/{run}/budget", budget)

    @endpoint("GET", "/projects/{id}/costs")
    def of_project(self, project: int, *, since: str | None = None, until: str | None = None) -> Record:
        """The project's units and money recorded in [since, until) (ISO 8601), per run and per user."""
        return self._get(f"/api/v1/projects/{project}/costs", since=since, until=until)

    @endpoint("GET", "/projects/{id}/budget")
    def project_budget(self, project: int) -> Record:
        return self._get(f"/api/v1/projects/{project}/budget")

    @endpoint("PATCH", "/projects/{id}/budget")
    def set_project_budget(self, project: int, monthly: str | None) -> Record:
        """Owners: money a month (a decimal string); None removes it. Past it, launches are refused."""
        return self._patch(f"/api/v1/projects/{project}/budget", {"monthly": monthly})

    @endpoint("GET", "/prices")
    def prices(self, *, limit: int | None = None) -> Iterator[Record]:
        return self._list("/api/v1/prices", limit=limit)

    @endpoint("POST", "/prices")
    def set_price(
        self, unit: str, amount: str, *, scope: str | None = None, effective_from: str | None = None
    ) -> Record:
        """Staff: a price of `unit` (device_hour, cpu_hour, engine_mtok_in, engine_mtok_out,
        gb_month) from `effective_from` (now by default); earlier units keep their price."""
        return self._post(
            "/api/v1/prices", _body(unit=unit, amount=amount, scope=scope, effective_from=effective_from)
        )

"""What a worker records of its own work for costs/: the device it holds and a step part's key.

Units are measured where the work happens (the rollout worker's generation time on its device,
the learner's training time on each of its devices), never sampled from outside.
"""

import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from costs.services import rollout_component, usage_record
from inference.decoding import device_class
from runs.models import RolloutBatch, Trajectory

__all__ = ["GraderCalls", "device_class", "rollout_component", "rollout_usage_record", "worker_name"]


_FIRST_WORK_DONE: set[str] = set()
_FIRST_WORK_LOCK = threading.Lock()


def warm_up_first(kind: str) -> bool:
    """True the first time this process records work of `kind` (learner, rollout), else False.
    A process's first step or batch carries its start-up (the model's first forward, compiled
    kernels, lazily imported code, the sandbox pool's first forks): recorded as a warm-up, an
    estimate leaves it out of the steady rates (costs/estimates.py). A forked child starts with
    its parent's set, and a parent that supervises never records, so each child starts cold."""
    with _FIRST_WORK_LOCK:
        first = kind not in _FIRST_WORK_DONE
        _FIRST_WORK_DONE.add(kind)
    return first


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class GraderCalls:
    """A batch's judge verdicts and reward-model scores, counted as its graders ask for them
    (graders may run in threads): each judge call is one verdict, each scored completion one
    reward-model call."""

    def __init__(self) -> None:
        self.judge = 0
        self.reward_model = 0
        self._lock = threading.Lock()

    def judge_of(self, judge: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.judge += 1
            return judge(*args, **kwargs)

        return counted

    def reward_models_of(self, scorer: Callable[..., Any]) -> Callable[..., Any]:
        def counted(name: str, number: int | None, prompts: list, completions: list) -> Any:
            with self._lock:
                self.reward_model += len(completions)
            return scorer(name, number, prompts, completions)

        return counted


def rollout_usage_record(
    batch: RolloutBatch,
    *,
    device: str,
    device_seconds: float,
    cpu_seconds: float,
    engine: str = "",
    calls: GraderCalls | None = None,
) -> None:
    """A finished batch's units, at its step (learner step batch.step + 1): tokens of the
    episodes stored for it (the first copy where two workers finished it)."""
    stored = Trajectory.objects.filter(batch=batch).values_list("prompt_tokens", "completion_tokens")
    prefilled = sum(row[0] for row in stored)
    sampled = sum(row[1] for row in stored)
    engine_units = {"engine_tokens_in": prefilled, "engine_tokens_out": sampled} if engine else {}
    usage_record(
        run_id=batch.run_id,
        step=batch.step + 1,
        component=rollout_component(batch.item_ids),
        kind="rollout",
        worker=worker_name(),
        warm_up=warm_up_first("rollout"),
        device_class="" if engine else device,
        engine=engine,
        device_seconds=0.0 if engine else device_seconds,
        cpu_seconds=cpu_seconds,
        tokens_prefilled=prefilled,
        tokens_sampled=sampled,
        judge_calls=calls.judge if calls else 0,
        reward_model_calls=calls.reward_model if calls else 0,
        **engine_units,
    )

"""`verifiers` environments against Flywheel: `flywheel env run` plays a run of `external_rollouts`
with an environment's own rollout and rubric (the rubric's reward is the episode's reward, each
reward function a component), and `flywheel env eval` scores a model on items with the rubric.

verifiers pins versions of openai and mcp other than the server's, so it lives in a virtualenv of
its own (`make verifiers-venv`); it is imported only when an environment is loaded.

A Flywheel item becomes the environment's dataset row (`flywheel_row` below) unless the
environment's module defines `flywheel_row(task) -> dict` of its own:

- `prompt`: the item's `messages`, else its `prompt` as the user's turn; the environment's system
  prompt goes first when it has one and the messages have none;
- `answer`: the item's `answer`, else its `reference` (an answer item's), else its
  `reference_solution` (a code item's), else "";
- `info`: the item itself (its tests, entry point, metadata, ...).
"""

import asyncio
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flywheel.client import Client
from flywheel.errors import ConflictError

MISSING = (
    "flywheel env needs the verifiers package, which pins versions of its own: "
    "run it from the verifiers virtualenv: make verifiers-venv, then .venv-verifiers/bin/flywheel env ..."
)
LIVE = ("queued", "running")
GIVE_UP_AFTER = 16  # episodes failing before any succeeds: the environment itself is broken
RowMapper = Callable[[dict], dict]


@dataclass
class LoadedEnvironment:
    env: Any  # a verifiers Environment
    row: RowMapper


@dataclass
class Tally:
    """What a run or an evaluation has played so far: counts and the rubric's mean reward."""

    failed: int = 0
    rewards: list[float] = field(default_factory=list)
    components: dict[str, list[float]] = field(default_factory=dict)

    @property
    def played(self) -> int:
        return len(self.rewards)

    def add(self, reward: float, components: dict[str, float]) -> None:
        self.rewards.append(reward)
        for name, value in components.items():
            self.components.setdefault(name, []).append(value)

    def summary(self) -> dict[str, Any]:
        def mean(values: list[float]) -> float | None:
            return sum(values) / len(values) if values else None

        return {
            "played": self.played,
            "failed": self.failed,
            "reward": mean(self.rewards),
            "components": {name: mean(values) for name, values in self.components.items()},
        }


def flywheel_row(task: dict, system_prompt: str | None = None) -> dict:
    """A Flywheel item as a verifiers dataset row (the mapping the module docstring states)."""
    messages = list(task.get("messages") or [{"role": "user", "content": task.get("prompt", "")}])
    if system_prompt and not any(m.get("role") == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": system_prompt})
    answer = task.get("answer", task.get("reference", task.get("reference_solution", "")))
    return {
        "prompt": messages,
        "answer": answer if isinstance(answer, str) else json.dumps(answer),
        "info": task,
    }


def import_environment_module(source: str) -> Any:
    """A module path (`my_envs.math`) or a Python file exposing `load_environment`."""
    if source.endswith(".py") or os.sep in source:
        path = Path(source).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"no environment file {source}")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {source}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(source)


def load_environment(source: str, arguments: dict[str, Any] | None = None) -> LoadedEnvironment:
    """The environment `source` loads, and how a Flywheel item becomes its row."""
    try:
        importlib.import_module("verifiers")
    except ImportError as exc:
        raise SystemExit(MISSING) from exc
    module = import_environment_module(source)
    if not hasattr(module, "load_environment"):
        raise SystemExit(f"{source} defines no load_environment()")
    env = module.load_environment(**(arguments or {}))
    own = getattr(module, "flywheel_row", None)
    system_prompt = getattr(env, "system_prompt", None)

    def row(task: dict) -> dict:
        mapped = own(task) if own is not None else flywheel_row(task)
        if system_prompt and not any(m.get("role") == "system" for m in mapped["prompt"]):
            mapped = mapped | {"prompt": [{"role": "system", "content": system_prompt}, *mapped["prompt"]]}
        return mapped

    return LoadedEnvironment(env=env, row=row)


def model_client(base_url: str, token: str | None, episode: str | None = None) -> Any:
    """verifiers' chat-completions client over an AsyncOpenAI one pointed at Flywheel's /v1, with the
    episode's id on every call when there is one."""
    from openai import AsyncOpenAI
    from verifiers.clients import OpenAIChatCompletionsClient

    headers = {"X-Flywheel-Episode": episode} if episode else {}
    openai_client = AsyncOpenAI(
        base_url=f"{base_url.rstrip('/')}/v1", api_key=token or "none", default_headers=headers, max_retries=0
    )
    return OpenAIChatCompletionsClient(openai_client)


async def rollout_scored(
    loaded: LoadedEnvironment, task: dict, client: Any, model: str, sampling: dict[str, Any], index: int
) -> tuple[float, dict[str, float]]:
    """One rollout of the item, scored by the environment's rubric: its reward and each function's."""
    row = loaded.row(task) | {"example_id": index}
    output = await loaded.env.run_rollout(row, client, model, sampling)
    if output.get("error"):
        raise RuntimeError(f"the rollout failed: {output['error']}")
    metrics = {name: float(value) for name, value in (output.get("metrics") or {}).items()}
    return float(output["reward"]), metrics


async def play_run(
    flywheel: Client,
    loaded: LoadedEnvironment,
    run: int,
    *,
    token: str,
    concurrency: int,
    sampling: dict[str, Any],
    on_played: Callable[[Tally], None],
) -> Tally:
    """Take the run's episodes until it ends, `concurrency` at a time: each rolled out against
    the episode's model with its id, and reported with the rubric's reward and components."""
    tally = Tally()

    def live() -> bool:
        return flywheel.runs.get(run)["status"] in LIVE

    async def player() -> None:
        while await asyncio.to_thread(live):
            try:
                episode = await asyncio.to_thread(flywheel.episodes.start, run)
            except ConflictError:  # every open episode is being played, or the learner is starting
                await asyncio.sleep(0.5)
                continue
            client = model_client(flywheel.url, token, episode["id"])
            try:
                reward, components = await rollout_scored(
                    loaded, episode["task"], client, episode["model"], sampling, tally.played
                )
            except Exception as exc:  # noqa: BLE001 - the episode times out on the server and is replayed
                tally.failed += 1
                print(f"flywheel env: episode {episode['id']} failed: {exc}", file=sys.stderr)
                if tally.failed >= GIVE_UP_AFTER and tally.played == 0:
                    raise SystemExit(f"flywheel env: the first {tally.failed} episodes all failed") from exc
                continue
            finally:
                await client.close()
            try:
                await asyncio.to_thread(
                    flywheel.episodes.report, run, episode["id"], reward=reward, components=components
                )
            except ConflictError:  # the run moved on (its batch closed) while this one played
                tally.failed += 1
                continue
            tally.add(reward, components)
            on_played(tally)

    await asyncio.gather(*(player() for _ in range(concurrency)))
    return tally


async def evaluate(
    loaded: LoadedEnvironment,
    items: list[dict],
    *,
    base_url: str,
    token: str | None,
    model: str,
    concurrency: int,
    sampling: dict[str, Any],
    repeats: int = 1,
) -> Tally:
    """The rubric's reward of `model` on every item (each `repeats` times), outside any run."""
    tally = Tally()
    gate = asyncio.Semaphore(concurrency)
    client = model_client(base_url, token)

    async def one(index: int, task: dict) -> None:
        async with gate:
            try:
                reward, components = await rollout_scored(loaded, task, client, model, sampling, index)
            except Exception as exc:  # noqa: BLE001 - counted as failed, the others go on
                tally.failed += 1
                print(f"flywheel env: item {task.get('id', index)} failed: {exc}", file=sys.stderr)
                return
            tally.add(reward, components)

    try:
        jobs = [one(i, task) for i, task in enumerate(items) for _ in range(repeats)]
        await asyncio.gather(*jobs)
    finally:
        await client.close()
    return tally


def read_items(path: str, split: str | None = None) -> list[dict]:
    """Flywheel items from a JSONL file (the lines a task set imports), optionally one split's."""
    with open(path) as lines:
        items = [json.loads(line) for line in lines if line.strip()]
    return [item for item in items if split is None or item.get("split", "train") == split]

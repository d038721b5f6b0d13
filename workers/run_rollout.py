"""The rollout side of a run: execute one RolloutBatch on a rollout worker.

A batch is claimed with a conditional update (pending → running), so a redelivered task does
nothing. The worker holding it renews its lease (`heartbeat_at`) every third of
FLYWHEEL_ROLLOUT_LEASE_SECONDS from a thread, however long its episodes take; a worker killed
mid-batch stops renewing, and the batch is claimed again one lease later, with a fresh episode
deadline, so its step waits for it instead of closing without its groups. Trajectories are
unique per (batch, item, sample), so a batch finished twice still stores each episode once.
The policy of the batch's version is loaded from the run's policy folder, once per process.
"""

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import lru_cache

import torch
from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from core import events
from core.leases import lease_kept
from episodes import services as episode_services
from episodes.models import Episode
from inference.adapters import is_adapter
from inference.chat import item_prompt
from inference.decoding import TierError, TierModel, decode, tier_adapter_serve, tier_prepare
from inference.engines import (
    Engine,
    EngineError,
    EngineTier,
    engine_adapter_load,
    engine_adapter_unload,
    engine_tier_load,
)
from inference.generation import Completion
from inference.policy import policy_load
from inference.records import completion_record
from inference.sessions import ChatSessions
from inference.settings import SamplingParams, TierSettings, engine_refusal
from projects.models import TaskItem
from reward_models.scoring import reward_models_scorer
from rewards.engine import Sample, ScoreResult, score_batch
from rewards.services import project_judge
from runs.lifecycle import run_event
from runs.models import RolloutBatch, Run, Trajectory, TrajectoryStep
from runs.run_store import policy_dir, policy_prefix
from sandboxes.sandbox import sandbox_cpu_seconds
from workers.agent import AgentEpisode, context_fits, episodes_play, policy_render
from workers.usage import GraderCalls, device_class, rollout_usage_record

logger = logging.getLogger(__name__)
MAX_ATTEMPTS = 3


def lease() -> timedelta:
    """A running batch whose worker has not renewed it this long is presumed to have lost it."""
    return timedelta(seconds=settings.FLYWHEEL_ROLLOUT_LEASE_SECONDS)


def lease_lapsed(now=None) -> Q:
    """Running batches whose holder stopped renewing (rows from before heartbeats: their claim)."""
    stale = (now or timezone.now()) - lease()
    return Q(status=RolloutBatch.Status.RUNNING) & (
        Q(heartbeat_at__lt=stale) | Q(heartbeat_at=None, claimed_at__lt=stale)
    )


def rollout_batch_claim(batch_id: int) -> RolloutBatch | None:
    """Take the batch if it is pending, or running with a lapsed lease; None otherwise. Taken
    from a dead worker, it gets a fresh episode deadline: its episodes were lost, not slow."""
    now = timezone.now()
    live_run = Q(pk=batch_id, run__status__in=(Run.Status.STARTING, Run.Status.RUNNING))
    claim = {
        "status": RolloutBatch.Status.RUNNING,
        "claimed_at": now,
        "heartbeat_at": now,
        "attempts": F("attempts") + 1,
        "worker": worker_name(),
    }
    changed = RolloutBatch.objects.filter(live_run, status=RolloutBatch.Status.PENDING).update(**claim)
    if not changed:
        orphan = RolloutBatch.objects.filter(live_run, lease_lapsed(now), attempts__lt=MAX_ATTEMPTS)
        deadline = orphan.values_list("run__resolved", "deadline_at").first()
        if deadline is not None:
            fresh = now + timedelta(seconds=float(deadline[0]["episode_deadline_seconds"]))
            changed = orphan.update(**claim, deadline_at=max(fresh, deadline[1] or fresh))
    return RolloutBatch.objects.select_related("run").get(pk=batch_id) if changed else None


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def rollout_batch_renew(batch: RolloutBatch) -> bool:
    """Renew this worker's lease on the batch; False once it is no longer ours to renew."""
    return bool(
        RolloutBatch.objects.filter(
            pk=batch.pk, status=RolloutBatch.Status.RUNNING, attempts=batch.attempts
        ).update(heartbeat_at=timezone.now())
    )


def _policy(run: Run, version: int) -> TierModel | EngineTier:
    """The version's policy prepared the run's tier's way (precision, draft model), kept per
    process. Keyed by its folder, which names the run's key: ids are reused by other databases.
    A LoRA run's version is an adapter, swapped into the base this process keeps resident."""
    return policy_version_load(run, version, tier_settings(run))


def policy_version_load(run: Run, version: int, settings: TierSettings) -> TierModel | EngineTier:
    if settings.remote:
        return engine_policy_load(run, version, settings)
    path = policy_dir(run.pk, version)
    if is_adapter(path) and settings.precision != "int8":
        return tier_adapter_serve(settings, path, version=version)
    return policy_at_path(str(path), version, settings)


def engine_adapter_name(run: Run, version: int) -> str:
    """The name a run's policy version is served under on an engine (the run's key: ids are
    reused by other databases sharing an engine)."""
    return f"run-{run.pk}-{str(run.key)[:8]}-v{version}"


def engine_policy_load(run: Run, version: int, settings: TierSettings) -> EngineTier:
    """The version on the tier's engine: a LoRA run's adapter loaded into it (the versions older
    than the staleness bound unloaded), else refused: an engine cannot load full weights."""
    if refusal := engine_refusal(settings, lora=run.resolved.get("adapter") == "lora"):
        raise TierError(f"tier {settings.name}: {refusal}")
    engine = Engine.of(settings)
    name = engine_adapter_name(run, version)
    try:
        engine_adapter_load(engine, name, policy_prefix(run.pk, version))
    except EngineError as exc:
        raise TierError(str(exc)) from exc
    keep = int(run.resolved.get("staleness", 1)) + 1
    for older in range(max(0, version - keep - 8), version - keep):
        engine_adapter_unload(engine, engine_adapter_name(run, older))
    return engine_tier_load(
        settings, served_model=name, version=version, adapter_artifact=policy_prefix(run.pk, version)
    )


@lru_cache(maxsize=2)
def policy_at_path(path: str, version: int, settings: TierSettings) -> TierModel:
    """The policy at `path` prepared for the tier, kept per process (the last two asked for)."""
    policy = policy_load(path)
    policy.version = version
    return tier_prepare(policy, settings)


def tier_settings(run: Run) -> TierSettings:
    """The run's tier settings (copied at launch) as generation applies them."""
    return TierSettings.from_config(run.tier_config)


def sampling_params(run: Run) -> SamplingParams:
    tier = run.tier_config
    return SamplingParams(
        max_new_tokens=tier["max_new_tokens"],
        temperature=tier["temperature"],
        top_p=tier["top_p"],
        top_k=tier["top_k"],
        stop=tuple(tier.get("stop") or ()),
    )


def item_dicts(item_ids: list[int]) -> list[dict]:
    """Items as the graders see them: their data plus id, kind and split, in the given order."""
    rows = {item.pk: item for item in TaskItem.objects.filter(pk__in=item_ids)}
    return [rows[pk].grading_dict() | {"pk": pk} for pk in item_ids]


def rollout_batch_run(batch_id: int) -> int:
    """Generate, score and store the batch's episodes; returns how many were stored. A failure
    puts the batch back for another attempt; after the last one its episodes are errored."""
    batch = rollout_batch_claim(batch_id)
    if batch is None:  # done, taken by a live worker, or its run stopped: a redelivery
        return 0
    every = settings.FLYWHEEL_ROLLOUT_LEASE_SECONDS / 3
    try:
        with lease_kept(lambda: rollout_batch_renew(batch), every=every, name=f"rollout-batch-{batch.pk}"):
            return _rollout(batch)
    except Exception as exc:  # noqa: BLE001 - whatever broke, the batch must not stay claimed
        logger.exception("rollout batch %s failed", batch.pk)
        rollout_batch_fail(batch, f"{type(exc).__name__}: {exc}")
        return 0


def _rollout(batch: RolloutBatch) -> int:
    """Short episodes (one completion) first, stored as soon as they are scored, then agent
    episodes in sandbox-pool-sized waves, each stored as it ends: a step that closes at its
    deadline has the short ones, however long the agents take."""
    run = batch.run
    group_size = int(run.resolved["group_size"])
    expanded = [item for item in item_dicts(batch.item_ids) for _ in range(group_size)]
    policy = _policy(run, batch.policy_version)
    clock = {"generate": 0.0}
    generator, settings = _generator(run, batch), tier_settings(run)
    started, cpu_before = time.monotonic(), sandbox_cpu_seconds()
    calls = GraderCalls()
    judge, reward_models = calls.judge_of(run_judge(run)), calls.reward_models_of(run_reward_models(run))

    def generate(prompts: list[str]) -> list[Completion]:
        began = time.monotonic()
        completions = decode(policy, prompts, settings, generator=generator)
        clock["generate"] += time.monotonic() - began
        return completions

    stored = 0
    short = [(index, item) for index, item in enumerate(expanded) if item["kind"] != "agent"]
    if short:
        played = _short_play(
            run, policy, short, generate, group_size, judge=judge, reward_models=reward_models
        )
        stored += _store(batch, played)
    agents = [(index, item) for index, item in enumerate(expanded) if item["kind"] == "agent"]
    if agents:
        stored += _agents_play(batch, run, policy, agents, generate, group_size, generator, judge=judge)
    elapsed, cpu = time.monotonic() - started, sandbox_cpu_seconds() - cpu_before
    # Only a batch still running ends as done: a rollback may have cancelled it meanwhile, and a
    # second worker that finished it too (the first was presumed dead) charges nothing twice. Done
    # and billed in one transaction: a worker killed between the two would leave a done batch
    # nobody bills (its reclaim finds it done), or, rolled back, a running one its reclaim bills.
    with transaction.atomic():
        finished = RolloutBatch.objects.filter(pk=batch.pk, status=RolloutBatch.Status.RUNNING).update(
            status=RolloutBatch.Status.DONE,
            finished_at=timezone.now(),
            generate_seconds=clock["generate"],
            score_seconds=max(0.0, elapsed - clock["generate"]),  # scoring, and agents in sandboxes
            sandbox_cpu_seconds=cpu,
        )
        if finished:
            Run.objects.filter(pk=run.pk).update(sandbox_cpu_seconds=F("sandbox_cpu_seconds") + cpu)
            rollout_usage_record(
                batch,
                device="" if isinstance(policy, EngineTier) else device_class(policy.device),
                device_seconds=clock["generate"],
                cpu_seconds=cpu,
                engine=settings.name if settings.remote else "",
                calls=calls,
            )
    events.run_event(run.pk, "rollout", {"batch": batch.index, "step": batch.step, "episodes": stored})
    return stored


@dataclass
class Played:
    """One finished episode, ready to store: its steps as (kind, data), and its grade."""

    item: dict
    sample_index: int
    steps: list[tuple[str, dict]]
    result: ScoreResult
    text: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float


def _short_play(
    run: Run, policy, short: list[tuple[int, dict]], generate, group_size: int, *, judge, reward_models
) -> list[Played]:
    started = time.monotonic()
    prompts = [policy.prompt_text(item_prompt(item)) for _, item in short]
    completions = generate(prompts)
    items = [item for _, item in short]
    texts = [completion.text for completion in completions]
    grades = grade(run.reward_rule_version.spec, items, texts, judge=judge, reward_models=reward_models)
    seconds = (time.monotonic() - started) / len(short)
    return [
        Played(
            item=item,
            sample_index=index % group_size,
            steps=[("completion", completion_record(prompt, completion) | _tool_result(result))],
            result=result,
            text=completion.text,
            prompt_tokens=len(completion.prompt_token_ids),
            completion_tokens=len(completion.token_ids),
            seconds=seconds,
        )
        for (index, item), prompt, completion, result in zip(short, prompts, completions, grades, strict=True)
    ]


def _tool_result(result: ScoreResult) -> dict:
    """What running the completion's code gave, where the rule ran tests: each test's outcome
    (name, passed, the failing assertion's message, expected and actual) and how the code stopped."""
    if not result.tests and result.stop_reason is None:
        return {}
    return {"tool_result": {"stop_reason": result.stop_reason, "tests": result.tests}}


def agent_sessions(
    policy: TierModel | EngineTier, settings: TierSettings, generator: torch.Generator | None = None
) -> Callable[[], ChatSessions] | None:
    """Multi-turn generation reusing each episode's cache across its turns; None (whole prompts
    through the tier's decoder) when the tier decodes speculatively or on an engine."""
    if settings.speculative or settings.remote or isinstance(policy, EngineTier):
        return None
    return lambda: ChatSessions(
        policy.model, policy.tokenizer, settings.sampling_params(), generator=generator
    )


def _agents_play(
    batch,
    run: Run,
    policy,
    agents: list[tuple[int, dict]],
    generate,
    group_size: int,
    generator=None,
    *,
    judge=None,
) -> int:
    """Agent episodes, one wave of sandboxes at a time; each wave is stored when it ends."""
    samples = [index % group_size for index, _ in agents]  # episodes come back in the items' order
    stored = 0

    def store(first: int, wave: list[AgentEpisode]) -> None:
        nonlocal stored
        stored += _store(batch, [_agent_played(e, samples[first + i]) for i, e in enumerate(wave)])

    episodes_play(
        [item for _, item in agents],
        generate,
        rule=run.reward_rule_version.spec,
        render=policy_render(policy, chat=tier_settings(run).chat),
        fits=context_fits(policy, int(run.tier_config["max_new_tokens"])),
        judge=judge or run_judge(run),
        on_done=store,
        sessions=agent_sessions(policy, tier_settings(run), generator),
    )
    return stored


def _agent_played(episode: AgentEpisode, sample_index: int) -> Played:
    turns = episode.turns
    return Played(
        item=episode.item,
        sample_index=sample_index,
        steps=agent_steps(episode),
        result=episode.final_grade,
        text=turns[-1].completion.text if turns else "",
        prompt_tokens=sum(len(turn.completion.prompt_token_ids) for turn in turns),
        completion_tokens=sum(len(turn.completion.token_ids) for turn in turns),
        seconds=episode.seconds,
    )


def agent_steps(episode: AgentEpisode) -> list[tuple[str, dict]]:
    """Each turn as a `tool_call` step; the last also holds the final workspace (bounded), the
    episode's invalid-action count; where it had MCP servers, the first names the tools they offered
    and the last how many of their calls failed."""
    steps = [("tool_call", turn.record()) for turn in episode.turns]
    if steps:
        steps[-1][1]["final_workspace"] = episode.workspace.record()
        steps[-1][1]["invalid_actions"] = episode.invalid_actions
        if episode.mcp is not None:  # the tools its servers offered, as the model was shown them
            steps[0][1]["mcp_tools"] = episode.mcp.functions
            steps[-1][1]["mcp_failures"] = episode.mcp_failures
    return steps


def rollout_batch_fail(batch: RolloutBatch, why: str) -> None:
    """Give the batch back for another attempt, or, after the last, end it: every episode it
    has not stored yet is stored as errored (masked from learning), so its step can close."""

    if batch.attempts < MAX_ATTEMPTS:
        released = RolloutBatch.objects.filter(
            pk=batch.pk, status=RolloutBatch.Status.RUNNING, attempts=batch.attempts
        ).update(status=RolloutBatch.Status.PENDING, error=why[:2000])
        if released:
            run_event(
                batch.run,
                "rollout",
                f"rollout batch {batch.index} (step {batch.step}) failed, attempt {batch.attempts} of "
                f"{MAX_ATTEMPTS}; it will be tried again: {why}",
                level="warning",
            )
        return
    with transaction.atomic():
        ended = RolloutBatch.objects.filter(
            pk=batch.pk, status=RolloutBatch.Status.RUNNING, attempts=batch.attempts
        ).update(status=RolloutBatch.Status.FAILED, error=why[:2000], finished_at=timezone.now())
        if not ended:
            return
        group_size = int(batch.run.resolved["group_size"])
        error = {"grader": "", "kind": "rollout_failed", "message": why[:2000]}
        Trajectory.objects.bulk_create(
            [
                Trajectory(
                    run_id=batch.run_id,
                    batch=batch,
                    item_id=item_id,
                    sample_index=sample,
                    policy_version=batch.policy_version,
                    outcome=Trajectory.Outcome.ERRORED,
                    errors=[error],
                    step_count=0,
                )
                for item_id in batch.item_ids
                for sample in range(group_size)
            ],
            ignore_conflicts=True,  # episodes an earlier attempt stored stay as they were
        )
        run_event(
            batch.run,
            "rollout",
            f"rollout batch {batch.index} (step {batch.step}) failed {MAX_ATTEMPTS} times; its episodes "
            f"are recorded as errored and masked from learning: {why}",
            level="error",
        )


def rollout_batches_expire(batches) -> int:
    """Batches whose worker stopped answering on every attempt can never be claimed again: end
    them as failed. Returns how many."""
    expired = batches.filter(lease_lapsed(), attempts__gte=MAX_ATTEMPTS).select_related("run")
    for batch in expired:
        rollout_batch_fail(batch, f"its worker stopped answering on each of {MAX_ATTEMPTS} attempts")
    return len(expired)


def run_judge(run: Run):
    """The judge for the run's model graders (its project's tiers), kept per process: a judge
    model loads on its first verdict and then stays loaded."""
    return _run_judge(run.pk, str(run.key))


@lru_cache(maxsize=4)
def _run_judge(run_id: int, key: str):  # the key: ids are reused by other databases

    return project_judge(Run.objects.select_related("project").get(pk=run_id).project)


def run_reward_models(run: Run):
    """The scorer of the run's reward_model graders (its project's reward models, each version
    pinned for the run on first use), kept per process: a model loads on its first score."""
    return _run_reward_models(run.pk, str(run.key), run.project_id)


@lru_cache(maxsize=4)
def _run_reward_models(run_id: int, key: str, project_id: int):  # the key: ids are reused by other databases

    return reward_models_scorer(project_id, run_id=run_id)


def grade(
    spec: dict, items: list[dict], texts: list[str], *, judge=None, reward_models=None
) -> list[ScoreResult]:
    """Score each (item, completion) with the run's reward rule; identical pairs are scored once
    (after RL has sharpened a policy, most of a group is the same text)."""
    unique: dict[tuple[str, str], int] = {}
    pairs: list[tuple[dict, Sample]] = []
    for item, text in zip(items, texts, strict=True):
        key = (item["id"], text)
        if key not in unique:
            unique[key] = len(pairs)
            pairs.append(({k: v for k, v in item.items() if k != "pk"}, Sample(output_text=text)))
    results = score_batch(spec, pairs, judge=judge, reward_models=reward_models)
    return [results[unique[(item["id"], text)]] for item, text in zip(items, texts, strict=True)]


def episode_grade(episode_id: int) -> None:
    """An external episode's final answer, graded by its run's reward rule, then stored."""
    episode = Episode.objects.select_related("run__reward_rule_version").get(pk=episode_id)
    if episode.status != Episode.Status.SCORING:
        return
    run = episode.run
    result = grade(run.reward_rule_version.spec, item_dicts([episode.item_id]), [episode.final])[0]
    episode_services.episode_scored(
        episode_id=episode.pk,
        reward=None if result.errored else result.total,
        components=storable(result.components),
        errors=storable([vars(error) for error in result.errors]),
        flags=storable([vars(flag) for flag in result.flags]),
    )


def _generator(run: Run, batch: RolloutBatch) -> torch.Generator:
    return torch.Generator().manual_seed(int(run.resolved["seed"]) * 1_000_003 + batch.index)


def storable(value):
    """Model output is untrusted text and may hold NUL characters, which PostgreSQL text and JSON
    columns refuse; they are stored as U+FFFD. (Step payloads are compressed bytes: kept exact.)"""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [storable(inner) for inner in value]
    if isinstance(value, dict):
        return {storable(key): storable(inner) for key, inner in value.items()}
    return value


@transaction.atomic
def _store(batch: RolloutBatch, played: list[Played]) -> int:
    """Store finished episodes with their steps; returns how many were stored."""
    trajectories = [
        Trajectory(
            run_id=batch.run_id,
            batch=batch,
            item_id=episode.item["pk"],
            sample_index=episode.sample_index,
            policy_version=batch.policy_version,
            outcome=Trajectory.Outcome.ERRORED if episode.result.errored else Trajectory.Outcome.SCORED,
            reward=None if episode.result.errored else episode.result.total,
            components=storable(episode.result.components),
            errors=storable([vars(error) for error in episode.result.errors]),
            flags=storable([vars(flag) for flag in episode.result.flags]),
            completion_text=storable(episode.text),
            prompt_tokens=episode.prompt_tokens,
            completion_tokens=episode.completion_tokens,
            step_count=len(episode.steps),
            wall_seconds=episode.seconds,
        )
        for episode in played
    ]
    # A batch finished twice (its first worker was presumed dead) keeps the first copy of each episode.
    Trajectory.objects.bulk_create(trajectories, ignore_conflicts=True)
    if RolloutBatch.objects.filter(pk=batch.pk, status=RolloutBatch.Status.CANCELLED).exists():
        # A resumed learner rolled this batch's policy version back while it played: what it
        # sampled describes weights that no longer exist, and is never learned.
        Trajectory.objects.filter(batch=batch).update(outcome=Trajectory.Outcome.CANCELLED)
    stored = {(t.item_id, t.sample_index): t for t in Trajectory.objects.filter(batch=batch)}
    with_steps = set(
        TrajectoryStep.objects.filter(trajectory__batch=batch).values_list("trajectory_id", flat=True)
    )
    steps = []
    for episode in played:
        trajectory = stored[(episode.item["pk"], episode.sample_index)]
        if trajectory.pk in with_steps:
            continue
        for index, (kind, data) in enumerate(episode.steps):
            payload, size = TrajectoryStep.pack(data)
            steps.append(
                TrajectoryStep(trajectory=trajectory, index=index, kind=kind, payload=payload, raw_size=size)
            )
    TrajectoryStep.objects.bulk_create(steps)
    return len({step.trajectory_id for step in steps})

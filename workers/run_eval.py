"""Held-out evaluation of a run's policy versions, on the eval queue.

Greedy decoding (the run's tier settings otherwise: precision, speculation, batching, budget) on
the run's evaluation split, scored by the run's reward rule; an episode passes when its reward
reaches the run's pass threshold. Writes `heldout/*` metric points at the version's step (with a
`multi` rule, each grader's mean too: `heldout/reward/<name>`); a redelivery finds them written and
does nothing.
"""

import logging
import time
from collections import defaultdict
from statistics import fmean

from django.db import transaction

from costs.services import usage_record
from inference.chat import item_prompt
from inference.decoding import decode
from inference.engines import EngineTier
from rewards.engine import ScoreResult
from runs.lifecycle import run_event
from runs.models import HeldOutResult, MetricPoint, Run, RunEvent
from runs.services import metrics_write
from workers.agent import AgentEpisode, context_fits, episodes_play, policy_render
from workers.run_learner import held_out_items
from workers.run_rollout import (
    agent_sessions,
    grade,
    policy_version_load,
    run_judge,
    run_reward_models,
    tier_settings,
)
from workers.usage import device_class, worker_name

logger = logging.getLogger(__name__)
PASS_RATE = "heldout/pass_rate"
MESSAGE_CHARS = 1_000
COMPLETION_CHARS = 20_000  # what a held-out result keeps of its completion: enough to read it


def item_family(item: dict) -> str:
    """What the pass rate is broken down by: the item's `metadata.family` if any, else its kind."""
    return str((item.get("metadata") or {}).get("family") or item["kind"])


def held_out_grades(
    run: Run,
    policy,
    items: list[dict],
    settings,
    *,
    played: list[AgentEpisode] | None = None,
    texts: dict[int, str] | None = None,
) -> list[ScoreResult]:
    """Each item's grade: short items from one completion, agent items from a played episode
    (appended to `played` when given); each item's completion, by index, into `texts` when given
    (an agent's: its actions, one per turn)."""
    spec, judge = run.reward_rule_version.spec, run_judge(run)
    results: dict[int, ScoreResult] = {}
    short = [index for index, item in enumerate(items) if item["kind"] != "agent"]
    if short:
        prompts = [policy.prompt_text(item_prompt(items[index])) for index in short]
        completions = [completion.text for completion in decode(policy, prompts, settings)]
        graded = grade(
            spec, [items[i] for i in short], completions, judge=judge, reward_models=run_reward_models(run)
        )
        results |= dict(zip(short, graded, strict=True))
        if texts is not None:
            texts |= dict(zip(short, completions, strict=True))
    agents = [index for index, item in enumerate(items) if item["kind"] == "agent"]
    if agents:
        episodes = episodes_play(
            [items[index] for index in agents],
            lambda prompts: decode(policy, prompts, settings),
            rule=spec,
            render=policy_render(policy, chat=settings.chat),
            fits=context_fits(policy, settings.max_new_tokens),
            sessions=agent_sessions(policy, settings),
            judge=judge,
        )
        results |= {index: episode.final_grade for index, episode in zip(agents, episodes, strict=True)}
        if texts is not None:
            texts |= {
                index: "\n".join(turn.completion.text for turn in episode.turns)
                for index, episode in zip(agents, episodes, strict=True)
            }
        if played is not None:
            played += episodes
    return [results[index] for index in range(len(items))]


def agent_figures(episodes: list[AgentEpisode]) -> dict[str, float]:
    """Held-out agent episodes (errored ones left out): the share of their steps that were invalid
    actions, and their mean steps.

    >>> agent_figures([])
    {}
    """
    played = [episode for episode in episodes if episode.error is None]
    steps = sum(len(episode.turns) for episode in played)
    if not steps:
        return {}
    return {
        "heldout/agent/invalid_rate": sum(episode.invalid_actions for episode in played) / steps,
        "heldout/agent/steps": steps / len(played),
    }


def policy_evaluate(run_id: int, version: int) -> dict[str, float] | None:
    """Evaluate one policy version, once. A failure is recorded as an `evaluation_failed` event
    (a run waiting for its final evaluation fails with it instead of waiting forever), unless the
    version was rolled back by a resume meanwhile: then there is nothing to evaluate."""
    run = Run.objects.select_related("task_set_version", "reward_rule_version").filter(pk=run_id).first()
    if run is None or MetricPoint.objects.filter(run=run, name=PASS_RATE, step=version).exists():
        return None
    try:
        return _policy_evaluate(run, version)
    except Exception as exc:  # noqa: BLE001 - any failure: recorded where the run's page and learner see it
        current = Run.objects.filter(pk=run.pk).values_list("policy_version", flat=True).first()
        if current is not None and version <= current:
            logger.exception("run %s: held-out evaluation of version %s failed", run.pk, version)
            run_event(
                run,
                "evaluation_failed",
                f"the held-out evaluation of step {version} failed: {exc}"[:MESSAGE_CHARS],
                level=RunEvent.Level.ERROR,
                data={"step": version},
            )
        return None


def _policy_evaluate(run: Run, version: int) -> dict[str, float] | None:
    # Greedy, otherwise the run's tier as it is: precision, speculation, batching, budget, stops.
    settings = tier_settings(run).with_(temperature=0.0, top_p=1.0, top_k=0)
    policy = policy_version_load(run, version, settings)
    items = held_out_items(run)
    episodes: list[AgentEpisode] = []
    texts: dict[int, str] = {}
    started = time.monotonic()
    results = held_out_grades(run, policy, items, settings, played=episodes, texts=texts)
    seconds = time.monotonic() - started
    threshold = float(run.resolved.get("pass_threshold", 1.0))
    passed: dict[str, list[bool]] = defaultdict(list)
    rewards = []
    components: dict[str, list[float]] = defaultdict(list)
    for item, result in zip(items, results, strict=True):
        if result.errored or result.total is None:
            continue
        rewards.append(result.total)
        for name, value in result.components.items():
            if value is not None:
                components[name].append(value)
        passed[item_family(item)].append(result.total >= threshold)
    every = [value for values in passed.values() for value in values]
    values = {
        PASS_RATE: sum(every) / max(1, len(every)),
        "heldout/reward": fmean(rewards) if rewards else 0.0,
    }
    values |= {f"heldout/pass_rate/{family}": sum(v) / len(v) for family, v in passed.items()}
    # Each grader of a `multi` rule on its own (a reward model's score beside the unit tests' verdict).
    values |= {f"heldout/reward/{name}": fmean(v) for name, v in components.items() if len(components) > 1}
    values |= agent_figures(episodes)
    with transaction.atomic():
        if MetricPoint.objects.filter(run=run, name=PASS_RATE, step=version).exists():
            return None  # a second delivery of the same evaluation finished first
        results_store(run, version, items, results, texts, threshold)
        metrics_write(run, version, values)
        # The evaluation held this worker's device while it generated and graded: billed once
        # per version, like the metrics it wrote (a second delivery returned above).
        usage_record(
            run_id=run.pk,
            step=version,
            component="evaluation",
            kind="evaluation",
            worker=worker_name(),
            device_class="" if isinstance(policy, EngineTier) else device_class(policy.device),
            engine=settings.name if settings.remote else "",
            device_seconds=0.0 if settings.remote else seconds,
        )
    return values


def results_store(
    run: Run,
    version: int,
    items: list[dict],
    results: list[ScoreResult],
    texts: dict[int, str],
    threshold: float,
) -> None:
    """Each item's result, kept so that two evaluations compare item by item (runs/outcomes.py)."""
    HeldOutResult.objects.bulk_create(
        [
            HeldOutResult(
                run=run,
                step=version,
                item_id=item["pk"],
                reward=None if result.errored else result.total,
                passed=not result.errored and result.total is not None and result.total >= threshold,
                errored=result.errored or result.total is None,
                components={name: value for name, value in result.components.items() if value is not None},
                completion_text=texts.get(index, "")[:COMPLETION_CHARS],
            )
            for index, (item, result) in enumerate(zip(items, results, strict=True))
        ],
        ignore_conflicts=True,
    )

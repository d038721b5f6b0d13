"""Held-out evaluation of a run's policy versions, on the eval queue.

Greedy decoding on the run's evaluation split, scored by the run's reward rule; an episode passes
when its reward reaches the run's pass threshold. Writes `heldout/*` metric points at the
version's step; a redelivery finds them written and does nothing.
"""

from collections import defaultdict
from statistics import fmean

from runs.models import MetricPoint, Run
from workers.generation import SamplingParams, generate
from workers.policy import PolicyLoadError, policy_load
from workers.run_learner import held_out_items, metrics_write
from workers.run_rollout import grade
from workers.run_store import policy_dir

PASS_RATE = "heldout/pass_rate"


def item_family(item: dict) -> str:
    """What the pass rate is broken down by: the item's `metadata.family` if any, else its kind."""
    return str((item.get("metadata") or {}).get("family") or item["kind"])


def policy_evaluate(run_id: int, version: int) -> dict[str, float] | None:
    run = Run.objects.select_related("task_set_version", "reward_rule_version").filter(pk=run_id).first()
    if run is None or MetricPoint.objects.filter(run=run, name=PASS_RATE, step=version).exists():
        return None
    try:
        policy = policy_load(policy_dir(run.pk, version))
    except PolicyLoadError:  # rolled back by a resume: that version no longer exists
        return None
    items = held_out_items(run)
    params = SamplingParams(
        max_new_tokens=run.tier_config["max_new_tokens"],
        temperature=0.0,
        stop=tuple(run.tier_config.get("stop") or ()),
    )
    texts = []
    batch = max(1, int(run.tier_config.get("batch_size") or 8))
    for start in range(0, len(items), batch):
        chunk = items[start : start + batch]
        prompts = [policy.prompt_text(item["prompt"]) for item in chunk]
        texts += [completion.text for completion in generate(policy.model, policy.tokenizer, prompts, params)]
    results = grade(run.reward_rule_version.spec, items, texts)
    threshold = float(run.resolved.get("pass_threshold", 1.0))
    passed: dict[str, list[bool]] = defaultdict(list)
    rewards = []
    for item, result in zip(items, results, strict=True):
        if result.errored or result.total is None:
            continue
        rewards.append(result.total)
        passed[item_family(item)].append(result.total >= threshold)
    every = [value for values in passed.values() for value in values]
    values = {
        PASS_RATE: sum(every) / max(1, len(every)),
        "heldout/reward": fmean(rewards) if rewards else 0.0,
    }
    values |= {f"heldout/pass_rate/{family}": sum(v) / len(v) for family, v in passed.items()}
    metrics_write(run, version, values)
    return values

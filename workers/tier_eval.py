"""Tier evaluation: one checkpoint under several tiers on the same task items, on the eval queue.

For each tier: the checkpoint is loaded and prepared the tier's way (inference.decoding), every item's
prompt is generated with the tier's settings, and the completions are scored in the sandbox. The
result per tier holds the pass rate and how fast it got there: tokens per second (generated tokens
over wall time, batching included), time to first token and latency per request (p50 / p95, from
the start of the request's batch), peak memory (the weights plus the process's peak RSS growth
while generating) and, for speculative tiers, the acceptance rate of draft tokens.
"""

import logging
import os
import threading
import time
import traceback
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

import torch

from inference.chat import item_prompt
from inference.decoding import GenerationStats, decode, model_bytes, tier_load
from inference.settings import TierSettings
from projects.models import TaskItem
from rewards.engine import Sample, score_batch
from tiers.models import TierEvaluation

logger = logging.getLogger(__name__)

UNIT_TESTS_RULE = {"type": "unit_tests", "name": "tests"}
EXACT_ANSWER_RULE = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.reference}}",
    "operation": "eq",
}
RESULT_KEYS = (
    "pass_rate",
    "tokens_per_second",
    "ttft_ms_p50",
    "latency_ms_p50",
    "latency_ms_p95",
    "peak_memory_mb",
    "acceptance_rate",
)


class PeakRss:
    """The process's peak resident memory while the block runs, sampled every few milliseconds."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.start = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, _rss())

    def __enter__(self) -> "PeakRss":
        self.start = self.peak = _rss()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def growth_bytes(self) -> int:
        return max(0, self.peak - self.start)


def _rss() -> int:
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the resource module's lifetime peak is the best there is
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rule_for(item: dict) -> dict | None:
    """How an item passes by default: its unit tests (code), its reference (answer)."""
    if item.get("kind") == "code" and item.get("tests"):
        return UNIT_TESTS_RULE
    if item.get("kind") == "answer" and "reference" in item:
        return EXACT_ANSWER_RULE
    return None


def item_family(item: dict) -> str:
    return str((item.get("metadata") or {}).get("family") or item.get("kind") or "other")


def grade_items(
    items: list[dict], texts: list[str], *, spec: dict | None = None, pool=None
) -> list[bool | None]:
    """Whether each completion passes (None: not gradable, or the sandbox failed); a reward rule
    `spec` passes at a total of 1, else each item's default rule decides."""
    verdicts: list[bool | None] = [None] * len(items)
    groups: dict[str, list[int]] = defaultdict(list)
    rules: dict[str, dict] = {}
    for index, item in enumerate(items):
        rule = spec or rule_for(item)
        if rule is None:
            continue
        key = repr(sorted(rule.items()))
        rules[key] = rule
        groups[key].append(index)
    for key, indices in groups.items():
        pairs = [
            ({k: v for k, v in items[i].items() if k != "pk"}, Sample(output_text=texts[i])) for i in indices
        ]
        for index, result in zip(indices, score_batch(rules[key], pairs, pool=pool), strict=True):
            if not result.errored and result.total is not None:
                verdicts[index] = result.total >= 1.0
    return verdicts


def tier_measure(
    tier_model,
    items: list[dict],
    *,
    settings: TierSettings | None = None,
    grade: bool = True,
    spec: dict | None = None,
    pool=None,
    seed: int = 0,
) -> dict:
    """Generate every item's completion under the tier and measure it (and grade it)."""
    settings = settings or tier_model.settings
    prompts = [tier_model.prompt_text(item_prompt(item)) for item in items]
    stats = GenerationStats()
    generator = torch.Generator().manual_seed(seed)
    with PeakRss() as memory:
        completions = decode(tier_model, prompts, settings, generator=generator, stats=stats)
    # An engine tier holds no weights on this host: its memory is the engine's.
    weights = (model_bytes(tier_model.model) if tier_model.model is not None else 0) + (
        model_bytes(tier_model.draft) if tier_model.draft else 0
    )
    result = stats.summary() | {
        "model_mb": round(weights / 2**20, 3),
        "peak_memory_mb": round((weights + memory.growth_bytes) / 2**20, 3),
        "ttft_ms_p95": _p95_ms(stats.first_token_seconds),
    }
    if torch.cuda.is_available() and tier_model.model is not None and tier_model.device.type == "cuda":
        result["cuda_peak_memory_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 3)
    if grade:
        verdicts = grade_items(items, [c.text for c in completions], spec=spec, pool=pool)
        scored = [v for v in verdicts if v is not None]
        by_family: dict[str, list[bool]] = defaultdict(list)
        for item, verdict in zip(items, verdicts, strict=True):
            if verdict is not None:
                by_family[item_family(item)].append(verdict)
        result |= {
            "pass_rate": round(sum(scored) / len(scored), 4) if scored else None,
            "passed": sum(scored),
            "scored": len(scored),
            "ungraded": len(verdicts) - len(scored),
            "pass_rate_by_family": {k: round(sum(v) / len(v), 4) for k, v in sorted(by_family.items())},
        }
    result["texts"] = [c.text for c in completions]
    return result


def _p95_ms(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))] * 1000, 2)


def tier_run(config: dict, checkpoint: str | Path, items: list[dict], *, spec=None, pool=None) -> dict:
    """Load the checkpoint the tier's way, warm it up, then measure it on the items."""
    settings = TierSettings.from_config(config)
    started = time.perf_counter()
    tier_model = tier_load(settings, checkpoint)
    load_seconds = time.perf_counter() - started
    decode(tier_model, [tier_model.prompt_text(item_prompt(items[0]))], settings.with_(max_new_tokens=2))
    result = tier_measure(tier_model, items, settings=settings, spec=spec, pool=pool)
    result.pop("texts")
    return result | {"load_seconds": round(load_seconds, 3)}


def pareto_front(results: list[dict]) -> set[int]:
    """Indices of the results no other beats on both pass rate and tokens per second.

    >>> sorted(pareto_front([{"pass_rate": 0.5, "tokens_per_second": 10},
    ...     {"pass_rate": 0.4, "tokens_per_second": 30}, {"pass_rate": 0.4, "tokens_per_second": 5}]))
    [0, 1]
    """
    points = [
        (index, rate, speed)
        for index, r in enumerate(results)
        if (rate := r.get("pass_rate")) is not None and (speed := r.get("tokens_per_second")) is not None
    ]
    front: set[int] = set()
    for index, rate, speed in points:
        dominated = any(
            (r2 >= rate and s2 >= speed) and (r2 > rate or s2 > speed) for i2, r2, s2 in points if i2 != index
        )
        if not dominated:
            front.add(index)
    return front


def tier_evaluation_run(evaluation_id: int) -> bool:
    """The eval-queue task's body: claim the evaluation, run every tier, store the results."""
    from django.db.models import F, Q
    from django.utils import timezone

    now = timezone.now()
    stale = now - timedelta(hours=2)
    claimed = TierEvaluation.objects.filter(
        Q(status=TierEvaluation.Status.QUEUED)
        | Q(status=TierEvaluation.Status.RUNNING, started_at__lt=stale, attempts__lt=3),
        pk=evaluation_id,
    ).update(status=TierEvaluation.Status.RUNNING, started_at=now, attempts=F("attempts") + 1)
    if not claimed:  # done, or running on a live worker: a redelivery
        return False
    evaluation = TierEvaluation.objects.get(pk=evaluation_id)
    rows = TaskItem.objects.filter(version=evaluation.task_set_version, split=evaluation.split).order_by(
        "position"
    )
    if evaluation.limit:
        rows = rows[: evaluation.limit]
    items = [row.grading_dict() for row in rows]
    results = []
    try:
        if not items:
            raise ValueError(f"the {evaluation.split} split of this task set version has no items")
        for config in evaluation.tier_configs:
            try:
                result = tier_run(config, evaluation.checkpoint, items)
            except Exception as exc:  # noqa: BLE001  (one tier failing leaves the others measured)
                logger.exception("tier %s failed", config.get("name"))
                result = {"error": f"{type(exc).__name__}: {exc}"}
            results.append(
                {"tier_id": config.get("id"), "name": config.get("name"), "settings": config} | result
            )
            TierEvaluation.objects.filter(pk=evaluation_id).update(results=results)
        front = pareto_front(results)
        for index, result in enumerate(results):
            result["pareto"] = index in front
        status, error = TierEvaluation.Status.SUCCEEDED, ""
        if all("error" in result for result in results):
            status, error = TierEvaluation.Status.FAILED, "every tier failed; see each tier's error"
    except Exception as exc:  # noqa: BLE001
        status, error = (
            TierEvaluation.Status.FAILED,
            f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}",
        )
    TierEvaluation.objects.filter(pk=evaluation_id).update(
        status=status, results=results, error=error, finished_at=timezone.now()
    )
    return True

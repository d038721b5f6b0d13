"""The figures of an evaluation suite, from per-item results: pass@1 and pass@k (the unbiased
estimator), mean reward, per-grader means, invalid-action rate and mean length. Pure: the worker
computes them once, the pages and REST read what it stored."""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from math import comb
from statistics import fmean


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of k samples passes, estimated without bias from n samples
    of which c passed: 1 - C(n-c, k) / C(n, k). This is the estimator of Chen et al. 2021,
    "Evaluating Large Language Models Trained on Code" (the Codex paper, section 2.1): drawing k of
    the n samples without replacement, instead of 1 - (1 - c/n)^k, which is biased low.

    >>> pass_at_k(1, 1, 1), pass_at_k(1, 0, 1)
    (1.0, 0.0)
    >>> round(pass_at_k(10, 3, 1), 6)
    0.3
    >>> round(pass_at_k(10, 3, 5), 6)  # 1 - C(7,5)/C(10,5) = 1 - 21/252
    0.916667
    >>> pass_at_k(4, 2, 3)  # fewer than k failures: some sample of any k passes
    1.0
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass(frozen=True)
class ItemFigures:
    """One item's samples under one entry: what the metrics are computed from."""

    samples: int  # graded samples (errored ones left out)
    passes: int
    rewards: Sequence[float] = ()
    graders: dict[str, float] = field(default_factory=dict)  # each grader's mean over the samples
    tokens: Sequence[int] = ()  # completion tokens per sample
    invalid_actions: int | None = None  # agent items: over all samples
    steps: int | None = None  # agent items: over all samples
    errored: int = 0


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return fmean(values) if values else None


def figures(items: Sequence[ItemFigures], ks: Sequence[int]) -> dict:
    """The metrics of a set of items: pass@1 and pass@k averaged over the items that have at least
    k graded samples, mean reward over every graded sample, each grader's mean over the items that
    ran it, the share of agent steps that were invalid actions, mean completion tokens.

    >>> figures([ItemFigures(2, 1, (1.0, 0.0), tokens=(4, 6)), ItemFigures(2, 0, (0.0, 0.0))], [2])
    ... # doctest: +NORMALIZE_WHITESPACE
    {'items': 2, 'samples': 4, 'errored': 0, 'pass@1': 0.25, 'pass@2': 0.5, 'mean_reward': 0.25,
     'graders': {}, 'invalid_action_rate': None, 'mean_length': 5.0}
    """
    graded = [item for item in items if item.samples]
    result: dict = {
        "items": len(items),
        "samples": sum(item.samples for item in items),
        "errored": sum(item.errored for item in items),
    }
    for k in sorted({1, *ks}):
        eligible = [item for item in graded if item.samples >= k]
        result[f"pass@{k}"] = _mean(pass_at_k(i.samples, i.passes, k) for i in eligible)
    result["mean_reward"] = _mean(reward for item in graded for reward in item.rewards)
    names = sorted({name for item in graded for name in item.graders})
    result["graders"] = {
        name: _mean(item.graders[name] for item in graded if name in item.graders) for name in names
    }
    steps = sum(item.steps or 0 for item in items)
    invalid = sum(item.invalid_actions or 0 for item in items)
    result["invalid_action_rate"] = invalid / steps if steps else None
    result["mean_length"] = _mean(token for item in graded for token in item.tokens)
    return result

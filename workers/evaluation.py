"""Held-out evaluation: the pass rate of a policy on a task set, per kind of task, via the sandbox."""

from collections import defaultdict
from dataclasses import dataclass

import torch

from inference.policy import Policy
from inference.settings import SamplingParams
from projects.demo_tasks import item_kind
from workers.rollout import rollout_groups

GREEDY = SamplingParams(max_new_tokens=32, temperature=0.0)


@dataclass
class PassRates:
    overall: float
    by_kind: dict[str, float]
    errored: int  # completions the sandbox could not grade (left out of the rates)
    count: int

    def as_dict(self) -> dict:
        return {
            "overall": round(self.overall, 4),
            "by_kind": {kind: round(rate, 4) for kind, rate in sorted(self.by_kind.items())},
            "errored": self.errored,
            "count": self.count,
        }


def pass_rates(
    policy: Policy,
    items: list[dict],
    *,
    params: SamplingParams = GREEDY,
    samples: int = 1,
    batch_size: int = 64,
    seed: int = 0,
    kind_of=item_kind,
    pool=None,
) -> PassRates:
    """The fraction of completions that pass every test, overall and per kind (`kind_of(item)`)."""
    generator = torch.Generator().manual_seed(seed)
    passed: dict[str, list[bool]] = defaultdict(list)
    errored = 0
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        for trajectory in rollout_groups(
            policy, chunk, params, group_size=samples, generator=generator, pool=pool
        ):
            if trajectory.outcome == "errored":
                errored += 1
                continue
            passed[kind_of(chunk[trajectory.item_index])].append(trajectory.passed)
    every = [value for values in passed.values() for value in values]
    return PassRates(
        overall=sum(every) / max(1, len(every)),
        by_kind={kind: sum(values) / len(values) for kind, values in passed.items()},
        errored=errored,
        count=len(every),
    )

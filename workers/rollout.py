"""The rollout driver: sample a group of completions per task item and score them in the sandbox.

Rewards come from the rewards engine's `unit_tests` grader, which runs the item's tests against
the completion inside a sandbox from the pool; model output never runs in this process. A
completion whose grading hit an infrastructure failure is `errored`: it carries no reward and the
learner masks it. Identical completions of the same item are graded once per batch (after RL has
sharpened a policy most of a group is the same text). Rollouts grade each completion as soon as
it ends, while the rest of the batch is still decoding.
"""

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from inference.chat import item_prompt
from inference.decoding import decode, policy_tier
from inference.generation import Completion
from inference.policy import Policy
from inference.settings import SamplingParams
from rewards.engine import Sample, score, score_batch
from sandboxes.services import sandbox_pool

UNIT_TESTS_RULE = {"type": "unit_tests", "name": "tests"}


@dataclass
class Trajectory:
    """One scored completion: what the learner consumes and the trajectory store records."""

    item_index: int  # index of the task item in the batch; a group shares it
    completion: Completion
    reward: float | None  # None when errored
    outcome: str  # "scored" or "errored"
    policy_version: int
    passed: bool  # every test passed
    turns: list[Completion] = field(default_factory=list)  # a multi-step episode's actions, in order

    @property
    def completions(self) -> list[Completion]:
        """What the policy generated in this episode: every turn's action, or the one completion."""
        return self.turns or [self.completion]


@dataclass(frozen=True)
class Grade:
    reward: float | None
    errored: bool


def grade_completions(items: list[dict], texts: list[str], *, pool=None) -> list[Grade]:
    """Score each (item, text) pair with the sandboxed unit tests; duplicates are graded once."""
    unique: dict[tuple[str, str], int] = {}
    pairs: list[tuple[dict, Sample]] = []
    for item, text in zip(items, texts, strict=True):
        key = (item["id"], text)
        if key not in unique:
            unique[key] = len(pairs)
            pairs.append((item, Sample(output_text=text)))
    results = score_batch(UNIT_TESTS_RULE, pairs, pool=pool)
    grades = [Grade(result.total, result.errored) for result in results]
    return [grades[unique[(item["id"], text)]] for item, text in zip(items, texts, strict=True)]


class GradingStream:
    """Grades completions while others are still being generated: `submit` starts a completion's
    sandboxed unit tests in a thread (as many at once as the pool lends sandboxes), `grade`
    waits for its verdict. Identical completions of an item are graded once, as in
    `grade_completions`, whose verdicts these are."""

    def __init__(self, pool=None) -> None:
        if pool is None:
            pool = sandbox_pool()
        self.pool = pool
        self.executor = ThreadPoolExecutor(max_workers=pool.max_sandboxes, thread_name_prefix="grade")
        self.verdicts: dict[tuple[str, str], Future] = {}

    def submit(self, item: dict, text: str) -> None:
        key = (item["id"], text)
        if key not in self.verdicts:
            sample = Sample(output_text=text)
            self.verdicts[key] = self.executor.submit(score, UNIT_TESTS_RULE, item, sample, pool=self.pool)

    def grade(self, item: dict, text: str) -> Grade:
        self.submit(item, text)
        result = self.verdicts[(item["id"], text)].result()
        return Grade(result.total, result.errored)

    def __enter__(self) -> "GradingStream":
        return self

    def __exit__(self, *exc_info) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


def rollout_groups(
    policy: Policy,
    items: list[dict],
    params: SamplingParams,
    *,
    group_size: int,
    generator: torch.Generator | None = None,
    pool=None,
) -> list[Trajectory]:
    """`group_size` scored completions for each item, in item order. Each completion is graded as
    soon as it ends, while the longer ones are still being generated."""
    prompts = [policy.prompt_text(item_prompt(item)) for item in items for _ in range(group_size)]
    expanded = [item for item in items for _ in range(group_size)]
    with GradingStream(pool) as grading:
        completions = decode(
            policy_tier(policy, params),
            prompts,
            generator=generator,
            on_finished=lambda row, completion: grading.submit(expanded[row], completion.text),
        )
        grades = [grading.grade(item, c.text) for item, c in zip(expanded, completions, strict=True)]
    return [
        Trajectory(
            item_index=index // group_size,
            completion=completion,
            reward=None if grade.errored else grade.reward,
            outcome="errored" if grade.errored else "scored",
            policy_version=policy.version,
            passed=not grade.errored and grade.reward == 1.0,
        )
        for index, (completion, grade) in enumerate(zip(completions, grades, strict=True))
    ]

"""A learner algorithm written the way a team would add its own: REINFORCE with a constant
baseline, registered and learned in this one module and touching no other file. Worker processes
load it through FLYWHEEL_LEARNERS_EXTRA=tests.toy_reinforce; tests/test_learner_registry.py runs it
through the real workers."""

from typing import Any

import torch

from runs.hyperparameters import Param
from runs.learners import Algorithm, algorithm_register
from workers.learners.common import Learner, completion_logprobs, optimizer_step
from workers.learners.grpo import GRPOBatch, GRPOConfig
from workers.learners.grpo_config import GRPO_PARAMS

NAME = "toy_reinforce"

TOY = Algorithm(
    name=NAME,
    label="REINFORCE (toy)",
    summary="REINFORCE with a constant baseline: every scored episode, reward minus the baseline",
    learner=__name__,
    # The rollouts' settings are GRPO's (groups, staleness, the episode deadline); one of its own.
    params={name: GRPO_PARAMS[name] for name in ("group_size", "staleness", "episode_deadline_seconds")}
    | {"baseline": Param(float, 0.5, -10.0, 10.0, help="subtracted from every reward")},
    online=True,
)
algorithm_register(TOY)


def run_config(run: Any, common: dict[str, Any]) -> GRPOConfig:
    hyper, tier = run.resolved, run.tier_config
    config = GRPOConfig(
        **common,
        group_size=hyper["group_size"],
        prompts_per_step=hyper["batch_size"],
        max_staleness=hyper["staleness"],
        max_new_tokens=tier["max_new_tokens"],
        temperature=tier["temperature"],
        top_p=tier["top_p"],
        top_k=tier["top_k"],
    )
    config.baseline = hyper["baseline"]  # type: ignore[attr-defined]
    return config


def reference_for(config: GRPOConfig, learner: Learner) -> None:
    return None


def learnable(episodes: list, group_size: int, config: GRPOConfig, version: int):
    """Every scored, fresh episode, its advantage its reward minus the baseline."""
    keep = [
        index
        for index, episode in enumerate(episodes)
        if episode.outcome != "errored" and episode.policy_version >= version - config.max_staleness
    ]
    rewards = torch.tensor([episode.reward if episode.reward is not None else 0.0 for episode in episodes])
    return keep, rewards - config.baseline, {}  # type: ignore[attr-defined]


def learn_batch(learner: Learner, batch: GRPOBatch, config: GRPOConfig, reference: None) -> dict[str, float]:
    device = learner.accelerator.device
    logprobs, mask = completion_logprobs(learner.model, batch.sequences.to(device), config.temperature)
    advantages = batch.advantages.to(device)[:, None]
    loss = -(advantages * logprobs * mask).sum() / mask.sum().clamp(min=1.0)
    learner.accelerator.backward(loss)
    optimizer_step(learner, config.max_grad_norm)
    return {"loss": float(loss.detach()), "toy_rows": float(len(batch.advantages))}

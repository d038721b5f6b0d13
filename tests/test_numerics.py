"""Numerics watched: the decoder's recorded log-probs against the learner's, per step; the
monitor that alerts on their drift; truncated importance sampling (TIS) in the GRPO loss."""

import copy
import math
from pathlib import Path

import pytest
import torch

from inference.decoding import decode, policy_tier
from inference.policy import Policy
from inference.settings import SamplingParams
from runs import monitors
from tests.tiny_base import TINY
from workers.base_model import base_model_build
from workers.learners.common import learner_create, sequence_batch
from workers.learners.grpo import (
    GRPOBatch,
    GRPOConfig,
    group_advantages,
    grpo_loss,
    learn_on_batch,
    logprob_mismatch,
)


def test_mismatch_figures_are_exact_over_the_masked_tokens():
    learner = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -9.0, 0.0]])
    behaviour = torch.tensor([[-1.1, -1.3, -3.0], [-0.5, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])  # the -9 vs -1 token is padding
    gaps = [0.1, -0.7, 0.0, 0.0]
    figures = logprob_mismatch(learner, behaviour, mask)
    assert figures["logprob_gap"] == pytest.approx(sum(abs(g) for g in gaps) / 4)
    assert figures["mismatch_kl"] == pytest.approx(sum(math.exp(g) - g - 1 for g in gaps) / 4)
    assert figures["mismatch_tokens"] == pytest.approx(1 / 4)  # only the 0.7 gap is beyond 0.5


def test_tis_takes_the_ratio_against_the_learner_and_truncates_the_weight():
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    proximal = logprobs.detach().clone()
    behaviour = torch.tensor([[-1.5, -5.0]])  # the decoder gave the second token far less mass
    advantages, mask = torch.tensor([1.0]), torch.ones(1, 2)
    loss, _ = grpo_loss(logprobs, behaviour, advantages, mask, proximal_logprobs=proximal, tis_cap=2.0)
    loss.backward()
    weights = [math.exp(0.5), 2.0]  # e^0.5 kept; e^3 truncated at the cap
    assert loss.item() == pytest.approx(-sum(weights) / 2)  # ratio 1 against the learner's own
    assert logprobs.grad[0].tolist() == pytest.approx([-weights[0] / 2, -weights[1] / 2])


def test_without_tis_the_ratio_is_against_the_decoder_as_before():
    logprobs = torch.tensor([[-1.0, -2.0]])
    behaviour = torch.tensor([[-1.5, -5.0]])
    loss, metrics = grpo_loss(logprobs, behaviour, torch.tensor([1.0]), torch.ones(1, 2))
    assert loss.item() == pytest.approx(-(min(math.exp(0.5), 1.2) + min(math.exp(3.0), 1.2)) / 2)
    assert metrics["clip_fraction"] == 1.0


def test_tis_without_the_learners_logprobs_is_refused():
    with pytest.raises(ValueError, match="proximal"):
        grpo_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), tis_cap=2.0)


def test_a_negative_cap_is_refused_naming_it():
    with pytest.raises(ValueError, match="tis_cap"):
        GRPOConfig(model="m", output_dir="o", tis_cap=-1.0)


def test_the_monitor_fires_on_a_recent_mismatch_above_its_threshold_only():
    drifting = {monitors.MISMATCH: [(step, 0.001) for step in range(5)] + [(5, 0.2), (6, 0.3)]}
    quiet = {monitors.MISMATCH: [(step, 0.001) for step in range(7)]}
    fired = monitors.alerts_for(drifting, {"window": 2})
    assert [alert.monitor for alert in fired] == ["logprob_mismatch"]
    assert fired[0].value == pytest.approx(0.25)
    assert "tis_cap" in fired[0].message
    assert monitors.alerts_for(quiet, {"window": 2}) == []


def _step(learner, config: GRPOConfig, decoder_dtype: torch.dtype, seed: int) -> tuple[dict, float]:
    """One GRPO step whose rollouts a copy of the learner in `decoder_dtype` sampled: the step's
    learner figures and the rollouts' mean reward (the share of sampled tokens with an even id)."""
    model = learner.accelerator.unwrap_model(learner.model)
    decoder = copy.deepcopy(model).to(decoder_dtype).eval()
    policy = Policy(decoder, learner.tokenizer, chat=False)
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12]]
    params = SamplingParams(max_new_tokens=4, temperature=1.0)
    texts = [learner.tokenizer.decode(prompt) for prompt in prompts for _ in range(config.group_size)]
    completions = decode(policy_tier(policy, params), texts, generator=torch.Generator().manual_seed(seed))
    rewards = torch.tensor([sum(t % 2 == 0 for t in c.token_ids) / len(c.token_ids) for c in completions])
    sequences = sequence_batch(
        [c.prompt_token_ids for c in completions],
        [c.token_ids for c in completions],
        learner.tokenizer.pad_token_id,
    )
    old = torch.zeros(len(completions), sequences.input_ids.size(1) - 1)
    for row, c in enumerate(completions):
        start = len(c.prompt_token_ids) - 1
        old[row, start : start + len(c.logprobs)] = torch.tensor(c.logprobs)
    advantages, _ = group_advantages(rewards, config.group_size)
    model.train()
    figures = learn_on_batch(learner, GRPOBatch(sequences, old, advantages), config, reference=None)
    return figures, float(rewards.mean())


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("numerics") / "base"
    base_model_build(path, TINY, log=lambda line: None)
    return path


def test_a_decoder_in_another_precision_shows_the_mismatch_and_one_alike_does_not(tiny_base, tmp_path):
    config = GRPOConfig(model=str(tiny_base), output_dir=str(tmp_path), group_size=4, learning_rate=0.0)
    learner, _ = learner_create(config)
    alike, _ = _step(learner, config, torch.float32, seed=1)
    apart, _ = _step(learner, config, torch.bfloat16, seed=1)
    assert alike["mismatch_kl"] < 1e-6 and alike["logprob_gap"] < 1e-4
    assert apart["logprob_gap"] > 100 * max(alike["logprob_gap"], 1e-6)
    assert apart["mismatch_kl"] > 0


def test_with_tis_a_run_sampled_in_bf16_still_learns(tiny_base, tmp_path):
    """The learner in fp32, every rollout sampled by a bf16 copy of it (as a bf16 decoder or an
    external engine would): with the correction on, the reward the rollouts earn rises."""
    torch.manual_seed(0)
    config = GRPOConfig(
        model=str(tiny_base), output_dir=str(tmp_path), group_size=8, learning_rate=3e-2, tis_cap=2.0
    )
    learner, _ = learner_create(config)
    rewards, kls = [], []
    for step in range(16):
        figures, reward = _step(learner, config, torch.bfloat16, seed=step)
        rewards.append(reward)
        kls.append(figures["mismatch_kl"])
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first + 0.3, rewards
    assert min(kls) > 0  # the mismatch was there all along, and measured at every step

"""The tiny base model, the demo tasks, generation log-probs and the GRPO pieces, at tiny scale."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from inference.decoding import decode, policy_tier
from inference.policy import policy_load
from inference.settings import SamplingParams
from projects.demo_tasks import demo_task_sets
from tests.tiny_base import TINY
from workers.base_model import base_model_build
from workers.learners import grpo
from workers.learners.common import (
    completion_logprobs,
    learner_create,
    length_parts,
    sequence_batch,
    token_logprobs,
)
from workers.learners.grpo import GRPOBatch, GRPOConfig, grpo_loss, learn_on_batch


def test_demo_split_is_seeded_and_keeps_heldout_out_of_train():
    first = demo_task_sets(seed=5, train_size=50, heldout_size=20)
    again = demo_task_sets(seed=5, train_size=50, heldout_size=20)
    assert first == again
    assert not {item["id"] for item in first["train"]} & {item["id"] for item in first["heldout"]}
    assert {item["metadata"]["family"] for item in first["heldout"]} == {"scalar", "map"}


def test_base_model_build_is_deterministic_from_its_seed(tmp_path: Path):
    base_model_build(tmp_path / "a", TINY, log=lambda line: None)
    base_model_build(tmp_path / "b", TINY, log=lambda line: None)
    first = load_file(tmp_path / "a" / "model.safetensors")
    second = load_file(tmp_path / "b" / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()


def test_generation_logprobs_are_the_ones_the_learner_recomputes(tmp_path: Path):
    base_model_build(tmp_path, TINY, log=lambda line: None)
    policy = policy_load(tmp_path)
    prompts = [policy.prompt_text("Write a Python function `f(x)` that returns x plus 3."), "def"]
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    completions = decode(policy_tier(policy, params), prompts, generator=torch.Generator().manual_seed(0))
    assert all(len(c.logprobs) == len(c.token_ids) >= 1 for c in completions)
    batch = sequence_batch(
        [c.prompt_token_ids for c in completions],
        [c.token_ids for c in completions],
        policy.tokenizer.pad_token_id,
    )
    with torch.no_grad():
        logprobs, mask = completion_logprobs(policy.model, batch)
    for row, completion in enumerate(completions):
        recomputed = logprobs[row][mask[row].bool()]
        assert torch.allclose(recomputed, torch.tensor(completion.logprobs), atol=1e-4)


def test_grpo_token_mean_loss_weights_every_completion_token_and_masks_padding():
    logprobs = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, metrics = grpo_loss(logprobs, logprobs.detach(), torch.tensor([1.0, -1.0]), mask)
    loss.backward()
    assert loss.item() == pytest.approx((-2 + 3) / 5)
    assert logprobs.grad[0, 2].item() == 0.0
    assert metrics["clip_fraction"] == 0.0


def test_rows_that_share_a_prompt_get_the_same_logprobs_and_gradients_as_computed_apart(tmp_path: Path):
    """A GRPO group's prompt runs once and its cache is copied to each row: nothing may change."""
    base_model_build(tmp_path, TINY, log=lambda line: None)
    policy = policy_load(tmp_path)
    prompts = [
        policy.prompt_text(f"Write a Python function `f(x)` that returns x plus {n}.") for n in (1, 22)
    ]
    completions = decode(
        policy_tier(policy, SamplingParams(max_new_tokens=8, temperature=1.0)),
        [prompt for prompt in prompts for _ in range(3)],
        generator=torch.Generator().manual_seed(1),
    )
    batch = sequence_batch(
        [c.prompt_token_ids for c in completions],
        [c.token_ids for c in completions],
        policy.tokenizer.pad_token_id,
    )
    assert len({tuple(c.prompt_token_ids) for c in completions}) == 2
    assert len({len(c.prompt_token_ids) for c in completions}) == 2  # prompts of two lengths
    model = policy.model.train()

    def logprobs_and_gradients(logprobs_of) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        logprobs, mask = logprobs_of()
        (logprobs * mask).sum().backward()
        return (logprobs * mask).detach(), [parameter.grad.clone() for parameter in model.parameters()]

    shared, shared_gradients = logprobs_and_gradients(lambda: completion_logprobs(model, batch))
    apart, apart_gradients = logprobs_and_gradients(
        lambda: (token_logprobs(model, batch), batch.completion_mask[:, 1:].float())
    )
    assert torch.allclose(shared, apart, atol=1e-5)
    for one, other in zip(shared_gradients, apart_gradients, strict=True):
        assert torch.allclose(one, other, rtol=1e-4, atol=1e-5)
    for row, completion in enumerate(completions):  # and both are what sampling recorded
        recorded = shared[row][batch.completion_mask[row, 1:].bool()]
        assert torch.allclose(recorded, torch.tensor(completion.logprobs), atol=1e-4)


def test_rows_of_unlike_lengths_learn_in_separate_passes_with_the_same_gradient(tmp_path: Path, monkeypatch):
    """Without a token budget a GRPO batch learns in passes of rows of like lengths (one
    completion that ran long is not padding the others): the gradient and the reported loss are
    those of one pass over every row."""
    base_model_build(tmp_path / "base", TINY, log=lambda line: None)
    prompts = [[5, 6, 7, 8]] * 6 + [[9, 10, 11]] * 6
    completions = [[20 + row] * (1 + row % 3) for row in range(12)]
    completions[2] = [25] * 60  # ran to the token budget
    sequences = sequence_batch(prompts, completions, pad_token_id=0)
    old = torch.full((12, sequences.input_ids.size(1) - 1), -3.0)
    batch = GRPOBatch(sequences, old, torch.linspace(-1.5, 1.5, 12))
    parts = length_parts(sequences.attention_mask.sum(-1).tolist())
    assert parts[-1] == [2] and sorted(parts[0]) == [0, 1, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    gradients, losses = [], []
    for split in (True, False):
        if not split:
            monkeypatch.setattr(grpo, "length_parts", lambda lengths: [list(range(len(lengths)))])
        config = GRPOConfig(model=str(tmp_path / "base"), output_dir=str(tmp_path / str(split)))
        learner, _ = learner_create(config)
        learner.optimizer.step = lambda: None  # keep the gradient to compare it
        learner.optimizer.zero_grad = lambda set_to_none=True: None
        losses.append(learn_on_batch(learner, batch, config, reference=None)["loss"])
        gradients.append([p.grad.clone() for p in learner.model.parameters()])
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*gradients, strict=True))

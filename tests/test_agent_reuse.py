"""Long context, reused: each agent turn encodes only its new tokens into the episode's key/value
cache, and the learner trains an episode as one sequence. Both are checked against computing each
turn from scratch: the same log-probs, and (token_mean) the same loss and gradients."""

import pytest
import torch

from inference.policy import policy_load
from inference.sessions import ChatSessions
from inference.settings import SamplingParams
from tests.run_harness import tiny_model
from workers.agent import plain_render
from workers.learners.common import completion_logprobs
from workers.learners.grpo import episode_sequence, grpo_batch, grpo_loss
from workers.rollout import Trajectory

__all__ = ["tiny_model"]
TOOLS: list[dict] = []


@pytest.fixture(scope="module")
def policy(tiny_model):
    return policy_load(tiny_model)


def conversations_play(policy, *, reuse: bool, turns: int = 4, seed: int = 0, temperature: float = 1.0):
    """Three conversations (two alike, as a GRPO group; one longer) over `turns` turns; each
    turn's new message differs per conversation, so their chunks have different lengths."""
    params = SamplingParams(max_new_tokens=6, temperature=temperature, top_p=1.0, top_k=0)
    sessions = ChatSessions(
        policy.model, policy.tokenizer, params, reuse=reuse, generator=torch.Generator().manual_seed(seed)
    )
    messages = [
        [{"role": "user", "content": "x plus 3"}],
        [{"role": "user", "content": "x plus 3"}],
        [{"role": "user", "content": "the sum of x and 12, twice over"}],
    ]
    played: list[list] = [[], [], []]
    for turn in range(turns):
        keys = [0, 1, 2] if turn < turns - 1 else [0, 2]  # one conversation ends a turn early
        prompts = [plain_render(messages[key], TOOLS) for key in keys]
        for key, completion in zip(keys, sessions.turn(keys, prompts), strict=True):
            played[key].append(completion)
            messages[key] += [
                {"role": "assistant", "content": completion.text, "raw": completion.text},
                {"role": "tool", "name": "shell", "content": "ok " * (key + turn + 1)},
            ]
    return played, sessions.stats


def whole_logprobs(policy, completion) -> list[float]:
    """The completion's log-probs with its prompt encoded whole, in one forward pass."""
    ids = torch.tensor([completion.prompt_token_ids + completion.token_ids])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0, :-1].float()
    start = len(completion.prompt_token_ids) - 1
    picked = logits.log_softmax(-1)[start:].gather(-1, ids[0, start + 1 :, None]).squeeze(-1)
    return picked.tolist()


def test_each_turn_encodes_only_its_new_tokens_with_the_log_probs_of_its_transcript_encoded_whole(policy):
    played, stats = conversations_play(policy, reuse=True)
    for turns in played:
        assert episode_sequence(turns) is not None  # every prompt extends the last prompt and answer
        for completion in turns:
            assert completion.logprobs == pytest.approx(whole_logprobs(policy, completion), abs=2e-4)
    assert stats.rebuilds == 0 and stats.generated_tokens == sum(len(c.token_ids) for t in played for c in t)
    # The new tokens only: the prompts held every earlier token again, the cache did not need them.
    first_prompts = sum(len(turns[0].prompt_token_ids) for turns in played)
    assert stats.encoded_tokens < stats.prompt_tokens / 2 and stats.encoded_tokens > first_prompts


def test_without_reuse_every_turn_encodes_its_whole_prompt(policy):
    played, stats = conversations_play(policy, reuse=False)
    assert stats.encoded_tokens == stats.prompt_tokens
    for completion in played[2]:
        assert completion.logprobs == pytest.approx(whole_logprobs(policy, completion), abs=2e-4)


def episodes(policy):
    played, _ = conversations_play(policy, reuse=True)
    return [
        Trajectory(index, turns[-1], reward, "scored", 0, False, turns=turns)
        for index, (turns, reward) in enumerate(zip(played, [1.0, 0.0, 1.0], strict=True))
    ]


def test_the_learner_trains_an_episode_as_one_sequence_with_the_per_turn_log_probs_and_gradients(policy):
    trajectories = episodes(policy)
    advantages = torch.tensor([0.7, -0.7, 0.3])
    whole = grpo_batch(trajectories, [0, 1, 2], advantages, policy.tokenizer.pad_token_id)
    rows = grpo_batch(
        trajectories, [0, 1, 2], advantages, policy.tokenizer.pad_token_id, episodes_as_sequences=False
    )
    assert whole.sequences.input_ids.shape[0] == 3  # one row per episode
    assert rows.sequences.input_ids.shape[0] == sum(len(t.turns) for t in trajectories)
    assert int(whole.sequences.completion_mask.sum()) == int(rows.sequences.completion_mask.sum())

    def loss_and_grads(batch):
        policy.model.zero_grad()
        logprobs, mask = completion_logprobs(policy.model, batch.sequences)
        loss, _ = grpo_loss(logprobs, batch.old_logprobs, batch.advantages, mask, aggregation="token_mean")
        loss.backward()
        picked = sorted(round(v, 4) for v in logprobs[mask.bool()].tolist())
        grads = [p.grad.clone() for p in policy.model.parameters() if p.grad is not None]
        return loss.item(), picked, grads

    policy.model.train()
    try:
        loss_whole, picked_whole, grads_whole = loss_and_grads(whole)
        loss_rows, picked_rows, grads_rows = loss_and_grads(rows)
    finally:
        policy.model.eval()
        policy.model.zero_grad()
    assert picked_whole == pytest.approx(picked_rows, abs=2e-3)
    assert loss_whole == pytest.approx(loss_rows, abs=1e-5)
    for a, b in zip(grads_whole, grads_rows, strict=True):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()

"""The lean Llama decode path computes the model's own function; rows leave the batch as they
finish without changing what anyone generates; sampling draws from the policy's distribution."""

import collections

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import inference.decoding as decoding
from inference.decoding import decode, policy_tier
from inference.generation import sample_next
from inference.lean_llama import lean_llama
from inference.policy import policy_load
from inference.settings import SamplingParams
from tests.tiny_base import TINY
from workers.base_model import base_model_build

# Both families' tiny shape: grouped-query attention (4 query heads share 2 key-value heads).
SHAPE = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def random_llama(**overrides) -> LlamaForCausalLM:
    """Random weights, grouped-query attention (4 query heads share 2 key-value heads)."""
    torch.manual_seed(0)
    settings = SHAPE | dict(
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
    )
    return LlamaForCausalLM(LlamaConfig(**(settings | overrides))).eval()


def random_qwen2(**overrides) -> Qwen2ForCausalLM:
    """Random weights, grouped-query attention, and q/k/v biases made non-zero (Qwen2 starts
    them at zero, which would hide a lean path that forgot them)."""
    torch.manual_seed(0)
    settings = SHAPE | dict(
        tie_word_embeddings=True,  # as Qwen2.5-0.5B
        pad_token_id=0,
        eos_token_id=1,
    )
    model = Qwen2ForCausalLM(Qwen2Config(**(settings | overrides))).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                projection.bias.normal_(std=0.5)
    return model


MODELS = {"llama": random_llama, "qwen2": random_qwen2}


def left_padded(lengths: list[int], vocab: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Random prompts of `lengths`, left-padded as generation lays them out: ids and mask."""
    width = max(lengths)
    input_ids = torch.zeros((len(lengths), width), dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, length in enumerate(lengths):
        input_ids[row, width - length :] = torch.randint(2, vocab, (length,))
        mask[row, width - length :] = 1
    return input_ids, mask


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-base")
    base_model_build(path, TINY, log=lambda line: None)
    return policy_load(path)


def test_the_lean_path_applies_to_plain_llamas_only():
    assert lean_llama(random_llama()) is not None
    assert lean_llama(random_llama(attention_bias=True)) is None
    assert lean_llama(random_llama(mlp_bias=True)) is None
    scaled = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert lean_llama(random_llama(rope_parameters=scaled)) is None


def test_the_lean_path_applies_to_plain_qwen2_and_refuses_what_it_does_not_compute():
    assert lean_llama(random_qwen2()) is not None
    assert lean_llama(random_qwen2(use_sliding_window=True, sliding_window=8, max_window_layers=0)) is None
    scaled = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert lean_llama(random_qwen2(rope_parameters=scaled)) is None
    assert lean_llama(random_qwen2(hidden_act="gelu")) is None


@pytest.mark.parametrize("family", MODELS)
@torch.no_grad()
def test_lean_prefill_and_decode_logits_match_the_model_forward(family):
    model = MODELS[family]()
    # Left-padded prompts of lengths 5, 2 and 7, as generation lays them out.
    input_ids, mask = left_padded([5, 2, 7])
    width = input_ids.size(1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    lean = lean_llama(model)
    lean_logits = lean.prefill(input_ids, mask, capacity=width + 4)
    cache = DynamicCache()
    reference = model(
        input_ids=input_ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True
    ).logits[:, -1]
    assert lean_logits.shape == (3, 64)
    assert torch.allclose(lean_logits, reference, atol=1e-5)
    key_mask = torch.cat([mask, mask.new_ones(3, 4)], dim=-1)
    position = positions[:, -1:]
    for step in range(4):
        token = reference.argmax(-1, keepdim=True)
        position = position + 1
        lean_logits = lean.forward(token, position, key_mask.bool())
        reference = model(
            input_ids=token,
            attention_mask=key_mask[:, : width + step + 1],
            position_ids=position,
            cache=cache,
            use_cache=True,
        ).logits[:, -1]
        assert torch.allclose(lean_logits, reference, atol=1e-5), step


@pytest.mark.parametrize("family", MODELS)
@torch.no_grad()
def test_greedy_tokens_are_the_model_forwards_over_a_whole_generation(family):
    """Left-padded rows of different lengths, 24 greedy tokens each, the lean path against the
    model's own forward with a Hugging Face cache: the same tokens, logits within float32 noise."""
    model = MODELS[family]()
    input_ids, mask = left_padded([6, 1, 4, 9])
    width, budget = input_ids.size(1), 24
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    lean = lean_llama(model)
    lean_logits = lean.prefill(input_ids, mask, capacity=width + budget)
    cache = DynamicCache()
    reference = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, cache=cache).logits[
        :, -1
    ]
    key_mask = torch.cat([mask, mask.new_ones(4, budget)], dim=-1)
    position, lean_tokens, tokens = positions[:, -1:], [], []
    for step in range(budget):
        assert torch.allclose(lean_logits, reference, atol=1e-5), step
        lean_tokens.append(lean_logits.argmax(-1, keepdim=True))
        tokens.append(reference.argmax(-1, keepdim=True))
        position = position + 1
        lean_logits = lean.forward(lean_tokens[-1], position, key_mask.bool())
        reference = model(
            input_ids=tokens[-1],
            attention_mask=key_mask[:, : width + step + 1],
            position_ids=position,
            cache=cache,
        ).logits[:, -1]
    assert torch.equal(torch.cat(lean_tokens, -1), torch.cat(tokens, -1))


def test_generation_is_the_same_through_the_lean_path_and_the_model_forward(tiny_policy, monkeypatch):
    prompts = [
        tiny_policy.prompt_text(f"Write a Python function `f(x)` that returns x plus {n}.") for n in (1, 22)
    ]
    prompts += ["def", "x"]
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    lean = decode(policy_tier(tiny_policy, greedy), prompts)
    monkeypatch.setattr(decoding, "lean_llama", lambda model: None)
    plain = decode(policy_tier(tiny_policy, greedy), prompts)
    assert [c.token_ids for c in lean] == [c.token_ids for c in plain]
    assert [c.text for c in lean] == [c.text for c in plain]
    for one, other in zip(lean, plain, strict=True):
        assert one.logprobs == pytest.approx(other.logprobs, abs=1e-5)


def test_rows_that_finish_early_leave_the_batch_without_changing_the_others(tiny_policy, monkeypatch):
    """Greedy completions of a batch whose rows end at different steps (so the batch shrinks
    while the rest decode) are each what the prompt gives alone; every row is reported once,
    the early ones before the batch ends."""
    prompts = [
        tiny_policy.prompt_text(f"Write a Python function `f(x)` that returns x plus {n}.") for n in (1, 2)
    ]
    prompts += ["def", "x", "return", "###"]
    greedy = SamplingParams(max_new_tokens=20, temperature=0.0)
    # The barely trained model never ends a completion of its own: make the first token it
    # writes for "def" and the fourth it writes for "return" its ends of sequence, so that rows
    # end at different steps (1, 4, and the token budget).
    first = decode(policy_tier(tiny_policy, greedy), prompts)
    config = tiny_policy.model.generation_config
    monkeypatch.setattr(config, "eos_token_id", [first[2].token_ids[0], first[4].token_ids[3]])
    reported: list[int] = []
    together = decode(
        policy_tier(tiny_policy, greedy),
        prompts,
        on_finished=lambda row, completion: reported.append(row),
    )
    assert len({len(c.token_ids) for c in together}) > 2  # rows did end at different steps
    assert sorted(reported) == list(range(len(prompts)))
    lengths = [len(together[row].token_ids) for row in reported]
    assert lengths == sorted(lengths)  # reported as they finished
    for prompt, completion in zip(prompts, together, strict=True):
        alone = decode(policy_tier(tiny_policy, greedy), [prompt])[0]
        assert completion.token_ids == alone.token_ids
        assert completion.logprobs == pytest.approx(alone.logprobs, abs=1e-4)


def test_sampling_draws_each_token_at_its_probability_and_never_a_filtered_one():
    logits = torch.log(torch.tensor([[0.1, 0.0, 0.6, 0.3]])).expand(4000, 4)
    generator = torch.Generator().manual_seed(0)
    counts = collections.Counter()
    for _ in range(5):
        tokens, logprobs = sample_next(logits, SamplingParams(temperature=1.0), generator)
        counts.update(tokens.tolist())
        assert torch.allclose(logprobs, logits[0].log_softmax(-1)[tokens])
    assert counts[1] == 0
    assert {token: round(counts[token] / 20000, 2) for token in (0, 2, 3)} == {0: 0.1, 2: 0.6, 3: 0.3}
    noisy = torch.randn(64, 10)
    tokens, _ = sample_next(noisy, SamplingParams(temperature=1.0, top_k=1), generator)
    assert torch.equal(tokens, noisy.argmax(-1))


def test_same_seed_same_samples(tiny_policy):
    prompts = [tiny_policy.prompt_text("Write a Python function `f(x)` that returns x plus 3.")] * 8
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    first = decode(policy_tier(tiny_policy, params), prompts, generator=torch.Generator().manual_seed(4))
    again = decode(policy_tier(tiny_policy, params), prompts, generator=torch.Generator().manual_seed(4))
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert len({tuple(c.token_ids) for c in first}) > 1

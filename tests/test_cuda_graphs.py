"""The static decode step computes what the lean forward does; the graph runner's buckets,
in-place compaction and padding rows leave every live row's logits as they were; decoding through
the runner gives the tokens decoding without it gives. On a CPU the runner runs its step without
capturing it; the captures themselves are checked where CUDA is (the last tests)."""

import pytest
import torch

import inference.decoding as decoding
from inference.cuda_graphs import StepRunner, batch_bucket, capacity_bucket, step_runner
from inference.decoding import decode, policy_tier
from inference.lean_llama import lean_llama
from inference.policy import Policy, policy_load
from inference.settings import SamplingParams
from tests.test_lean_llama import MODELS, left_padded, random_qwen2
from tests.tiny_base import TINY
from workers.base_model import base_model_build

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-base")
    base_model_build(path, TINY, log=lambda line: None)
    return policy_load(path)


def prompts_of(policy: Policy) -> list[str]:
    """Prompts of different lengths, one repeated (its prefill shared)."""
    tasks = [policy.prompt_text(f"Write a Python function `f(x)` that returns x plus {n}.") for n in (1, 22)]
    return tasks + ["def", "x", tasks[0], "return"]


def uncaptured(monkeypatch) -> None:
    """Decode through the graph runner on a CPU: its step run as is, not captured."""
    monkeypatch.setattr(
        decoding, "_graph_runner", lambda tier, settings: step_runner(tier.model, capture=False)
    )


def test_buckets_hold_the_rows_and_the_positions():
    assert [batch_bucket(rows) for rows in (1, 2, 3, 5, 17, 200, 256, 300)] == [1, 2, 4, 8, 32, 256, 256, 512]
    assert [capacity_bucket(positions) for positions in (10, 200, 256, 257)] == [128, 256, 256, 512]


@pytest.mark.parametrize("family", MODELS)
@torch.no_grad()
def test_the_static_step_gives_the_forwards_logits_as_rows_leave_the_batch(family):
    """Left-padded rows decode greedily, the static step in a cache of spare rows and spare
    positions against `forward` in a cache of exactly the batch; rows leave at steps 5 and 9
    (compacted in place for the step, selected into new tensors for `forward`)."""
    model = MODELS[family]()
    input_ids, mask = left_padded([5, 2, 7, 3])
    width, budget = input_ids.size(1), 16
    reference, static = lean_llama(model), lean_llama(model)
    expected = reference.prefill(input_ids, mask, capacity=width + budget)
    static.allocate(8, 128)  # spare rows and positions: what a bucket leaves unused
    logits = static.restart(input_ids, mask)
    key_mask = torch.cat([mask, mask.new_ones(4, budget)], dim=-1).bool()
    position = (mask.cumsum(-1) - 1).clamp(min=0)[:, -1:]
    leaving = {5: torch.tensor([0, 1, 3]), 9: torch.tensor([0, 2])}
    for step in range(budget):
        assert torch.allclose(logits, expected, atol=1e-5), step
        assert torch.equal(logits.argmax(-1), expected.argmax(-1)), step
        tokens = expected.argmax(-1, keepdim=True)
        if step in leaving:
            keep = leaving[step]
            reference.select(keep)
            static.compact(keep)
            tokens, position, key_mask = tokens[keep], position[keep], key_mask[keep]
        position = position + 1
        expected = reference.forward(tokens, position, key_mask)
        live_mask = torch.zeros((tokens.size(0), 128), dtype=torch.bool)
        live_mask[:, : key_mask.size(1)] = key_mask
        cursor = torch.tensor([static.length])
        logits = static.step(tokens, position, live_mask, cursor)
        static.length += 1


@torch.no_grad()
def test_padding_rows_and_stale_positions_cannot_reach_a_live_row():
    """Three live rows in a bucket of 4: NaN everywhere in the spare row's cache, and garbage in
    the live rows' positions past the cursor (a compaction's leftovers): the live rows' logits
    are, to the bit, those of a clean cache."""
    model = random_qwen2()
    input_ids, mask = left_padded([4, 2, 6])
    runners = [StepRunner(lean_llama(model), capture=False, weights=()) for _ in range(2)]
    for runner in runners:
        runner.prepare(model, 3, 40)
        runner.prefill(input_ids, mask)
    width = input_ids.size(1)
    for cache in runners[1].lean.keys + runners[1].lean.values:
        cache[3] = float("nan")
        cache[:3, :, width:] = torch.randn_like(cache[:3, :, width:]) * 100
    runners[1].tokens[3], runners[1].positions[3] = 5, 30
    key_mask = torch.cat([mask, mask.new_ones(3, 12)], dim=-1).bool()
    position = (mask.cumsum(-1) - 1)[:, -1:]
    outputs: list[list[torch.Tensor]] = [[], []]
    for step in range(12):
        tokens = torch.tensor([[2 + step], [7], [40 - step]])
        for runner, out in zip(runners, outputs, strict=True):
            out.append(runner.step(tokens, position + 1 + step, key_mask).clone())
    assert torch.isfinite(torch.stack(outputs[1])).all()
    assert torch.equal(torch.stack(outputs[0]), torch.stack(outputs[1]))


@torch.no_grad()
def test_a_later_decode_starts_from_a_clean_cache():
    """A NaN an earlier decode left in the kept cache does not reach the next decode's rows."""
    model = random_qwen2()
    input_ids, mask = left_padded([3, 5])
    runner = StepRunner(lean_llama(model), capture=False, weights=())
    runner.prepare(model, 2, 20)
    for cache in runner.lean.keys + runner.lean.values:
        cache.fill_(float("nan"))
    runner.prepare(model, 2, 20)
    runner.prefill(input_ids, mask)
    key_mask = torch.cat([mask, mask.new_ones(2, 4)], dim=-1).bool()
    logits = runner.step(torch.tensor([[2], [3]]), torch.tensor([[3], [5]]), key_mask)
    assert torch.isfinite(logits).all()


def test_decoding_through_the_runner_gives_the_same_completions(tiny_policy, monkeypatch):
    """Greedy, rows ending at different steps (so rows leave and the bucket shrinks), a prompt
    repeated (its prefill shared and copied in place), a listener told every token."""
    prompts = prompts_of(tiny_policy)
    greedy = SamplingParams(max_new_tokens=20, temperature=0.0)
    first = decode(policy_tier(tiny_policy, greedy), prompts)
    config = tiny_policy.model.generation_config
    monkeypatch.setattr(config, "eos_token_id", [first[2].token_ids[0], first[5].token_ids[3]])
    heard: dict[str, list[tuple[int, int]]] = {"plain": [], "runner": []}

    def listener(name):
        return lambda row, token, logprob, distribution: heard[name].append((row, token))

    plain = decode(policy_tier(tiny_policy, greedy), prompts, listener=listener("plain"))
    uncaptured(monkeypatch)
    through = decode(policy_tier(tiny_policy, greedy), prompts, listener=listener("runner"))
    assert step_runner(tiny_policy.model, capture=False).rows == 8  # six rows ran in a bucket of 8
    assert len({len(c.token_ids) for c in plain}) > 2  # rows did leave at different steps
    assert [c.token_ids for c in through] == [c.token_ids for c in plain]
    for one, other in zip(through, plain, strict=True):
        assert one.logprobs == pytest.approx(other.logprobs, abs=1e-4)
    assert heard["runner"] == heard["plain"]


def test_the_runner_is_kept_with_the_model_and_follows_weights_updated_in_place(tiny_policy, monkeypatch):
    """Two decodes share one runner and one cache; weights written in place are what the next
    decode reads (the joined copies re-read); new weight tensors get a new runner."""
    uncaptured(monkeypatch)
    prompts = ["def", "x"]
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    decode(policy_tier(tiny_policy, greedy), prompts)
    runner = step_runner(tiny_policy.model, capture=False)
    storage = runner.lean.keys[0].data_ptr()
    decode(policy_tier(tiny_policy, greedy), prompts)
    assert step_runner(tiny_policy.model, capture=False) is runner
    assert runner.lean.keys[0].data_ptr() == storage
    model = tiny_policy.model
    saved = {name: weight.detach().clone() for name, weight in model.state_dict().items()}
    try:
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(3.0)
                layer.mlp.up_proj.weight.mul_(-1.0)
        updated = decode(policy_tier(tiny_policy, greedy), prompts)
        assert step_runner(model, capture=False) is runner
        monkeypatch.setattr(decoding, "_graph_runner", lambda tier, settings: None)
        expected = decode(policy_tier(tiny_policy, greedy), prompts)
        assert [c.token_ids for c in updated] == [c.token_ids for c in expected]
        for one, other in zip(updated, expected, strict=True):
            assert one.logprobs == pytest.approx(other.logprobs, abs=1e-4)
    finally:
        model.load_state_dict(saved)


def test_new_weight_tensors_get_a_new_runner():
    model = random_qwen2()
    runner = step_runner(model, capture=False)
    assert step_runner(model, capture=False) is runner
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    assert step_runner(model, capture=False) is not runner
    assert step_runner(random_qwen2(use_sliding_window=True, max_window_layers=0), capture=False) is None


@torch.no_grad()
def test_a_capture_that_fails_leaves_the_step_running_uncaptured():
    """On a CPU a capture cannot start: the runner warns, stops capturing and gives the
    uncaptured step's logits (a GPU whose capture fails decodes on the same way)."""
    model = random_qwen2()
    input_ids, mask = left_padded([3, 5])
    runners = [StepRunner(lean_llama(model), capture=capture, weights=()) for capture in (True, False)]
    key_mask = torch.cat([mask, mask.new_ones(2, 4)], dim=-1).bool()
    for runner in runners:
        runner.prepare(model, 2, 20)
        runner.prefill(input_ids, mask)
    tokens, positions = torch.tensor([[2], [3]]), torch.tensor([[3], [5]])
    with pytest.warns(UserWarning, match="CUDA graph capture failed, decoding without graphs"):
        outputs = [runners[0].step(tokens, positions, key_mask)]
    outputs.append(runners[1].step(tokens, positions, key_mask))
    assert "CUDA" in runners[0].failed and runners[0].captures == 0
    assert torch.equal(outputs[0], outputs[1])


def test_on_a_cpu_decoding_uses_no_runner(tiny_policy):
    tier = policy_tier(tiny_policy, SamplingParams(max_new_tokens=4, temperature=0.0))
    assert decoding._graph_runner(tier, tier.settings) is None
    assert decoding._graph_runner(tier, tier.settings.with_(cuda_graphs=False)) is None


# --- on a CUDA GPU -------------------------------------------------------------------------------


def cuda_policies(tiny_policy: Policy, dtype: torch.dtype) -> dict[str, Policy]:
    """The tiny base Llama and a random Qwen2 of its vocabulary (weights wide enough that its
    logits are spread, not all near-ties), on the GPU at `dtype`, sharing its tokenizer."""
    tokenizer = tiny_policy.tokenizer
    qwen = random_qwen2(
        vocab_size=tiny_policy.model.config.vocab_size,
        max_position_embeddings=512,
        initializer_range=1.0,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    llama = type(tiny_policy.model)(tiny_policy.model.config)
    llama.load_state_dict(tiny_policy.model.state_dict())
    return {
        name: Policy(model=model.to("cuda", dtype).eval(), tokenizer=tokenizer)
        for name, model in (("llama", llama), ("qwen2", qwen))
    }


def decode_with_margins(tier, prompts, settings) -> tuple[list, dict[int, list[float]]]:
    """Completions, and per row each greedy decision's margin (top log-prob less the second)."""
    margins: dict[int, list[float]] = {row: [] for row in range(len(prompts))}

    def listener(row, token, logprob, distribution):
        top = distribution.topk(2).values
        margins[row].append(float(top[0] - top[1]))

    return decode(tier, prompts, settings, listener=listener), margins


# Per dtype: how far recorded log-probs may differ between the eager forward and the graphed
# step (they sum in different orders; bf16 rounds logits near 8 to steps of 1/32), and the
# margin below which a greedy decision counts as a tie that rounding may break either way.
TOLERANCES = {torch.float32: (1e-4, 1e-3), torch.bfloat16: (0.1, 0.1)}


def assert_same_greedy_decode(graphed, eager, margins, dtype: torch.dtype) -> None:
    """The same tokens and log-probs (within tolerance) wherever the eager decision was not a
    near-tie (after one the texts may part); such ties must be rare enough to leave a third of
    the tokens compared."""
    tolerance, tie = TOLERANCES[dtype]
    compared = 0
    for row, (one, other) in enumerate(zip(graphed, eager, strict=True)):
        ties = [step for step, margin in enumerate(margins[row]) if margin < tie]
        agreed = ties[0] if ties else len(other.token_ids)
        assert one.token_ids[:agreed] == other.token_ids[:agreed], row
        assert one.logprobs[:agreed] == pytest.approx(other.logprobs[:agreed], abs=tolerance), row
        compared += agreed
    assert compared >= sum(len(c.token_ids) for c in eager) // 3


@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_captured_graphs_decode_what_the_eager_forward_does_and_are_captured_once(tiny_policy, dtype):
    prompts = prompts_of(tiny_policy)
    greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
    for name, policy in cuda_policies(tiny_policy, dtype).items():
        tier = policy_tier(policy, greedy)
        eager, margins = decode_with_margins(tier, prompts, tier.settings.with_(cuda_graphs=False))
        assert step_runner(policy.model) is not None and step_runner(policy.model).captures == 0, name
        graphed = decode(tier, prompts)
        runner = step_runner(policy.model)
        assert runner.failed is None and runner.captures > 0, (name, runner.failed)
        captures = runner.captures
        again = decode(policy_tier(policy, greedy), prompts)
        assert runner.captures == captures, name  # the second decode replayed what the first captured
        assert [c.token_ids for c in again] == [c.token_ids for c in graphed], name
        assert_same_greedy_decode(graphed, eager, margins, dtype)


@CUDA
def test_captured_graphs_replay_the_uncaptured_step_exactly(tiny_policy, monkeypatch):
    """The same static step, captured or run as is, on the same GPU: the same tokens, the same
    log-probs (a capture reading a stale address or cursor would be far off)."""
    prompts = prompts_of(tiny_policy)
    greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
    policy = cuda_policies(tiny_policy, torch.float32)["qwen2"]
    graphed = decode(policy_tier(policy, greedy), prompts)
    assert step_runner(policy.model).captures > 0
    uncaptured(monkeypatch)
    plain = decode(policy_tier(policy, greedy), prompts)
    assert [c.token_ids for c in graphed] == [c.token_ids for c in plain]
    for one, other in zip(graphed, plain, strict=True):
        assert one.logprobs == pytest.approx(other.logprobs, abs=1e-5)


@CUDA
def test_weights_updated_in_place_keep_the_captures_valid(tiny_policy):
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    policy = cuda_policies(tiny_policy, torch.float32)["llama"]
    prompts = prompts_of(tiny_policy)
    decode(policy_tier(policy, greedy), prompts)
    runner = step_runner(policy.model)
    captures = runner.captures
    with torch.no_grad():
        for layer in policy.model.model.layers:
            layer.self_attn.k_proj.weight.mul_(2.0)
            layer.mlp.gate_proj.weight.mul_(-1.0)
        policy.model.model.norm.weight.mul_(1.5)
    tier = policy_tier(policy, greedy)
    eager, margins = decode_with_margins(tier, prompts, tier.settings.with_(cuda_graphs=False))
    updated = decode(tier, prompts)
    assert step_runner(policy.model) is runner and runner.captures == captures
    assert_same_greedy_decode(updated, eager, margins, torch.float32)

"""The decoder's exact outputs, pinned: tokens and log-probs on a tiny model for every way it is
called (rollout groups, a tier plain or speculative, greedy or seeded sampling, stop strings,
batches, shared prefixes, the serving listener), recorded from the code before the two decoders
became one (tests/data/decoder_pins.json) and compared token for token.

One change was made on purpose and re-recorded: a tier without speculation that samples
(`tier_sampled_group`, `tier_sampled_unshared`) now draws with the rollouts' rule
(`generation.sample_next`, one uniform per row) instead of `torch.multinomial`, the same
distribution drawn differently, so a seed gives a tier what it gives a rollout. Greedy decoding,
rollouts and every speculative case are exactly what they were.

Re-record only on purpose, when decoding is meant to change: `python tests/test_decoder_pins.py`.
"""

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inference.decoding import decode, policy_tier, tier_prepare  # noqa: E402
from inference.policy import Policy, policy_load  # noqa: E402
from inference.settings import SamplingParams, TierSettings  # noqa: E402
from workers.base_model import BaseModelConfig, base_model_build  # noqa: E402

PINS = Path(__file__).parent / "data" / "decoder_pins.json"
TINY = BaseModelConfig(
    seed=3,
    corpus_size=200,
    vocab_size=300,
    hidden_size=32,
    layers=2,
    heads=2,
    intermediate_size=64,
    steps=6,
    batch_size=8,
    warmup_steps=1,
    heldout_size=20,
)
PROMPTS = [
    "Write a Python function `f(x)` that returns x plus 3.",
    "Write a Python function `g(xs)` that returns each element of xs times 2, as a list.",
    "Write a Python function `h(n)` that returns 4 less than n.",
]
GREEDY = TierSettings(temperature=0.0, max_new_tokens=12, batch_size=3)
SAMPLED = TierSettings(temperature=0.9, top_p=0.95, top_k=40, max_new_tokens=10, batch_size=4)


def _rows(completions) -> list[dict]:
    return [
        {"tokens": c.token_ids, "logprobs": c.logprobs, "text": c.text, "finish": c.finish_reason}
        for c in completions
    ]


def _plain(policy: Policy, prompts: list[str], params: SamplingParams, seed: int | None = None) -> list[dict]:
    """What rollout groups decode: the policy's own model, no tier precision or speculation."""
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return _rows(decode(policy_tier(policy, params), prompts, generator=generator))


def _tier(policy: Policy, prompts: list[str], settings: TierSettings, seed=None, draft=None, events=None):
    tier = tier_prepare(policy, settings, draft=draft)
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    listener = None
    if events is not None:
        listener = lambda row, token, logprob, dist: events.append([row, token])  # noqa: E731
    return _rows(decode(tier, prompts, settings, generator=generator, listener=listener))


def outputs(model_dir: Path) -> dict:
    """Every pinned case's completions, decoded by today's code."""
    policy = policy_load(model_dir)
    prompts = [policy.prompt_text(prompt) for prompt in PROMPTS]
    group = [prompts[0]] * 3 + [prompts[1]] * 3
    greedy = GREEDY.sampling_params()
    cases: dict = {}
    cases["rollout_greedy"] = _plain(policy, prompts + ["def", "x"], greedy)
    cases["rollout_sampled_group"] = _plain(policy, group, SAMPLED.sampling_params(), seed=4)
    stop = cases["rollout_greedy"][0]["text"][4:6]
    cases["stop"] = stop
    cases["rollout_stop"] = _plain(
        policy, prompts, SamplingParams(max_new_tokens=12, temperature=0, stop=(stop,))
    )
    cases["tier_greedy"] = _tier(policy, prompts, GREEDY.with_(batch_size=2))
    cases["tier_stop"] = _tier(policy, prompts, GREEDY.with_(stop=(stop,)))
    cases["tier_sampled_group"] = _tier(policy, group, SAMPLED, seed=7)
    cases["tier_sampled_unshared"] = _tier(policy, group, SAMPLED.with_(prefix_cache=False), seed=7)
    lookup = dict(speculation="prompt_lookup", speculative_tokens=3)
    cases["tier_lookup_greedy"] = _tier(policy, prompts, GREEDY.with_(**lookup))
    cases["tier_lookup_sampled"] = _tier(policy, group, SAMPLED.with_(**lookup), seed=8)
    drafted = dict(speculation="draft_model", speculative_tokens=3)
    draft = policy_load(model_dir)
    cases["tier_draft_greedy"] = _tier(policy, prompts, GREEDY.with_(**drafted), draft=draft)
    cases["tier_draft_sampled"] = _tier(policy, group, SAMPLED.with_(**drafted), seed=5, draft=draft)
    events: list = []
    cases["tier_listened"] = _tier(policy, prompts, GREEDY.with_(batch_size=2), events=events)
    cases["tier_listened_events"] = events
    return cases


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pin-model")
    base_model_build(path, TINY, log=lambda line: None)
    return path


def test_every_caller_decodes_exactly_what_it_did_before_the_decoders_became_one(model_dir):
    pinned = json.loads(PINS.read_text())
    got = json.loads(json.dumps(outputs(model_dir)))
    assert sorted(got) == sorted(pinned)
    for case, want in pinned.items():
        if case in ("stop", "tier_listened_events"):
            assert got[case] == want, case
            continue
        assert [row["tokens"] for row in got[case]] == [row["tokens"] for row in want], case
        assert [row["text"] for row in got[case]] == [row["text"] for row in want], case
        assert [row["finish"] for row in got[case]] == [row["finish"] for row in want], case
        for mine, theirs in zip(got[case], want, strict=True):
            assert mine["logprobs"] == pytest.approx(theirs["logprobs"], abs=1e-5), case


def test_a_tier_without_speculation_decodes_exactly_what_a_rollout_does(model_dir):
    """One decoder: a seed gives a tier (fp32, one batch) the tokens and log-probs it gives a
    policy's rollout with the same sampling parameters."""
    prompts = [policy_load(model_dir).prompt_text(prompt) for prompt in PROMPTS[:2] for _ in range(3)]
    settings = SAMPLED.with_(batch_size=len(prompts))
    tier = decode(
        tier_prepare(policy_load(model_dir), settings), prompts, generator=torch.Generator().manual_seed(3)
    )
    rollout = decode(
        policy_tier(policy_load(model_dir), settings.sampling_params()),
        prompts,
        generator=torch.Generator().manual_seed(3),
    )
    assert [c.token_ids for c in tier] == [c.token_ids for c in rollout]
    assert [c.logprobs for c in tier] == [c.logprobs for c in rollout]
    assert len({tuple(c.token_ids) for c in tier}) > 2  # sampled, not all alike


if __name__ == "__main__":
    import os
    import tempfile

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    with tempfile.TemporaryDirectory() as folder:
        base_model_build(Path(folder), TINY, log=lambda line: None)
        PINS.write_text(json.dumps(outputs(Path(folder)), indent=1) + "\n")
    print(f"wrote {PINS}")

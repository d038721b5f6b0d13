"""SFT and DPO improve what they target, measured on held-out items, on a deliberately weak tiny model.

The weak model is pretrained briefly on the demo corpus, whose solutions are often off by one: it
writes the function's shape but rarely the right body. The tasks are the demo family's scalar
items with the constant 3 (so a model this small can learn them in seconds); held-out items never
appear in the training data, and pass rates come from the sandboxed unit tests.
"""

import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from django.core.management import CommandError, call_command

from inference.policy import policy_load
from projects import demo_tasks
from workers.base_model import BaseModelConfig, base_model_build
from workers.evaluation import pass_rates
from workers.learners.common import completion_logprobs, epoch_rows, text_batch
from workers.learners.dpo import DPOConfig, dpo_pairs_check, preference_margins, train_dpo
from workers.learners.sft import SFTConfig, sft_examples, sft_loss, train_sft

WEAK = BaseModelConfig(
    seed=0,
    corpus_size=2000,
    vocab_size=300,
    hidden_size=64,
    layers=2,
    heads=2,
    intermediate_size=128,
    steps=120,
    batch_size=16,
    warmup_steps=10,
    heldout_size=40,
    learning_rate=3e-3,
)
HELDOUT = 40


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One thread: small models train faster without contention, and results do not vary with cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def weak_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("weak-base")
    base_model_build(path, WEAK, log=lambda line: None)
    return path


@pytest.fixture(scope="module")
def specs() -> dict[str, list[demo_tasks.TaskSpec]]:
    """Scalar tasks with the constant 3, shuffled and split into train and held-out."""
    chosen = [spec for spec in demo_tasks.all_specs() if spec.kind == "scalar" and spec.constant == 3]
    random.Random(0).shuffle(chosen)
    return {"heldout": chosen[:HELDOUT], "train": chosen[HELDOUT:]}


def make_pair(spec: demo_tasks.TaskSpec) -> dict:
    """Chosen: the right solution. Rejected: the off-by-one habit the corpus taught the model."""
    return {
        "prompt": demo_tasks.describe(spec),
        "chosen": demo_tasks.solution(spec),
        "rejected": demo_tasks.solution(replace(spec, constant=spec.constant + 1)),
    }


def heldout_pass_rate(model: Path, specs: list[demo_tasks.TaskSpec]) -> float:
    items = [demo_tasks.item_from_spec(spec) for spec in specs]
    rates = pass_rates(policy_load(model), items)
    assert rates.errored == 0 and rates.count == len(items)
    return rates.overall


def test_sft_raises_the_heldout_pass_rate_of_a_weak_model(weak_model: Path, specs, tmp_path: Path):
    base = heldout_pass_rate(weak_model, specs["heldout"])
    config = SFTConfig(
        model=str(weak_model),
        output_dir=str(tmp_path / "sft"),
        steps=80,
        learning_rate=3e-3,
        lr_scheduler="constant",
        batch_size=16,
        log_every=1000,
    )
    result = train_sft(
        config, [demo_tasks.item_from_spec(spec) for spec in specs["train"]], log=lambda line: None
    )
    trained = heldout_pass_rate(tmp_path / "sft" / "final", specs["heldout"])
    assert result.steps == 80
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    assert trained - base >= 0.20, f"held-out pass rate {base:.2f} -> {trained:.2f}"


def test_dpo_prefers_the_correct_solution_on_heldout_pairs(weak_model: Path, specs, tmp_path: Path):
    heldout = [make_pair(spec) for spec in specs["heldout"]]
    base = policy_load(weak_model)
    before = preference_margins(base.model, base.tokenizer, heldout)
    config = DPOConfig(
        model=str(weak_model),
        output_dir=str(tmp_path / "dpo"),
        steps=40,
        learning_rate=3e-4,
        lr_scheduler="constant",
        beta=0.1,
        batch_size=8,
        log_every=1000,
    )
    train_dpo(config, [make_pair(spec) for spec in specs["train"]], log=lambda line: None)
    trained = policy_load(tmp_path / "dpo" / "final")
    after = preference_margins(trained.model, trained.tokenizer, heldout)
    accuracy_before, accuracy_after = (before > 0).float().mean().item(), (after > 0).float().mean().item()
    assert after.mean() - before.mean() > 5.0, (
        f"mean log-prob margin {before.mean():.2f} -> {after.mean():.2f}"
    )
    assert accuracy_after - accuracy_before >= 0.5, (
        f"preference accuracy {accuracy_before} -> {accuracy_after}"
    )


def test_dpo_leaves_the_reference_frozen_and_the_starting_weights_untouched(weak_model: Path, tmp_path: Path):
    before = {name: tensor.clone() for name, tensor in policy_load(weak_model).model.state_dict().items()}
    pairs = [make_pair(spec) for spec in demo_tasks.all_specs()[:4]]
    config = DPOConfig(model=str(weak_model), output_dir=str(tmp_path / "dpo"), steps=2, batch_size=4)
    train_dpo(config, pairs, log=lambda line: None)
    after = policy_load(weak_model).model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    trained = policy_load(tmp_path / "dpo" / "final").model.state_dict()
    assert not all(torch.equal(before[name], trained[name]) for name in before)


def test_sft_loss_counts_completion_tokens_only(weak_model: Path):
    policy = policy_load(weak_model)
    batch = text_batch(
        policy.tokenizer, ["### Task\nWrite f.\n### Solution\n"], ["def f(x):\n    return x\n"]
    )
    logprobs, mask = completion_logprobs(policy.model, batch)
    loss = sft_loss(logprobs, mask)
    loss.backward()
    completion_tokens = len(policy.tokenizer("def f(x):\n    return x\n")["input_ids"]) + 1  # + EOS
    assert mask.sum().item() == completion_tokens
    assert loss.item() == pytest.approx(-(logprobs * mask).sum().item() / completion_tokens)
    assert mask[0, :-completion_tokens].sum().item() == 0


def test_epoch_rows_visit_every_row_once_per_epoch_in_a_seeded_order():
    rows = [row for step in range(4) for row in epoch_rows(6, 3, seed=1, step=step)]
    assert sorted(rows[:6]) == sorted(rows[6:]) == list(range(6))
    assert rows[:6] != rows[6:]
    assert epoch_rows(6, 3, seed=1, step=3) == rows[9:]
    assert epoch_rows(6, 3, seed=2, step=0) != rows[:3]


def test_sft_examples_and_dpo_pairs_name_what_is_missing():
    with pytest.raises(ValueError, match="example 1 needs a `prompt` and a `completion`"):
        sft_examples([{"prompt": "p", "completion": "c"}, {"prompt": "q"}])
    with pytest.raises(ValueError, match="pair 0 has no rejected"):
        dpo_pairs_check([{"prompt": "p", "chosen": "c"}])


def test_train_learner_command_reports_a_bad_config(tmp_path: Path):
    data = tmp_path / "items.jsonl"
    data.write_text('{"prompt": "p", "completion": "c"}\n')
    with pytest.raises(CommandError, match="--config: .*unexpected keyword argument 'stepz'"):
        call_command(
            "train_learner",
            "sft",
            "--data",
            str(data),
            "--config",
            '{"model": "m", "output_dir": "o", "stepz": 1}',
        )

"""The reward-model learner: its Bradley–Terry loss equals TRL's `RewardTrainer` loss for identical
inputs (TRL is a test dependency only), and a tiny model trained on synthetic preferences ranks
held-out pairs of the same distribution well above chance."""

import random
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from trl import RewardConfig, RewardTrainer

from inference.reward_model import RewardScorer, reward_model_load, reward_token_ids
from projects.demo_tasks import demo_task_sets
from tests.tiny_base import TINY
from workers.base_model import base_model_build
from workers.learners.common import epoch_rows
from workers.learners.reward_model import (
    RewardModelConfig,
    bradley_terry_loss,
    pair_accuracy,
    pair_rewards,
    preference_rows,
    reward_learner_create,
    reward_step,
)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny-base")
    base_model_build(path, TINY, log=lambda line: None)
    return path


def synthetic_pairs(split: str, count: int, seed: int = 0) -> list[dict]:
    """Chosen: an item's whole reference solution; rejected: the same solution cut short."""
    sets = demo_task_sets(seed=seed, train_size=count, heldout_size=count)
    return [
        {
            "prompt": item["prompt"],
            "chosen": item["reference_solution"],
            "rejected": cut(item["reference_solution"]),
        }
        for item in sets[split][:count]
    ]


def cut(solution: str) -> str:
    words = solution.split()
    return " ".join(words[: max(1, len(words) // 2)])


PAIRS = [
    {"prompt": "Write f(x): x plus 3", "chosen": "return x + 3", "rejected": "return x"},
    {"prompt": "Write g(n): n times 2", "chosen": "return n * 2", "rejected": "return n * 2 * 2 * 2"},
    {"prompt": "Write h(a): a minus 4", "chosen": "return a - 4", "rejected": "pass"},
]


@pytest.mark.parametrize(("center", "with_margin"), [(None, False), (0.01, False), (None, True)])
def test_bradley_terry_loss_equals_trls_reward_trainer_loss(tiny_model, tmp_path, center, with_margin):
    model, tokenizer = reward_model_load(tiny_model)
    torch.manual_seed(0)
    torch.nn.init.normal_(model.score.weight, std=0.5)  # a head that does not score every row alike
    margins = [0.5, -0.25, 1.0]
    rows = [
        {
            "chosen_ids": reward_token_ids(tokenizer, pair["prompt"], pair["chosen"]),
            "rejected_ids": reward_token_ids(tokenizer, pair["prompt"], pair["rejected"]),
        }
        | ({"margin": margin} if with_margin else {})
        for pair, margin in zip(PAIRS, margins, strict=True)
    ]
    args = RewardConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to=[],
        bf16=False,
        fp16=False,
        save_strategy="no",
        center_rewards_coefficient=center,
    )
    trainer = RewardTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer
    )
    trainer.model.eval()
    batch = trainer.data_collator(rows)
    ours = preference_rows(tokenizer, PAIRS)
    assert torch.equal(batch["input_ids"], ours.input_ids)
    assert torch.equal(batch["attention_mask"], ours.attention_mask)
    theirs = trainer.compute_loss(trainer.model, dict(batch))
    loss, metrics = bradley_terry_loss(
        *pair_rewards(model, ours),
        margin=torch.tensor(margins) if with_margin else None,
        center_rewards_coefficient=center or 0.0,
    )
    assert loss.item() == pytest.approx(theirs.item(), rel=1e-6, abs=1e-7)
    assert metrics["accuracy"] == pytest.approx(trainer._metrics["eval"]["accuracy"][-1])


def test_a_tiny_reward_model_ranks_held_out_pairs_of_its_distribution_well_above_chance(tiny_model, tmp_path):
    train, heldout = synthetic_pairs("train", 48), synthetic_pairs("heldout", 32)
    random.Random(0).shuffle(train)
    config = RewardModelConfig(
        model=str(tiny_model), output_dir=str(tmp_path), steps=24, batch_size=8, learning_rate=3e-3
    )
    learner = reward_learner_create(config)
    before = pair_accuracy(learner.model, learner.tokenizer, heldout)
    for step in range(config.steps):
        reward_step(learner, train, epoch_rows(len(train), config.batch_size, config.seed, step), config)
    after = pair_accuracy(learner.model, learner.tokenizer, heldout)
    assert after >= 0.85, (before, after)
    # Saved and loaded again, it scores the same way a grader will.
    learner.model.save_pretrained(tmp_path / "rm")
    learner.tokenizer.save_pretrained(tmp_path / "rm")
    scorer = RewardScorer.load(tmp_path / "rm")
    pair = heldout[0]
    chosen, rejected = scorer.scores([pair["prompt"]] * 2, [pair["chosen"], pair["rejected"]])
    reloaded = pair_accuracy(scorer.model, scorer.tokenizer, heldout)
    assert reloaded == after
    assert isinstance(chosen, float) and isinstance(rejected, float)

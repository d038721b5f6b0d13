"""Reward-model training on `prompt` / `chosen` / `rejected` pairs (TRL's preference format).

The model is the starting causal LM's body with a scalar head (`AutoModelForSequenceClassification`,
one label; inference/reward_model.py). Per step: take the step's pairs (epochs of seeded shuffles,
a pure function of seed and step), score the chosen and the rejected row of each, and minimise the
Bradley–Terry loss

    -log sigmoid(r(chosen) - r(rejected) - margin)  (+ c * mean((r(chosen) + r(rejected))^2))

which is TRL's `RewardTrainer.compute_loss` for the same inputs (tests/test_workers_parity.py): its
batch is the chosen rows then the rejected rows, right-padded, as here. The held-out measure is
pair accuracy: the share of pairs whose chosen completion the model scores higher.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from accelerate import Accelerator
from accelerate.utils import set_seed
from transformers import get_scheduler

from inference.reward_model import RewardRows, reward_model_load, reward_rows, rewards_of
from workers.learners.common import (
    Learner,
    LearnerConfig,
    TrainState,
    mixed_precision_resolve,
    optimizer_step,
)

PAIR_FIELDS = ("prompt", "chosen", "rejected")


@dataclass
class RewardModelConfig(LearnerConfig):
    learning_rate: float = 1e-4
    batch_size: int = 8  # pairs per optimiser step (split over the accumulation micro-batches)
    center_rewards_coefficient: float = 0.0  # pulls rewards towards 0 (TRL's option of the same name)
    max_length: int = 1024  # tokens per row; a longer prompt loses its start


def reward_pairs_check(pairs: list[dict]) -> list[dict]:
    """The pairs, after checking that each has a prompt, a chosen and a rejected completion."""
    for index, pair in enumerate(pairs):
        missing = [name for name in PAIR_FIELDS if not pair.get(name)]
        if missing:
            raise ValueError(
                f"pair {index} has no {', '.join(missing)}: every pair needs {', '.join(PAIR_FIELDS)}"
            )
    return pairs


def bradley_terry_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    *,
    margin: torch.Tensor | None = None,
    center_rewards_coefficient: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The mean Bradley–Terry loss over pairs (rewards (B,)) and its metrics.

    >>> loss, metrics = bradley_terry_loss(torch.tensor([2.0, 0.0]), torch.tensor([0.0, 1.0]))
    >>> round(loss.item(), 4), metrics["accuracy"], metrics["margin"]
    (0.7201, 0.5, 0.5)
    """
    difference = chosen - rejected
    if margin is not None:
        difference = difference - margin
    loss = -F.logsigmoid(difference).mean()
    if center_rewards_coefficient:
        loss = loss + center_rewards_coefficient * torch.mean((chosen + rejected) ** 2)
    metrics = {
        "accuracy": float((chosen > rejected).float().mean()),
        "margin": float((chosen - rejected).detach().mean()),
        "reward_chosen": float(chosen.detach().mean()),
        "reward_rejected": float(rejected.detach().mean()),
    }
    return loss, metrics


def preference_rows(tokenizer, pairs: list[dict], *, max_length: int = 0) -> RewardRows:
    """Chosen rows, then rejected rows (TRL's preference batch layout)."""
    prompts = [pair["prompt"] for pair in pairs]
    completions = [pair[name] for name in ("chosen", "rejected") for pair in pairs]
    return reward_rows(tokenizer, prompts + prompts, completions, max_length=max_length)


def pair_rewards(model: torch.nn.Module, rows: RewardRows) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) rewards of a `preference_rows` batch."""
    chosen, rejected = rewards_of(model, rows).chunk(2)
    return chosen, rejected


def reward_learner_create(config: RewardModelConfig) -> Learner:
    """The reward model (a fresh scalar head on the starting model), its optimiser and scheduler."""
    accelerator = Accelerator(
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        mixed_precision=mixed_precision_resolve(config.mixed_precision),
    )
    set_seed(config.seed)
    model, tokenizer = reward_model_load(config.model, device=str(accelerator.device))
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )
    scheduler = get_scheduler(
        config.lr_scheduler, optimizer, num_warmup_steps=config.warmup_steps, num_training_steps=config.steps
    )
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    state = TrainState()
    accelerator.register_for_checkpointing(state)
    return Learner(accelerator, model, tokenizer, optimizer, scheduler, state)


def reward_step(
    learner: Learner, pairs: list[dict], rows: list[int], config: RewardModelConfig
) -> dict[str, float]:
    """One optimiser step on `rows` of `pairs`, accumulated over micro-batches."""
    accelerator, count = learner.accelerator, 0
    totals: dict[str, float] = {}
    learner.model.train()
    for micro_rows in torch.tensor(rows).tensor_split(config.gradient_accumulation_steps):
        with accelerator.accumulate(learner.model):
            if len(micro_rows):
                chosen_pairs = [pairs[row] for row in micro_rows.tolist()]
                batch = preference_rows(learner.tokenizer, chosen_pairs, max_length=config.max_length)
                loss, metrics = bradley_terry_loss(
                    *pair_rewards(learner.model, batch.to(accelerator.device)),
                    center_rewards_coefficient=config.center_rewards_coefficient,
                )
                accelerator.backward(loss)
                for name, value in {"loss": loss.item(), **metrics}.items():
                    totals[name] = totals.get(name, 0.0) + value
                count += 1
            optimizer_step(learner, config.max_grad_norm)
    return {name: value / max(1, count) for name, value in totals.items()}


@torch.no_grad()
def pair_accuracy(
    model: torch.nn.Module, tokenizer, pairs: list[dict], *, batch_size: int = 32, max_length: int = 0
) -> float | None:
    """The share of pairs whose chosen completion scores higher than the rejected one (None: no pairs)."""
    if not pairs:
        return None
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    right = 0
    for start in range(0, len(pairs), batch_size):
        rows = preference_rows(tokenizer, pairs[start : start + batch_size], max_length=max_length)
        chosen, rejected = pair_rewards(model, rows.to(device))
        right += int((chosen > rejected).sum())
    model.train(was_training)
    return right / len(pairs)

"""Direct preference optimisation on `prompt` / `chosen` / `rejected` pairs (TRL's format).

The loop, per step: take the step's pairs (epochs of seeded shuffles, a pure function of seed and
step), score the chosen and the rejected completion of each under the policy and under the frozen
reference (the starting policy), and minimise the sigmoid DPO loss

    -log sigmoid(beta * ((log pi(chosen) - log ref(chosen)) - (log pi(rejected) - log ref(rejected))))

where each log-prob is summed over the completion's tokens. `label_smoothing` > 0 is the
conservative DPO of cDPO (the label is flipped with that probability). The loss is TRL's `sigmoid`
for the same inputs (tests/test_workers_parity.py).

Prompts are strings (a user message, rendered through the policy's chat template as rollouts and
evaluation render it; `apply_chat_template=False` uses them as they are, as TRL does) or
conversations (lists of messages, TRL's conversational format).
"""

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from inference.chat import item_prompt
from workers.learners.common import (
    Learner,
    LearnerConfig,
    Log,
    SequenceBatch,
    TrainResult,
    budget_groups,
    completion_render,
    epoch_rows,
    learner_create,
    optimizer_step,
    prompt_render,
    reference_create,
    reference_mode,
    sequence_logprob_sums,
    text_batch,
    train_steps,
)

PAIR_FIELDS = ("prompt", "chosen", "rejected")


@dataclass
class DPOConfig(LearnerConfig):
    learning_rate: float = 5e-4
    beta: float = 0.1  # strength of the pull towards the reference: small beta lets the policy move further
    label_smoothing: float = 0.0  # cDPO: the assumed probability that a pair's label is flipped
    batch_size: int = 8  # pairs per optimiser step (split over the accumulation micro-batches)
    apply_chat_template: bool = True

    def __post_init__(self) -> None:
        if self.beta <= 0:
            raise ValueError(f"beta must be positive; got {self.beta}")
        if not 0 <= self.label_smoothing < 0.5:
            raise ValueError(f"label_smoothing must be in [0, 0.5); got {self.label_smoothing}")


def dpo_pairs_check(pairs: list[dict]) -> list[dict]:
    """The pairs, after checking that each has a prompt, a chosen and a rejected completion."""
    for index, pair in enumerate(pairs):
        missing = [name for name in PAIR_FIELDS if not pair.get(name)]
        if missing:
            raise ValueError(
                f"pair {index} has no {', '.join(missing)}: every pair needs {', '.join(PAIR_FIELDS)}"
            )
    return pairs


def dpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The mean sigmoid DPO loss over pairs (all inputs (B,), summed completion log-probs) and metrics.

    >>> loss, metrics = dpo_loss(torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]),
    ...                          torch.tensor([-2.0]), beta=0.5)
    >>> round(loss.item(), 4), metrics["reward_margin"], metrics["reward_accuracy"]
    (0.3133, 1.0, 1.0)
    """
    chosen_rewards = beta * (chosen_logps - ref_chosen_logps)
    rejected_rewards = beta * (rejected_logps - ref_rejected_logps)
    logits = chosen_rewards - rejected_rewards
    losses = -F.logsigmoid(logits) * (1 - label_smoothing) - F.logsigmoid(-logits) * label_smoothing
    metrics = {
        "reward_margin": float(logits.detach().mean()),
        "reward_accuracy": float((logits.detach() > 0).float().mean()),
        "logp_chosen": float(chosen_logps.detach().mean()),
        "logp_rejected": float(rejected_logps.detach().mean()),
    }
    return losses.mean(), metrics


def pair_batch(tokenizer, pairs: list[dict], *, apply_chat_template: bool = True) -> SequenceBatch:
    """Chosen rows, then rejected rows, each prompt + completion + end of turn (the DPO forward
    batch); without the chat template the prompt is the raw text and completions end with EOS."""
    prompts = [prompt_render(tokenizer, pair["prompt"], chat=apply_chat_template) for pair in pairs]
    completions = [completion_render(pair[name]) for name in ("chosen", "rejected") for pair in pairs]
    return text_batch(tokenizer, prompts + prompts, completions, chat=apply_chat_template)


def pair_logps(model: torch.nn.Module, batch: SequenceBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) summed completion log-probs of a `pair_batch`."""
    sums, _ = sequence_logprob_sums(model, batch)
    chosen, rejected = sums.chunk(2)
    return chosen, rejected


def dpo_step(
    learner: Learner,
    reference: torch.nn.Module,
    pairs: list[dict],
    rows: list[int],
    config: DPOConfig,
) -> dict[str, float]:
    """One optimiser step on `rows`, accumulated over micro-batches."""
    accelerator, count, tokens = learner.accelerator, 0, 0
    totals: dict[str, float] = {}
    for micro_rows in torch.tensor(rows).tensor_split(config.gradient_accumulation_steps):
        with accelerator.accumulate(learner.model):
            if len(micro_rows):
                chosen = [pairs[row] for row in micro_rows.tolist()]
                batch = pair_batch(
                    learner.tokenizer, chosen, apply_chat_template=config.apply_chat_template and config.chat
                )
                for name, value in _backward_in_parts(learner, reference, batch, config).items():
                    totals[name] = totals.get(name, 0.0) + value
                count += 1
                tokens += int(batch.attention_mask.sum())
            optimizer_step(learner, config.max_grad_norm)
    # `tokens` is a sum (both completions of each pair and their prompts), not a mean.
    return {name: value / max(1, count) for name, value in totals.items()} | {"tokens": float(tokens)}


def _backward_in_parts(
    learner: Learner, reference: torch.nn.Module, batch: SequenceBatch, config: "DPOConfig"
) -> dict[str, float]:
    """The DPO loss of a pair batch, backpropagated in parts of whole pairs that fit
    `micro_batch_tokens` (a pair's two rows count as two of its longer one), each weighted by its
    share of the pairs; the metrics are the pairs' means."""
    pairs = batch.input_ids.size(0) // 2
    lengths = batch.attention_mask.sum(-1)
    longer = torch.maximum(lengths[:pairs], lengths[pairs:]).tolist()
    budget = config.micro_batch_tokens // 2 if config.micro_batch_tokens else 0
    totals: dict[str, float] = {}
    for part in budget_groups(longer, budget):
        micro = batch.rows(part + [pairs + row for row in part]).to(learner.accelerator.device)
        share = len(part) / pairs
        with torch.no_grad(), reference_mode(reference):
            ref_chosen, ref_rejected = pair_logps(reference, micro)
        loss, metrics = dpo_loss(
            *pair_logps(learner.model, micro),
            ref_chosen,
            ref_rejected,
            beta=config.beta,
            label_smoothing=config.label_smoothing,
        )
        learner.accelerator.backward(loss * share if share != 1 else loss)
        for name, value in {"loss": loss.item(), **metrics}.items():
            totals[name] = totals.get(name, 0.0) + value * share
    return totals


def train_dpo(config: DPOConfig, pairs: list[dict], *, log: Log = print) -> TrainResult:
    """Optimise the policy's preferences on `pairs`, against a frozen reference; resumes if it can."""
    pairs = dpo_pairs_check(pairs)
    learner, _ = learner_create(config)
    reference = reference_create(config, learner)

    def step(number: int) -> dict[str, float]:
        return dpo_step(
            learner, reference, pairs, epoch_rows(len(pairs), config.batch_size, config.seed, number), config
        )

    return train_steps(learner, config, step, log=log)


@torch.no_grad()
def preference_margins(
    model: torch.nn.Module,
    tokenizer,
    pairs: list[dict],
    *,
    apply_chat_template: bool = True,
    batch_size: int = 32,
) -> torch.Tensor:
    """log p(chosen) - log p(rejected) under `model` for each pair (> 0: the model prefers chosen)."""
    margins = []
    for start in range(0, len(pairs), batch_size):
        batch = pair_batch(
            tokenizer, pairs[start : start + batch_size], apply_chat_template=apply_chat_template
        )
        chosen, rejected = pair_logps(model, batch.to(next(model.parameters()).device))
        margins.append(chosen - rejected)
    return torch.cat(margins)


# -- as a run's learner (workers/run_learner.py reads these for every offline algorithm) --------


def run_config(run: Any, common: dict[str, Any]) -> DPOConfig:
    return DPOConfig(**common, batch_size=run.resolved["batch_size"], beta=run.resolved["beta"])


def run_data(run: Any, items: list[dict]) -> list[dict]:
    """The preference pairs the train split's items hold in their metadata (`chosen`, `rejected`)."""
    return dpo_pairs_check(
        [
            {"prompt": item_prompt(item), "chosen": meta["chosen"], "rejected": meta["rejected"]}
            for item in items
            if {"chosen", "rejected"} <= set(meta := item.get("metadata") or {})
        ]
    )


def reference_for(config: DPOConfig, learner: Learner) -> torch.nn.Module:
    """DPO measures against the starting policy, frozen."""
    return reference_create(config, learner)


def learn_examples(
    learner: Learner, reference: torch.nn.Module, config: DPOConfig, pairs: list[dict], step: int
) -> dict[str, float]:
    rows = epoch_rows(len(pairs), config.batch_size, config.seed, step)
    return dpo_step(learner, reference, pairs, rows, config)


# `manage.py train_learner dpo`: trained outside a run, from a JSONL file.
CONFIG = DPOConfig
train_standalone = train_dpo

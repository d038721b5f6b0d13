"""Supervised fine-tuning on reference solutions or reviewed trajectories, loss on completion tokens only.

The loop, per step: take the step's rows (epochs of seeded shuffles, a pure function of seed and
step), render each prompt as the policy sees it (its chat template), append the completion and the
EOS token, and minimise the mean negative log-likelihood of the completion tokens; the prompt
tokens are context, never targets. A step is `gradient_accumulation_steps` micro-batches.

Examples are `{"prompt": ..., "completion": ...}` (TRL's prompt-completion format, strings or
conversational messages); `sft_examples` also turns code task items into examples from their
`reference_solution`.
"""

from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from inference.chat import item_prompt
from inference.tool_chat import reply_render
from workers.learners.common import (
    Learner,
    LearnerConfig,
    Log,
    SequenceBatch,
    TrainResult,
    completion_logprobs,
    completion_render,
    epoch_rows,
    learner_create,
    optimizer_step,
    prompt_render,
    text_batch,
    train_steps,
)


@dataclass
class SFTConfig(LearnerConfig):
    learning_rate: float = 1e-3
    batch_size: int = 16  # examples per optimiser step (split over the accumulation micro-batches)


def sft_examples(records: list[dict]) -> list[dict]:
    """Prompt / completion examples from task items (their reference solution) or reviewed pairs.

    >>> sft_examples([{"prompt": "p", "reference_solution": "s"}, {"prompt": "q", "completion": "c"}])
    [{'prompt': 'p', 'completion': 's'}, {'prompt': 'q', 'completion': 'c'}]
    """
    examples = []
    for index, record in enumerate(records):
        completion = record.get("completion", record.get("reference_solution"))
        if not record.get("prompt") or not completion:
            raise ValueError(
                f"example {index} needs a `prompt` and a `completion` (or a task item's `reference_solution`)"
            )
        example = {"prompt": record["prompt"], "completion": completion}
        if record.get("tool_chat"):  # an OpenAI line with tools: rendered with them (sft_texts)
            example["tool_chat"] = record["tool_chat"]
        examples.append(example)
    return examples


def sft_texts(tokenizer: PreTrainedTokenizerBase, example: dict, *, chat: bool) -> tuple[str, str]:
    """(prompt, completion) text of one example: a conversation with tools through the template's
    `tools=` (or Flywheel's tool protocol when the template takes none), else the prompt rendered
    and the completion as it is."""
    if (tool_chat := example.get("tool_chat")) is not None:
        return reply_render(
            tokenizer if chat else None, tool_chat["messages"], tool_chat["reply"], tool_chat["tools"]
        )
    return prompt_render(tokenizer, example["prompt"], chat=chat), completion_render(example["completion"])


def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood over completion tokens (every token weighs the same), (B, T) in."""
    return -(logprobs * mask).sum() / mask.sum().clamp(min=1.0)


def sft_step(learner: Learner, examples: list[dict], rows: list[int], config: SFTConfig) -> dict[str, float]:
    """One optimiser step on `rows`, accumulated over micro-batches."""
    accelerator, losses, tokens = learner.accelerator, [], 0
    for micro_rows in torch.tensor(rows).tensor_split(config.gradient_accumulation_steps):
        with accelerator.accumulate(learner.model):
            if len(micro_rows):
                texts = [
                    sft_texts(learner.tokenizer, examples[row], chat=config.chat)
                    for row in micro_rows.tolist()
                ]
                batch = text_batch(
                    learner.tokenizer,
                    [prompt for prompt, _ in texts],
                    [completion for _, completion in texts],
                    chat=config.chat,
                )
                losses.append(_backward_in_parts(learner, batch, config.micro_batch_tokens))
                tokens += int(batch.attention_mask.sum())
            optimizer_step(learner, config.max_grad_norm)
    # `tokens`: the step's prompt and completion tokens (padding not counted), as OpenAI's trained_tokens.
    return {
        "loss": sum(losses) / max(1, len(losses)),
        "lr": float(learner.scheduler.get_last_lr()[0]),
        "tokens": float(tokens),
    }


def _backward_in_parts(learner: Learner, batch: SequenceBatch, token_budget: int) -> float:
    """The mean NLL of `batch`, backpropagated in forward passes that fit `token_budget`, each
    part weighted by its share of the completion tokens (the gradient of one pass over all)."""
    tokens, total = batch.completion_mask[:, 1:].sum().clamp(min=1), 0.0
    for part in batch.micro_batches(token_budget):
        micro = batch.rows(part).to(learner.accelerator.device)
        share = float(micro.completion_mask[:, 1:].sum() / tokens)
        loss = sft_loss(*completion_logprobs(learner.model, micro))
        learner.accelerator.backward(loss * share if share != 1 else loss)
        total += loss.item() * share
    return total


def train_sft(config: SFTConfig, examples: list[dict], *, log: Log = print) -> TrainResult:
    """Fine-tune on prompt / completion examples (see `sft_examples`); resumes if it can."""
    examples = sft_examples(examples)
    learner, _ = learner_create(config)

    def step(number: int) -> dict[str, float]:
        return sft_step(
            learner, examples, epoch_rows(len(examples), config.batch_size, config.seed, number), config
        )

    return train_steps(learner, config, step, log=log)


# -- as a run's learner (workers/run_learner.py reads these for every offline algorithm) --------


def run_config(run: Any, common: dict[str, Any]) -> SFTConfig:
    return SFTConfig(**common, batch_size=run.resolved["batch_size"])


def run_data(run: Any, items: list[dict]) -> list[dict]:
    """The train split's items as examples: each one's reference (a code item's solution), after
    the earlier trained turns of a multi-turn conversation (an OpenAI line's weight-1 replies)."""
    records = []
    for item in items:
        for turn in [*item.get("earlier_turns", []), item]:
            records.append(
                {
                    "prompt": item_prompt(turn),
                    "completion": turn.get("reference_solution") or turn.get("reference"),
                    "tool_chat": turn.get("tool_chat"),
                }
            )
    return sft_examples(records)


def reference_for(config: SFTConfig, learner: Learner) -> None:
    return None


def learn_examples(
    learner: Learner, reference: None, config: SFTConfig, examples: list[dict], step: int
) -> dict[str, float]:
    rows = epoch_rows(len(examples), config.batch_size, config.seed, step)
    return sft_step(learner, examples, rows, config)


# `manage.py train_learner sft`: trained outside a run, from a JSONL file.
CONFIG = SFTConfig
train_standalone = train_sft

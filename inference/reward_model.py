"""Reward models: a causal LM's body with a scalar head (`AutoModelForSequenceClassification`,
one label) that reads a prompt and a completion and answers one number, higher for preferred text.

The text a reward model reads is the text a policy sees and writes: the prompt through the
tokenizer's chat template (as rollouts render it), then the completion closed by the EOS token,
right-padded; the head reads the last token that is not padding. Training (workers/learners/
reward_model.py) and scoring (the `reward_model` grader) build their rows with `reward_rows`, so a
model scores exactly the way it was trained. Django-free, like the rest of inference/.
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedTokenizerBase

from inference.chat import template_text
from inference.policy import PolicyLoadError, prompt_text

Prompt = str | list[dict]
Completion = str | list[dict]


@dataclass
class RewardRows:
    """Right-padded rows of prompt + completion + EOS."""

    input_ids: torch.Tensor  # (B, L)
    attention_mask: torch.Tensor  # (B, L)

    def to(self, device: torch.device | str) -> "RewardRows":
        return RewardRows(self.input_ids.to(device), self.attention_mask.to(device))


def prompt_render(tokenizer: PreTrainedTokenizerBase, prompt: Prompt) -> str:
    """A prompt as the policy sees it: a user message, or a conversation, through the chat template."""
    if isinstance(prompt, str):
        return prompt_text(tokenizer, prompt)
    if getattr(tokenizer, "chat_template", None):
        return template_text(tokenizer, prompt, add_generation_prompt=True)
    return "\n".join(str(message.get("content", "")) for message in prompt) + "\n"


def completion_render(completion: Completion) -> str:
    """A completion's text: a string, or the assistant messages of a conversation."""
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content", "")) for m in completion if m.get("role") == "assistant")


def reward_token_ids(
    tokenizer: PreTrainedTokenizerBase, prompt: Prompt, completion: Completion, *, max_length: int = 0
) -> list[int]:
    """One row's token ids: rendered prompt, completion, EOS. With `max_length`, the prompt's start
    is cut first (the completion is what is judged)."""
    head = tokenizer(prompt_render(tokenizer, prompt), add_special_tokens=False)["input_ids"]
    tail = tokenizer(completion_render(completion), add_special_tokens=False)["input_ids"]
    ids = head + tail + [tokenizer.eos_token_id]
    return ids[-max_length:] if max_length else ids


def pad_rows(rows: list[list[int]], pad_token_id: int) -> RewardRows:
    """Right-padded ids and their attention mask (TRL's preference collator pads the same way)."""
    length = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), length), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(rows), length), dtype=torch.long)
    for index, row in enumerate(rows):
        input_ids[index, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention[index, : len(row)] = 1
    return RewardRows(input_ids, attention)


def reward_rows(
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[Prompt],
    completions: list[Completion],
    *,
    max_length: int = 0,
) -> RewardRows:
    rows = [
        reward_token_ids(tokenizer, prompt, completion, max_length=max_length)
        for prompt, completion in zip(prompts, completions, strict=True)
    ]
    return pad_rows(rows, tokenizer.pad_token_id)


def rewards_of(model: torch.nn.Module, rows: RewardRows) -> torch.Tensor:
    """The head's scalar per row, shape (B,)."""
    out = model(input_ids=rows.input_ids, attention_mask=rows.attention_mask, use_cache=False)
    return out.logits.squeeze(-1).float()


def reward_model_load(
    source: str | Path, *, device: str = "cpu"
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """A reward model and its tokenizer. From a causal LM's folder the scalar head starts fresh
    (what training does); from a trained reward model's folder it is the trained head."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source))
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = AutoModelForSequenceClassification.from_pretrained(str(source), num_labels=1)
    except (OSError, ValueError) as exc:
        raise PolicyLoadError(f"cannot load a reward model from {source}: {exc}") from exc
    # The head reads each row's last token that is not padding: the model must know the pad id.
    model.config.pad_token_id = tokenizer.pad_token_id
    model.to(device)
    model.eval()
    return model, tokenizer


@dataclass
class RewardScorer:
    """A loaded reward model that scores (prompt, completion) pairs in batches."""

    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    max_length: int = 1024
    batch_size: int = 32

    @classmethod
    def load(cls, source: str | Path, **options) -> "RewardScorer":
        model, tokenizer = reward_model_load(source)
        return cls(model, tokenizer, **options)

    @torch.no_grad()
    def scores(self, prompts: list[Prompt], completions: list[Completion]) -> list[float]:
        out: list[float] = []
        device = next(self.model.parameters()).device
        for start in range(0, len(prompts), self.batch_size):
            rows = reward_rows(
                self.tokenizer,
                prompts[start : start + self.batch_size],
                completions[start : start + self.batch_size],
                max_length=self.max_length,
            )
            out += rewards_of(self.model, rows.to(device)).tolist()
        return out

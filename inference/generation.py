"""What decoding is made of: completions, prompt encoding, stop tokens, sampling with recorded log-probs
(the decoder itself is `inference.decoding.decode`).

The learner needs the behaviour policy's log-probs to form importance ratios, and the replay view
shows them, so every completion carries them. They are log-softmax of the logits divided by the
temperature (the distribution sampled from before top-k / top-p truncation, which is what the
learner recomputes); greedy decoding records them at temperature 1.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from inference.chat import has_chat_template, turn_end_text
from inference.settings import SamplingParams

PromptInput = str | tuple[int, ...]  # a rendered prompt, or token ids taken as they are


@dataclass
class Completion:
    """One generated continuation of one prompt."""

    text: str  # decoded, without the stop sequence or end-of-sequence token
    token_ids: list[int]  # generated tokens, the stop sequence's and the EOS token included
    logprobs: list[float]  # one per token in token_ids
    finish_reason: str  # "stop" (EOS or a stop sequence) or "length" (the token budget ran out)
    prompt_token_ids: list[int] = field(default_factory=list)
    served_by: str = ""  # an engine's completion: the model (or adapter) the engine says answered
    # Served on /v1: its share of the batched decode's time on the device (the decode's seconds over
    # its rows, so a batch's shares add up to the time it held the device), and that device's class.
    device_seconds: float = 0.0
    device_class: str = ""


def stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """The tokens that end a completion: every end-of-sequence id of the model's generation config
    (Llama 3 and Gemma list several), the tokenizer's EOS, and the chat template's end of turn."""
    ids: set[int | None] = set()  # a config's or tokenizer's missing id (None) is dropped at the end
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured])
    ids.add(tokenizer.eos_token_id)
    if has_chat_template(tokenizer):
        end = tokenizer(turn_end_text(tokenizer), add_special_tokens=False)["input_ids"]
        if len(end) == 1:
            ids.add(end[0])
    return frozenset(token for token in ids if token is not None)


def prompt_token_ids(tokenizer: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    """A rendered prompt's tokens: the tokenizer's special tokens (BOS) added unless the chat
    template has already written them, so no prompt starts with two BOS tokens.

    Training encodes prompts the same way, so the learner sees what generation saw."""
    bos = tokenizer.bos_token
    added = not (bos and prompt.startswith(bos))
    return tokenizer(prompt, add_special_tokens=added)["input_ids"]


def prompts_encode(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[PromptInput]
) -> dict[str, torch.Tensor]:
    """Left-padded `input_ids` and `attention_mask` of rendered prompts (`prompt_token_ids`), or
    of prompts given as token ids (a tuple: taken as they are), whatever padding side the tokenizer
    keeps for training."""
    rows = [list(p) if isinstance(p, tuple) else prompt_token_ids(tokenizer, p) for p in prompts]
    width = max(len(row) for row in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        if row:
            input_ids[index, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            attention[index, width - len(row) :] = 1
    return {"input_ids": input_ids, "attention_mask": attention}


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask all but the top-k tokens and the smallest set whose probability reaches top_p.

    >>> filter_logits(torch.tensor([[1.0, 3.0, 2.0]]), top_k=2, top_p=1.0).tolist()
    [[-inf, 3.0, 2.0]]
    """
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_logits.softmax(-1) >= top_p  # keep the token that crosses top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def sample_next(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The next token of each row and its log-prob under the (temperature-scaled) policy."""
    if params.temperature == 0:
        tokens = logits.argmax(-1)
        return tokens, logits.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
    scaled = logits / params.temperature
    filtered = filter_logits(scaled, params.top_k, params.top_p)
    # Inverse-CDF sampling, one uniform per row (torch.multinomial costs ten times as much on a
    # CPU); the draw stays below the total, so a token of probability zero is never picked.
    cumulative = filtered.softmax(-1).cumsum(-1)
    total = cumulative[:, -1:]
    uniform = torch.rand(
        (cumulative.size(0), 1),
        generator=generator,
        device=generator.device if generator is not None else cumulative.device,
    ).to(cumulative.device)
    draw = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    tokens = torch.searchsorted(cumulative, draw, right=True).squeeze(-1)
    return tokens, scaled.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)


def decoded_text(
    tokenizer: PreTrainedTokenizerBase, token_ids: list[int], *, skip_special_tokens: bool = False
) -> str:
    """The text of one sequence of tokens (`decode` types its answer for a batch of sequences too)."""
    text = tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)
    assert isinstance(text, str), "one sequence decodes to one text"
    return text


def stop_position(text: str, stops: tuple[str, ...]) -> int | None:
    """Where the earliest stop sequence starts in text, if any."""
    positions = [text.find(stop) for stop in stops if stop in text]
    return min(positions) if positions else None


def stopped_rows(
    tokenizer: PreTrainedTokenizerBase,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    candidates: torch.Tensor,
    stops: tuple[str, ...],
) -> torch.Tensor:
    """Rows whose text so far holds a stop sequence; only the still-running rows are decoded."""
    stopped = torch.zeros_like(candidates)
    for row in candidates.nonzero().flatten().tolist():
        text = decoded_text(tokenizer, tokens[row, : int(lengths[row])].tolist())
        stopped[row] = stop_position(text, stops) is not None
    return stopped


def completion_build(
    tokenizer: PreTrainedTokenizerBase,
    token_ids: list[int],
    logprobs: list[float],
    params: SamplingParams,
    prompt_ids: list[int],
    stop_ids: frozenset[int] | None = None,
) -> Completion:
    stop_ids = stop_ids if stop_ids is not None else frozenset({tokenizer.eos_token_id})
    text = decoded_text(tokenizer, token_ids, skip_special_tokens=True)
    cut = stop_position(text, params.stop) if params.stop else None
    stopped = cut is not None or (bool(token_ids) and token_ids[-1] in stop_ids)
    return Completion(
        text=text if cut is None else text[:cut],
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason="stop" if stopped else "length",
        prompt_token_ids=prompt_ids,
    )

"""Batched generation with a KV cache, recording the log-probability of every generated token.

The learner needs the behaviour policy's log-probs to form importance ratios, and the replay view
shows them, so every completion carries them. They are log-softmax of the logits divided by the
temperature (the distribution sampled from before top-k / top-p truncation, which is what the
learner recomputes); greedy decoding records them at temperature 1.
"""

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from inference.chat import has_chat_template, turn_end_text
from inference.settings import SamplingParams


@dataclass
class Completion:
    """One generated continuation of one prompt."""

    text: str  # decoded, without the stop sequence or end-of-sequence token
    token_ids: list[int]  # generated tokens, the stop sequence's and the EOS token included
    logprobs: list[float]  # one per token in token_ids
    finish_reason: str  # "stop" (EOS or a stop sequence) or "length" (the token budget ran out)
    prompt_token_ids: list[int] = field(default_factory=list)


def stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """The tokens that end a completion: every end-of-sequence id of the model's generation config
    (Llama 3 and Gemma list several), the tokenizer's EOS, and the chat template's end of turn."""
    ids: set[int] = set()
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


def prompts_encode(tokenizer: PreTrainedTokenizerBase, prompts: list[str]) -> dict[str, torch.Tensor]:
    """Left-padded `input_ids` and `attention_mask` of rendered prompts (`prompt_token_ids`),
    whatever padding side the tokenizer keeps for training."""
    rows = [prompt_token_ids(tokenizer, prompt) for prompt in prompts]
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
    tokens = torch.multinomial(filtered.softmax(-1), 1, generator=generator).squeeze(-1)
    return tokens, scaled.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)


def stop_position(text: str, stops: tuple[str, ...]) -> int | None:
    """Where the earliest stop sequence starts in text, if any."""
    positions = [text.find(stop) for stop in stops if stop in text]
    return min(positions) if positions else None


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    params: SamplingParams,
    *,
    generator: torch.Generator | None = None,
) -> list[Completion]:
    """One completion per prompt (repeat a prompt for a group), decoded together with a KV cache.
    A prompt that repeats is prefilled once and its cache copied to its rows."""
    device = next(model.parameters()).device
    unique = list(dict.fromkeys(prompts))
    encoded = {name: tensor.to(device) for name, tensor in prompts_encode(tokenizer, unique).items()}
    stops = torch.tensor(sorted(stop_token_ids(model, tokenizer)), device=device)
    cache = DynamicCache()
    logits = (
        model(
            input_ids=encoded["input_ids"],
            attention_mask=encoded["attention_mask"],
            position_ids=(encoded["attention_mask"].cumsum(-1) - 1).clamp(min=0),
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        .logits[:, -1]
        .float()
    )
    index = {prompt: row for row, prompt in enumerate(unique)}
    rows = torch.tensor([index[prompt] for prompt in prompts], device=device)
    if len(unique) < len(prompts):
        cache.batch_select_indices(rows)
    encoded = {name: tensor[rows] for name, tensor in encoded.items()}
    logits = logits[rows]
    attention = encoded["attention_mask"]
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    batch = len(prompts)
    # Tokens and log-probs stay tensors until the end: moving each step to Python costs more
    # than the tiny models' forward passes.
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    tokens = torch.full((batch, params.max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((batch, params.max_new_tokens), device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    lengths = torch.zeros(batch, dtype=torch.long, device=device)
    for step in range(params.max_new_tokens):
        next_tokens, next_logprobs = sample_next(logits, params, generator)
        active = ~finished
        tokens[:, step] = torch.where(active, next_tokens, tokens[:, step])
        logprobs[:, step] = torch.where(active, next_logprobs, logprobs[:, step])
        lengths += active.long()
        finished |= active & torch.isin(next_tokens, stops)
        if params.stop:
            finished |= stopped_rows(tokenizer, tokens, lengths, active & ~finished, params.stop)
        if bool(finished.all()):
            break
        attention = torch.cat([attention, attention.new_ones(batch, 1)], dim=-1)
        positions = positions[:, -1:] + 1
        next_input = next_tokens.masked_fill(finished, pad_id)
        logits = (
            model(
                input_ids=next_input[:, None],
                attention_mask=attention,
                position_ids=positions,
                cache=cache,
                use_cache=True,
            )
            .logits[:, -1]
            .float()
        )
    counts = lengths.tolist()
    token_lists = [row[:count] for row, count in zip(tokens.tolist(), counts, strict=True)]
    logprob_lists = [row[:count] for row, count in zip(logprobs.tolist(), counts, strict=True)]
    prompt_ids = [
        ids[mask.bool()].tolist()
        for ids, mask in zip(encoded["input_ids"], encoded["attention_mask"], strict=True)
    ]
    stop_ids = frozenset(stops.tolist())
    return [
        completion_build(tokenizer, token_lists[row], logprob_lists[row], params, prompt_ids[row], stop_ids)
        for row in range(batch)
    ]


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
        text = tokenizer.decode(tokens[row, : int(lengths[row])].tolist())
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
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    cut = stop_position(text, params.stop) if params.stop else None
    stopped = cut is not None or (bool(token_ids) and token_ids[-1] in stop_ids)
    return Completion(
        text=text if cut is None else text[:cut],
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason="stop" if stopped else "length",
        prompt_token_ids=prompt_ids,
    )

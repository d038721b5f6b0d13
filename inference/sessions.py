"""Multi-turn generation that reuses each conversation's key/value cache across its turns.

An agent episode's prompt grows by a few tokens a turn (the tool's result, the next turn's
header); encoding the whole transcript again each turn is quadratic. `ChatSessions` keeps one
batched cache for the conversations of a wave and each one's **token transcript** (every prompt
and completion token so far). A turn's prompt text that extends the last prompt and the model's
own completion is encoded only for the new text, appended to the cache; the completion's tokens
are exactly what was sampled, so the transcript is one token sequence the learner can train as a
whole. A prompt that does not extend its transcript (a template that rewrote history, or elided
tool results) is encoded afresh, and the cache rebuilt from the transcripts.

Rows of the batch hold their tokens left-padded; padding between turns (a row that finished early,
a shorter new chunk) is masked out and takes no position, so a row's logits equal those of its
transcript encoded alone (the equality tests check it).
"""

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from inference.generation import Completion, completion_build, sample_next, stopped_rows
from inference.settings import SamplingParams


@dataclass
class Transcript:
    text: str = ""  # the last prompt's text and the model's completion text after it
    token_ids: list[int] = field(default_factory=list)  # every token so far, prompts and completions
    fed: int = 0  # how many of token_ids are in the cache
    ended_with_eos: bool = False


@dataclass
class SessionStats:
    prompt_tokens: int = 0  # the prompts' tokens, as the turns saw them
    encoded_tokens: int = 0  # what the model actually encoded for them (reuse: only the new ones)
    generated_tokens: int = 0
    rebuilds: int = 0  # turns whose prompt did not extend its transcript
    cpu_seconds: float = 0.0  # for callers that time a session (the benchmark)


def transcript_extend(
    tokenizer: PreTrainedTokenizerBase, transcript: Transcript, prompt: str, *, reuse: bool = True
) -> list[int] | None:
    """Append the prompt's new text to the transcript; its new tokens, or None when the prompt
    does not extend the transcript (then the transcript restarts from the prompt, encoded whole)."""
    if transcript.token_ids and reuse and prompt.startswith(transcript.text):
        rest = prompt[len(transcript.text) :]
        eos = tokenizer.eos_token or ""
        if transcript.ended_with_eos and eos and rest.startswith(eos):
            rest = rest[len(eos) :]  # the template's end of turn: the sampled EOS token is it
        new = tokenizer(rest, add_special_tokens=False)["input_ids"] if rest else []
        transcript.token_ids += new
        transcript.text = prompt
        return new
    transcript.token_ids = tokenizer(prompt)["input_ids"]
    transcript.text, transcript.fed = prompt, 0
    return None


def transcript_answer(transcript: Transcript, text: str, token_ids: list[int], eos_token_id: int) -> None:
    """Append the model's answer (its text and tokens) to the transcript."""
    transcript.token_ids += token_ids
    transcript.text += text
    transcript.ended_with_eos = bool(token_ids) and token_ids[-1] == eos_token_id


class ChatSessions:
    """`turn(keys, prompts)`: one completion per conversation `key`, reusing its cache."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        params: SamplingParams,
        *,
        reuse: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        self.model, self.tokenizer, self.params = model, tokenizer, params
        self.reuse, self.generator = reuse, generator
        self.device = next(model.parameters()).device
        self.transcripts: dict[int, Transcript] = {}
        self.rows: list[int] = []  # the cache's rows, by key
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # the cache's attention mask, [rows, length]
        self.last_position: torch.Tensor | None = None  # each row's last position (-1: none yet)
        self.stats = SessionStats()

    @torch.no_grad()
    def turn(self, keys: list[int], prompts: list[str]) -> list[Completion]:
        pending = [self._extend(key, prompt) for key, prompt in zip(keys, prompts, strict=True)]
        reusable = self.reuse and self.cache is not None and set(keys) <= set(self.rows)
        if reusable and all(
            chunk is not None and (chunk or self._unfed(key))
            for key, chunk in zip(keys, pending, strict=True)
        ):
            self._select(keys)
            logits = self._feed([self._unfed(key) for key in keys])
        else:
            self.stats.rebuilds += 0 if self.cache is None else 1
            logits = self._rebuild(keys, prompts, pending)
        prompt_ids = [list(self.transcripts[key].token_ids) for key in keys]
        self.stats.prompt_tokens += sum(len(ids) for ids in prompt_ids)
        return self._decode(keys, logits, prompt_ids)

    # -- the transcript ---------------------------------------------------------------------

    def _extend(self, key: int, prompt: str) -> list[int] | None:
        transcript = self.transcripts.setdefault(key, Transcript())
        return transcript_extend(self.tokenizer, transcript, prompt, reuse=self.reuse)

    def _unfed(self, key: int) -> list[int]:
        transcript = self.transcripts[key]
        return transcript.token_ids[transcript.fed :]

    # -- the cache --------------------------------------------------------------------------

    def _select(self, keys: list[int]) -> None:
        if keys == self.rows:
            return
        index = torch.tensor([self.rows.index(key) for key in keys], device=self.device)
        self.cache.batch_select_indices(index)
        self.mask = self.mask[index]
        self.last_position = self.last_position[index]
        self.rows = list(keys)

    def _rebuild(self, keys: list[int], prompts: list[str], pending) -> torch.Tensor:
        """Encode every row's whole transcript into a fresh cache."""
        for key in keys:
            self.transcripts[key].fed = 0
        self.cache, self.rows = DynamicCache(), list(keys)
        self.mask = torch.zeros((len(keys), 0), dtype=torch.long, device=self.device)
        return self._feed([self._unfed(key) for key in keys])

    def _feed(self, chunks: list[list[int]]) -> torch.Tensor:
        """Append each row's chunk (left-padded to the longest) to the cache; the next-token logits."""
        width = max(len(chunk) for chunk in chunks)
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([[pad] * (width - len(c)) + c for c in chunks], device=self.device)
        new_mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in chunks], device=self.device)
        self.mask = torch.cat([self.mask, new_mask], dim=-1)
        counted = self.mask.cumsum(-1)[:, -width:] - 1
        self.last_position = counted[:, -1]
        positions = counted.clamp(min=0)
        self.stats.encoded_tokens += sum(len(chunk) for chunk in chunks)
        for key, chunk in zip(self.rows, chunks, strict=True):
            self.transcripts[key].fed += len(chunk)
        out = self.model(
            input_ids=ids,
            attention_mask=self.mask,
            position_ids=positions,
            cache=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1].float()

    # -- decoding ---------------------------------------------------------------------------

    def _decode(self, keys: list[int], logits: torch.Tensor, prompt_ids: list[list[int]]) -> list[Completion]:
        """Sample each row's answer. Tokens, log-probs and which rows are live stay tensors until
        the end (as in `inference.generation`): per token, Python work costs more than the tiny
        models' forward passes."""
        params, batch, device = self.params, len(keys), self.device
        pad = self.tokenizer.pad_token_id
        tokens = torch.full((batch, params.max_new_tokens), pad, dtype=torch.long, device=device)
        logprobs = torch.zeros((batch, params.max_new_tokens), device=device)
        finished = torch.zeros(batch, dtype=torch.bool, device=device)
        lengths = torch.zeros(batch, dtype=torch.long, device=device)
        fed = 0  # decode steps whose sampled tokens went into the cache
        for step in range(params.max_new_tokens):
            next_tokens, next_logprobs = sample_next(logits, params, self.generator)
            active = ~finished
            tokens[:, step] = torch.where(active, next_tokens, tokens[:, step])
            logprobs[:, step] = torch.where(active, next_logprobs, logprobs[:, step])
            lengths += active.long()
            finished = finished | (active & (next_tokens == self.tokenizer.eos_token_id))
            if params.stop:
                finished |= stopped_rows(self.tokenizer, tokens, lengths, active & ~finished, params.stop)
            if step == params.max_new_tokens - 1 or bool(finished.all()):
                break
            logits = self._feed_step(next_tokens, active)
            fed += 1
        counts = lengths.tolist()
        token_rows = [row[:count] for row, count in zip(tokens.tolist(), counts, strict=True)]
        logprob_rows = [row[:count] for row, count in zip(logprobs.tolist(), counts, strict=True)]
        self.stats.generated_tokens += sum(counts)
        completions = []
        for row, key in enumerate(keys):
            # A row was fed each decode step it was live in: its first min(count, fed) tokens.
            self.transcripts[key].fed += min(counts[row], fed)
            completion = completion_build(
                self.tokenizer, token_rows[row], logprob_rows[row], params, prompt_ids[row]
            )
            transcript_answer(
                self.transcripts[key], completion.text, token_rows[row], self.tokenizer.eos_token_id
            )
            completions.append(completion)
        return completions

    def _feed_step(self, next_tokens: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """Feed each row's sampled token; rows that had already finished feed masked padding
        (which takes no position: a live row's next position is its last one plus one)."""
        ids = next_tokens.masked_fill(~live, self.tokenizer.pad_token_id)[:, None]
        column = live.long()[:, None]
        self.mask = torch.cat([self.mask, column], dim=-1)
        self.last_position = self.last_position + column[:, 0]
        out = self.model(
            input_ids=ids,
            attention_mask=self.mask,
            position_ids=self.last_position[:, None].clamp(min=0),
            cache=self.cache,
            use_cache=True,
        )
        return out.logits[:, -1].float()

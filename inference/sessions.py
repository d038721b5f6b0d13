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

The decode loop is the one decoder's accept step (`inference.decoding.accept_sampled`: sampling,
the recorded log-probs, stop tokens and sequences) over a cache that outlives the turn; it keeps
its tokens, log-probs and stop flags as tensors (one move to Python per turn, not per token and
episode), and a plain Llama runs through `inference.lean_llama` with a
preallocated cache that grows a turn at a time (the Hugging Face cache concatenates every layer's
keys and values at every token, a copy of the whole transcript per step); any other model (an
adapter, a wrapper) runs its own forward with a `DynamicCache`. The lean decoder reads the
weights when the session is made: a session serves one wave, whose weights do not change.
"""

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from inference.decoding import Record, accept_sampled
from inference.generation import Completion, completion_build
from inference.lean_llama import lean_llama
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
        self.lean = lean_llama(model)  # None: the model's own forward and a DynamicCache
        self.transcripts: dict[int, Transcript] = {}
        self.rows: list[int] = []  # the cache's rows, by key
        self.cache: DynamicCache | None = None  # None until the first turn builds it
        # The cache's attention mask, [rows, capacity] (True where a real token stands; only the
        # first `length` columns are in use) and each row's next position (its real tokens so far).
        # Empty until the first turn's rebuild.
        self.mask = torch.zeros((0, 0), dtype=torch.bool, device=self.device)
        self.length = 0
        self.positions = torch.zeros(0, dtype=torch.long, device=self.device)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        # A turn ends at the tokenizer's end of sequence: the transcript's next prompt follows it.
        self.stops = torch.tensor([tokenizer.eos_token_id], device=self.device)
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
            logits = self._rebuild(keys)
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
        if self.lean is not None:
            self.lean.select(index)
        else:
            assert self.cache is not None, "a turn selects rows only of a cache it reuses"
            self.cache.batch_select_indices(index)
        self.mask, self.positions = self.mask[index], self.positions[index]
        self.rows = list(keys)

    def _rebuild(self, keys: list[int]) -> torch.Tensor:
        """Encode every row's whole transcript into a fresh cache."""
        for key in keys:
            self.transcripts[key].fed = 0
        self.cache, self.rows, self.length = DynamicCache(), list(keys), 0
        self.mask = torch.zeros((len(keys), 0), dtype=torch.bool, device=self.device)
        self.positions = torch.zeros(len(keys), dtype=torch.long, device=self.device)
        if self.lean is not None:
            self.lean.capacity, self.lean.length = None, 0
        return self._feed([self._unfed(key) for key in keys])

    def _reserve(self, needed: int) -> None:
        """Room for `needed` positions per row in the mask (and the lean decoder's cache), with
        headroom so that a growing episode reallocates only every few turns."""
        if needed <= self.mask.size(1):
            return
        capacity = needed + needed // 2
        mask = torch.zeros((self.mask.size(0), capacity), dtype=torch.bool, device=self.device)
        mask[:, : self.length] = self.mask[:, : self.length]
        self.mask = mask
        if self.lean is not None:
            self.lean.reserve(len(self.rows), capacity)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Run `ids` (rows, width) at `positions`, its mask columns already written; the last
        position's logits (float32)."""
        end = self.length + ids.size(1)
        if self.lean is not None:
            logits = self.lean.forward(ids, positions, self.mask)
        else:
            logits = (
                self.model(
                    input_ids=ids,
                    attention_mask=self.mask[:, :end].long(),
                    position_ids=positions,
                    cache=self.cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
                .logits[:, -1]
                .float()
            )
        self.length = end
        return logits

    def _feed(self, chunks: list[list[int]]) -> torch.Tensor:
        """Append each row's chunk (left-padded to the longest) to the cache; the next-token logits."""
        width = max(len(chunk) for chunk in chunks)
        self._reserve(self.length + width + self.params.max_new_tokens)
        ids = torch.full((len(chunks), width), self.pad_id, dtype=torch.long)
        new_mask = torch.zeros((len(chunks), width), dtype=torch.bool)
        for row, chunk in enumerate(chunks):
            if chunk:
                ids[row, width - len(chunk) :] = torch.tensor(chunk, dtype=torch.long)
                new_mask[row, width - len(chunk) :] = True
        ids, new_mask = ids.to(self.device), new_mask.to(self.device)
        self.mask[:, self.length : self.length + width] = new_mask
        positions = (self.positions[:, None] + new_mask.long().cumsum(-1) - 1).clamp(min=0)
        self.positions = self.positions + new_mask.long().sum(-1)
        self.stats.encoded_tokens += sum(len(chunk) for chunk in chunks)
        for key, chunk in zip(self.rows, chunks, strict=True):
            self.transcripts[key].fed += len(chunk)
        return self._forward(ids, positions)

    # -- decoding ---------------------------------------------------------------------------

    def _decode(self, keys: list[int], logits: torch.Tensor, prompt_ids: list[list[int]]) -> list[Completion]:
        """Sample up to `max_new_tokens` per row. Tokens, log-probs and stop flags stay tensors
        until the turn ends; a row's sampled token (its EOS included) is fed to the cache at the
        next step, a finished row feeds masked padding that takes no position."""
        params, batch, device = self.params, len(keys), self.device
        record = Record.empty(batch, params.max_new_tokens, self.pad_id, device)
        rows = torch.arange(batch, device=device)
        fed = torch.zeros(batch, dtype=torch.long, device=device)
        for step in range(params.max_new_tokens):
            next_tokens, _, running, _ = accept_sampled(
                logits,
                params,
                self.generator,
                record=record,
                rows=rows,
                step=step,
                stops=self.stops,
                tokenizer=self.tokenizer,
            )
            if step == params.max_new_tokens - 1 or bool(record.finished.all()):
                break
            # The rows that sampled this step feed their token; the others, masked padding.
            self.mask[:, self.length] = running
            fed += running.long()
            positions = self.positions[:, None]
            self.positions = self.positions + running.long()
            logits = self._forward(next_tokens.masked_fill(~running, self.pad_id)[:, None], positions)
        token_rows, logprob_rows = record.tokens.tolist(), record.logprobs.tolist()
        length_rows, fed_rows = record.lengths.tolist(), fed.tolist()
        self.stats.generated_tokens += sum(length_rows)
        completions = []
        for row, key in enumerate(keys):
            count = length_rows[row]
            row_tokens, row_logprobs = token_rows[row][:count], logprob_rows[row][:count]
            completion = completion_build(self.tokenizer, row_tokens, row_logprobs, params, prompt_ids[row])
            transcript = self.transcripts[key]
            transcript.fed += fed_rows[row]
            transcript_answer(transcript, completion.text, row_tokens, self.tokenizer.eos_token_id)
            completions.append(completion)
        return completions

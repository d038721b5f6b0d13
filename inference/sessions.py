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

from inference.generation import Completion, completion_build, sample_next, stop_position
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
        positions = (self.mask.cumsum(-1) - 1).clamp(min=0)[:, -width:]
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
        params, batch = self.params, len(keys)
        tokens: list[list[int]] = [[] for _ in keys]
        logprobs: list[list[float]] = [[] for _ in keys]
        active = [True] * batch
        for step in range(params.max_new_tokens):
            next_tokens, next_logprobs = sample_next(logits, params, self.generator)
            chosen, scores = next_tokens.tolist(), next_logprobs.tolist()
            sampled = list(active)
            for row in range(batch):
                if not active[row]:
                    continue
                tokens[row].append(chosen[row])
                logprobs[row].append(scores[row])
                if chosen[row] == self.tokenizer.eos_token_id or self._stopped(tokens[row]):
                    active[row] = False
            if not any(active) or step == params.max_new_tokens - 1:
                break
            logits = self._feed_step(chosen, sampled)
        self.stats.generated_tokens += sum(len(row) for row in tokens)
        completions = []
        for row, key in enumerate(keys):
            completion = completion_build(self.tokenizer, tokens[row], logprobs[row], params, prompt_ids[row])
            transcript_answer(
                self.transcripts[key], completion.text, tokens[row], self.tokenizer.eos_token_id
            )
            completions.append(completion)
        return completions

    def _feed_step(self, chosen: list[int], sampled: list[bool]) -> torch.Tensor:
        """Feed each row's sampled token; rows that had already finished feed masked padding."""
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor(
            [[token if live else pad] for token, live in zip(chosen, sampled, strict=True)],
            device=self.device,
        )
        column = torch.tensor([[int(live)] for live in sampled], device=self.device)
        self.mask = torch.cat([self.mask, column], dim=-1)
        positions = (self.mask.cumsum(-1) - 1).clamp(min=0)[:, -1:]
        for key, live in zip(self.rows, sampled, strict=True):
            self.transcripts[key].fed += int(live)
        out = self.model(
            input_ids=ids, attention_mask=self.mask, position_ids=positions, cache=self.cache, use_cache=True
        )
        return out.logits[:, -1].float()

    def _stopped(self, row_tokens: list[int]) -> bool:
        if not self.params.stop:
            return False
        return stop_position(self.tokenizer.decode(row_tokens), self.params.stop) is not None

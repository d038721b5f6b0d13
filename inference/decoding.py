"""The one decoder: decoding the way a tier says, wherever anything generates.

A tier's settings all change how generation runs:

- precision: fp32; bf16 / fp16 where the device runs them; int8 is dynamic quantisation of every
  Linear layer (`torch.ao.quantization.quantize_dynamic`, CPU only);
- speculative decoding: `draft_model` (a smaller model with the same tokenizer proposes
  `speculative_tokens` tokens, the tier's model verifies them in one forward pass) or
  `prompt_lookup` (the proposal is what followed the latest earlier occurrence of the last n-gram,
  in the prompt or the text so far). Greedy decoding keeps the target's tokens exactly; sampling
  uses the speculative-sampling acceptance rule, so the output distribution is the target's too;
- KV-cache reuse for shared prefixes: identical prompts in a call (a group of samples of one
  prompt) are prefilled once and their cache is copied to every row of the group;
- batching (`batch_size` rows decode together), decoding parameters and the token budget.

`decode` is the one entry point. A batch is prefilled, then each step proposes tokens, verifies
them with the tier's model and accepts some, until every row has finished. Without speculation
nothing is proposed: a step verifies each running row's last token and accepts one sampled token,
in tensors (`_Plain`; a plain Llama or Qwen2 through inference/lean_llama.py, on CUDA its step
replayed as a CUDA graph per batch-size bucket: inference/cuda_graphs.py). With speculation the decoder
keeps one KV cache per model over a batch whose rows advance by different amounts: each cache
slot is masked in or out per row and position ids count only a row's valid slots, so rejected
draft tokens are simply masked out. Every emitted token carries its log-prob under the tier's
model (log-softmax of the temperature-scaled logits; greedy at temperature 1).

Rollouts (a policy mid-training decodes as `policy_tier(policy, params)`), evaluation, tiers,
judges, serving, the playground and agents decode through `decode`; multi-turn sessions
(sessions.py) keep each conversation's cache between turns and share its sampling step.
"""

import copy
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from inference.adapters import adapter_activate, adapter_base, adapter_merge
from inference.chat import Prompt
from inference.cuda_graphs import StepRunner, step_runner
from inference.engines import EngineError, EngineTier, engine_generate, engine_tier_load
from inference.generation import (
    Completion,
    PromptInput,
    completion_build,
    decoded_text,
    filter_logits,
    prompts_encode,
    sample_next,
    stop_position,
    stop_token_ids,
    stopped_rows,
)
from inference.lean_llama import LeanLlama, lean_llama
from inference.policy import Policy, PolicyLoadError, policy_load
from inference.settings import PRECISIONS, SamplingParams, TierSettings, model_source

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MAX_NGRAM = 3  # prompt lookup tries the last 3, 2, then 1 tokens

# Told of every token as it is emitted: (row in the call's prompts, token id, its log-prob, the
# log-prob of every token of the vocabulary at that position). What serving streams and its
# top-logprobs come from; it may raise to stop the generation (a client that went away).
TokenListener = Callable[[int, int, float, torch.Tensor], None]


class TierError(ValueError):
    """The tier cannot run here (no such device, a precision the device lacks, a draft model whose
    tokenizer differs): the message says which setting and why."""


def device_class(device: torch.device | str) -> str:
    """`cpu`, or the GPU's name (what an operator prices device-hours by)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


@dataclass
class TierModel:
    """A policy prepared for a tier: the model at the tier's precision, its tokenizer, the draft."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    settings: TierSettings
    draft: PreTrainedModel | None = None
    version: int = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def policy(self) -> Policy:
        return Policy(
            model=self.model, tokenizer=self.tokenizer, version=self.version, chat=self.settings.chat
        )

    def prompt_text(self, prompt: Prompt) -> str:
        return self.policy.prompt_text(prompt)

    @property
    def max_context(self) -> int:
        """Tokens the model attends over: the prompt and what it generates must fit."""
        positions = getattr(self.model.config, "max_position_embeddings", None)
        return int(positions or min(self.tokenizer.model_max_length, 1 << 20))


# --- precision and loading ---------------------------------------------------------------------


def resolve_device(settings: TierSettings) -> str:
    """The device the tier runs on: int8 runs on the CPU; auto takes a GPU when there is one."""
    if settings.precision == "int8":
        if settings.device == "cuda":
            raise TierError("int8 dynamic quantisation runs on the CPU; choose device cpu or auto")
        return "cpu"
    cuda = torch.cuda.is_available()
    device = ("cuda" if cuda else "cpu") if settings.device == "auto" else settings.device
    if device == "cuda" and not cuda:
        raise TierError("the tier asks for a CUDA GPU and this machine has none")
    if settings.precision == "fp16" and device == "cpu":
        raise TierError("fp16 generation needs a GPU; on the CPU use bf16 or fp32")
    if settings.precision == "bf16" and device == "cuda" and not torch.cuda.is_bf16_supported():
        raise TierError("this GPU does not support bf16; use fp16 or fp32")
    return device


def model_prepare(model: PreTrainedModel, settings: TierSettings) -> PreTrainedModel:
    """The model at the tier's precision on the tier's device (int8: Linear layers quantised, a
    LoRA adapter merged into them first)."""
    device = resolve_device(settings)
    if settings.precision == "int8":
        if getattr(model, "peft_config", None) is not None:
            model = adapter_merge(model)
        # transformers wraps PreTrainedModel.to with functools.wraps, whose stub leaves `self` unbound.
        model = model.to(device="cpu", dtype=torch.float32)  # type: ignore[call-arg]
        with warnings.catch_warnings():  # torch.ao's eager quantisation warns that torchao succeeds it
            warnings.simplefilter("ignore", (DeprecationWarning, UserWarning))
            model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    else:
        if settings.precision not in DTYPES:
            raise TierError(f"precision must be one of {', '.join(PRECISIONS)}; got {settings.precision!r}")
        model = model.to(device=device, dtype=DTYPES[settings.precision])  # type: ignore[call-arg]
    model.eval()
    return model


def tier_prepare(
    policy: Policy, settings: TierSettings, *, draft: PreTrainedModel | Policy | None = None
) -> TierModel:
    """Wrap a loaded policy for the tier: precision applied, the draft model loaded when needed."""
    draft_model = None
    if settings.speculation == "draft_model" and settings.speculative_tokens > 0:
        if draft is None:
            if not settings.draft_model:
                raise TierError("speculation draft_model needs a draft model")
            try:
                draft = policy_load(model_source(settings.draft_model))
            except PolicyLoadError as exc:
                raise TierError(f"draft model: {exc}") from exc
        if isinstance(draft, Policy):
            if draft.tokenizer.get_vocab() != policy.tokenizer.get_vocab():
                raise TierError(
                    "the draft model's tokenizer differs from the tier model's; they must share one"
                )
            draft = draft.model
        draft_model = model_prepare(copy.deepcopy(draft) if draft is policy.model else draft, settings)
    return TierModel(
        model=model_prepare(policy.model, settings),
        tokenizer=policy.tokenizer,
        settings=settings,
        draft=draft_model,
        version=policy.version,
    )


def tier_load(
    settings: TierSettings, source: str | Path | None = None, *, version: int = 0
) -> "TierModel | EngineTier":
    """Load `source` (default: the tier's base model) and prepare it for the tier. An engine tier
    serves its engine's model only: its tokenizer is loaded here, no weights."""
    if settings.remote:
        if source is not None and str(source) != settings.base_model:
            raise TierError(
                f"engine: this tier decodes on its engine's model ({settings.engine_model}); it cannot "
                f"load {source} (use a local tier, or a LoRA run on an engine that loads adapters)"
            )
        try:
            return engine_tier_load(settings, version=version)
        except EngineError as exc:
            raise TierError(str(exc)) from exc
    source = source or settings.base_model
    try:
        policy = policy_load(model_source(source))
    except PolicyLoadError as exc:
        raise TierError(str(exc)) from exc
    policy.version = version
    return tier_prepare(policy, settings)


# A process keeps one base model resident for the LoRA versions it serves: (what it is, its tier model).
_resident: dict[str, tuple[tuple, TierModel]] = {}


def tier_adapter_serve(settings: TierSettings, adapter: str | Path, *, version: int) -> TierModel:
    """A LoRA policy version prepared for the tier: its base loaded once per process and kept, the
    version's adapter weights swapped into it in place (no reload) whenever another version is
    asked for. int8 cannot carry an adapter (its layers are quantised): load such a tier with
    `tier_load`, which merges the adapter first."""
    if settings.precision == "int8":
        raise TierError("int8 tiers cannot swap LoRA adapters in place; load the version with tier_load")
    base = adapter_base(adapter)
    key = (base, settings.precision, settings.device, settings.speculation, settings.draft_model)
    held = _resident.get("base")
    if held is None or held[0] != key:
        _resident.clear()
        try:
            policy = policy_load(model_source(base))
        except PolicyLoadError as exc:
            raise TierError(str(exc)) from exc
        held = (key, tier_prepare(policy, settings))
        _resident["base"] = held
    tier = held[1]
    tier.model = adapter_activate(tier.model, adapter)
    tier.version, tier.settings = version, settings
    return tier


def is_quantised(model: torch.nn.Module) -> bool:
    """Whether every Linear layer of the model is a dynamically quantised one."""
    from torch.ao.nn.quantized.dynamic import Linear as QuantisedLinear

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear | QuantisedLinear)]
    return bool(linears) and all(isinstance(m, QuantisedLinear) for m in linears)


def model_bytes(model: torch.nn.Module) -> int:
    """The bytes the weights take (quantised weights counted packed)."""
    total = 0
    for value in model.state_dict().values():
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
        elif isinstance(value, tuple):  # packed quantised params: (weight, bias)
            total += sum(t.numel() * t.element_size() for t in value if isinstance(t, torch.Tensor))
    return total


# --- statistics ---------------------------------------------------------------------------------


@dataclass
class GenerationStats:
    """What a generation did: forward passes, positions processed, drafts proposed and accepted,
    and per-request timings (seconds from the start of the request's batch)."""

    target_forwards: int = 0
    draft_forwards: int = 0
    prefill_positions: int = 0  # valid prompt positions the tier's model processed
    target_positions: int = 0  # valid positions the tier's model processed in all
    proposed: int = 0
    accepted: int = 0
    steps: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0
    first_token_seconds: list[float] = field(default_factory=list)
    latency_seconds: list[float] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.proposed if self.proposed else None

    def summary(self) -> dict:
        def pct(values: list[float], q: float) -> float | None:
            if not values:
                return None
            ordered = sorted(values)
            return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

        return {
            "requests": len(self.latency_seconds),
            "generated_tokens": self.generated_tokens,
            "seconds": round(self.seconds, 4),
            "tokens_per_second": round(self.generated_tokens / self.seconds, 2) if self.seconds else None,
            "ttft_ms_p50": _ms(
                statistics.median(self.first_token_seconds) if self.first_token_seconds else None
            ),
            "latency_ms_p50": _ms(pct(self.latency_seconds, 0.5)),
            "latency_ms_p95": _ms(pct(self.latency_seconds, 0.95)),
            "target_forwards": self.target_forwards,
            "draft_forwards": self.draft_forwards,
            "prefill_positions": self.prefill_positions,
            "proposed": self.proposed,
            "accepted": self.accepted,
            "acceptance_rate": None if self.acceptance_rate is None else round(self.acceptance_rate, 4),
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


# --- the ragged KV cache -------------------------------------------------------------------------


class RaggedDecoder:
    """One model's KV cache over a batch: a 2-D mask says which slots of each row are real, and
    each row's next position counts only its real slots, so a row can drop slots (rejected drafts)
    while the batch stays one rectangular cache."""

    def __init__(self, model: PreTrainedModel, pad_id: int, stats: GenerationStats, *, target: bool) -> None:
        self.model = model
        self.pad_id = pad_id
        self.stats = stats
        self.target = target
        self.cache = DynamicCache()
        self.mask: torch.Tensor | None = None  # rows × slots, long
        self.next_pos: torch.Tensor | None = None  # rows, long
        self.device = next(model.parameters()).device

    @property
    def width(self) -> int:
        return 0 if self.mask is None else self.mask.size(1)

    def feed(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Run `ids` (rows × w; `valid` marks the real ones) through the model; float logits."""
        ids, valid = ids.to(self.device), valid.to(self.device)
        if self.mask is None or self.next_pos is None:  # the first feed: the batch's rows
            self.mask = valid.new_zeros((ids.size(0), 0), dtype=torch.long)
            self.next_pos = valid.new_zeros(ids.size(0), dtype=torch.long)
        positions = (self.next_pos[:, None] + valid.long().cumsum(-1) - 1).clamp(min=0)
        mask = torch.cat([self.mask, valid.long()], dim=-1)
        logits = self.model(
            input_ids=ids.masked_fill(~valid, self.pad_id),
            attention_mask=mask,
            position_ids=positions,
            cache=self.cache,
            use_cache=True,
        ).logits.float()
        self.mask = mask
        self.next_pos = self.next_pos + valid.long().sum(-1)
        count = int(valid.sum())
        if self.target:
            self.stats.target_forwards += 1
            self.stats.target_positions += count
        else:
            self.stats.draft_forwards += 1
        return logits

    def select_rows(self, indices: torch.Tensor) -> None:
        """Rows become `indices` of the current rows (a row may be copied: shared prefixes)."""
        indices = indices.to(self.device)
        mask, next_pos = self._slots()
        self.cache.batch_select_indices(indices)
        self.mask, self.next_pos = mask[indices], next_pos[indices]

    def drop(self, row: int, columns: list[int]) -> None:
        """Mask out real slots of a row (its rejected draft tokens)."""
        if not columns:
            return
        mask, next_pos = self._slots()
        mask[row, columns] = 0
        next_pos[row] -= len(columns)

    def _slots(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The mask and each row's next position, which the first feed makes."""
        if self.mask is None or self.next_pos is None:
            raise RuntimeError("the decoder has no rows before its first feed")
        return self.mask, self.next_pos


# --- drafting ------------------------------------------------------------------------------------


def lookup_draft(sequence: list[int], count: int, max_ngram: int = MAX_NGRAM) -> list[int]:
    """Prompt lookup: what followed the latest earlier occurrence of the longest matching tail.

    >>> lookup_draft([5, 6, 7, 8, 1, 5, 6], 2)
    [7, 8]
    >>> lookup_draft([1, 2, 3], 2)
    []
    """
    if count < 1:
        return []
    length = len(sequence)
    for n in range(min(max_ngram, length - 1), 0, -1):
        tail = sequence[-n:]
        for start in range(length - n - 1, -1, -1):
            if sequence[start : start + n] == tail:
                return sequence[start + n : start + n + count]
    return []


def _distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a row samples from: temperature, then top-k / top-p."""
    return filter_logits(logits / params.temperature, params.top_k, params.top_p).softmax(-1)


def _log_distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probs over the vocabulary as generation records them (temperature-scaled; greedy at 1)."""
    scaled = logits if params.temperature == 0 else logits / params.temperature
    return scaled.log_softmax(-1)


def _logprob(logits: torch.Tensor, token: int, params: SamplingParams) -> float:
    return float(_log_distribution(logits, params)[token])


# --- the decoder ---------------------------------------------------------------------------------

# Told as each row's completion ends: (row in the call's prompts, its completion). A caller can
# score a completion while the longer ones are still decoding.
FinishListener = Callable[[int, Completion], None]


def policy_tier(policy: Policy, params: SamplingParams) -> TierModel:
    """A policy decoded as it stands, with no tier: its model at its own device and precision (a
    learner's model mid-training), no speculation, every prompt in one batch, `params` as given."""
    settings = TierSettings(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        stop=tuple(params.stop),
        max_new_tokens=params.max_new_tokens,
        batch_size=1 << 30,
        chat=policy.chat,
    )
    return TierModel(
        model=policy.model, tokenizer=policy.tokenizer, settings=settings, version=policy.version
    )


@torch.no_grad()
def decode(
    tier: "TierModel | EngineTier",
    prompts: Sequence[PromptInput],
    settings: TierSettings | None = None,
    *,
    generator: torch.Generator | None = None,
    stats: GenerationStats | None = None,
    listener: TokenListener | None = None,
    on_finished: FinishListener | None = None,
) -> list[Completion]:
    """The one decoder: one completion per prompt (repeat a prompt for a group), in `batch_size`
    chunks, each chunk prefilled, then proposed, verified and accepted step by step until every
    row has finished. Rollouts, evaluation, tiers, judges, serving and the playground all decode
    here; an engine tier's completions come from its engine (inference/engines.py).

    `listener` hears every token as it is emitted; `on_finished(row, completion)` hears each row
    exactly once, as it ends (speculative batches: when the batch ends)."""
    settings = settings or tier.settings
    stats = stats if stats is not None else GenerationStats()
    started = time.perf_counter()
    if isinstance(tier, EngineTier):
        texts = [prompt for prompt in prompts if isinstance(prompt, str)]
        if len(texts) < len(prompts):
            raise TierError("an engine tier decodes text prompts; token ids decode on a local tier")
        completions = _engine_generate(tier, texts, settings, generator, stats, started)
        for row, completion in enumerate(completions):
            if on_finished is not None:
                on_finished(row, completion)
        return completions
    completions = []
    size = max(1, int(settings.batch_size))
    for start in range(0, len(prompts), size):
        chunk = prompts[start : start + size]
        completions += _decode_batch(
            tier, chunk, settings, generator, stats, _shifted(listener, start), _shifted(on_finished, start)
        )
    stats.seconds += time.perf_counter() - started
    return completions


def _shifted(callback: Callable | None, start: int) -> Callable | None:
    """A chunk's callback, its rows numbered as in the whole call."""
    if callback is None:
        return None
    return lambda row, *told: callback(start + row, *told)


def _decode_batch(
    tier: TierModel,
    prompts: Sequence[PromptInput],
    settings: TierSettings,
    generator: torch.Generator | None,
    stats: GenerationStats,
    listener: TokenListener | None,
    on_finished: FinishListener | None,
) -> list[Completion]:
    """Decode one batch. With speculation, each step proposes draft tokens per row and the tier's
    model verifies them in one pass (a ragged cache, per-row Python). Without, nothing is proposed
    and a step is one forward of every running row's last token, kept in tensors (`_Plain`)."""
    if not settings.speculative:
        return _plain_decode(tier, prompts, settings, generator, stats, listener, on_finished)
    batch = _prefill(tier, prompts, settings, generator, stats, listener)
    while not all(batch.finished):
        stats.steps += 1
        proposal = _propose(batch)
        verified = _verify(batch, proposal)
        _accept(batch, proposal, verified)
    completions = _finish(batch)
    for row, completion in enumerate(completions):
        if on_finished is not None:
            on_finished(row, completion)
    return completions


def _engine_generate(
    tier: EngineTier,
    prompts: list[str],
    settings: TierSettings,
    generator: torch.Generator | None,
    stats: GenerationStats,
    started: float,
) -> list[Completion]:
    """The engine's completions; a seed per request drawn from `generator` keeps a seeded
    engine's sampling reproducible. Latencies are the whole call's (requests run concurrently)."""
    seeds = None
    if generator is not None and settings.temperature > 0:
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=generator).tolist()
    completions = engine_generate(tier, prompts, settings, seeds=seeds)
    elapsed = time.perf_counter() - started
    stats.seconds += elapsed
    stats.generated_tokens += sum(len(completion.token_ids) for completion in completions)
    stats.latency_seconds += [elapsed] * len(completions)
    stats.first_token_seconds += [elapsed] * len(completions)
    return completions


# --- the accept step of a plain decode (also agent sessions': inference/sessions.py) ----------------


@dataclass
class Record:
    """What a plain decode has sampled, per row: tokens and their log-probs (rows × budget), how
    many so far, and which rows have ended."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    lengths: torch.Tensor
    finished: torch.Tensor

    @classmethod
    def empty(cls, rows: int, budget: int, pad_id: int, device: torch.device | str) -> "Record":
        return cls(
            tokens=torch.full((rows, budget), pad_id, dtype=torch.long, device=device),
            logprobs=torch.zeros((rows, budget), device=device),
            lengths=torch.zeros(rows, dtype=torch.long, device=device),
            finished=torch.zeros(rows, dtype=torch.bool, device=device),
        )


def accept_sampled(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    *,
    record: Record,
    rows: torch.Tensor,
    step: int,
    stops: torch.Tensor,
    tokenizer: PreTrainedTokenizerBase,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample the next token of each of `rows` (indices into the record; `logits` has one row
    each), record it with its log-prob where the row still runs, and end the rows that sampled a
    stop token or completed a stop sequence. (tokens, log-probs, running, stopped), over `rows`."""
    next_tokens, next_logprobs = sample_next(logits, params, generator)
    running = ~record.finished[rows]
    record.tokens[rows, step] = torch.where(running, next_tokens, record.tokens[rows, step])
    record.logprobs[rows, step] = torch.where(running, next_logprobs, record.logprobs[rows, step])
    record.lengths[rows] += running.long()
    stopped = running & torch.isin(next_tokens, stops)
    if params.stop:
        active = torch.zeros_like(record.finished)
        active[rows] = running & ~stopped
        stopped |= stopped_rows(tokenizer, record.tokens, record.lengths, active, params.stop)[rows]
    record.finished[rows] |= stopped
    return next_tokens, next_logprobs, running, stopped


# --- a batch without speculation ------------------------------------------------------------------


@dataclass
class _Plain:
    """A batch decoding one token per step, all in tensors: moving each step to Python costs more
    than a tiny model's forward pass. A plain Llama or Qwen2 runs through the lean path
    (inference/lean_llama.py: the same function, a fraction of the Python per token), on CUDA
    through the model's CUDA-graph runner (`graphs`: the step replayed, not launched kernel by
    kernel); any other model through its own forward with a Hugging Face cache.

    Finished rows leave the batch (their cache rows dropped, or compacted in place under graphs)
    once a quarter of it has finished, so the stragglers' steps cost what the stragglers need,
    not what the whole batch did."""

    tier: TierModel
    params: SamplingParams
    generator: torch.Generator | None
    stats: GenerationStats
    listener: TokenListener | None
    on_finished: FinishListener | None
    started: float
    lean: LeanLlama | None
    cache: DynamicCache  # empty when `lean` decodes
    width: int  # prompt positions (left-padded)
    pad_id: int
    stops: torch.Tensor  # the stop token ids
    prompt_ids: list[list[int]]
    logits: torch.Tensor  # rows still decoding × vocabulary: the next token's
    key_mask: torch.Tensor  # rows still decoding × every key position a step can see
    positions: torch.Tensor  # rows still decoding × 1: the next token's position
    record: Record  # all rows: what each has sampled
    alive: torch.Tensor  # the rows still decoding, as indices into the batch
    ended: torch.Tensor  # all rows: the step a stop token or sequence ended the row at, or -1
    graphs: StepRunner | None = None  # the lean step's CUDA-graph runner (its `lean` is `lean`)
    step: int = 0
    done: dict[int, Completion] = field(default_factory=dict)
    step_seconds: list[float] = field(default_factory=list)  # each step's end, from `started`


def _plain_decode(
    tier: TierModel,
    prompts: Sequence[PromptInput],
    settings: TierSettings,
    generator: torch.Generator | None,
    stats: GenerationStats,
    listener: TokenListener | None,
    on_finished: FinishListener | None,
) -> list[Completion]:
    """Prefill, then per step accept one sampled token per running row and verify (run) it; on
    CUDA with the model's graph runner, which no other decode may use meanwhile (its lock)."""
    runner = _graph_runner(tier, settings)
    if runner is None or not runner.lock.acquire(blocking=False):  # busy: decode without it
        return _plain_run(tier, prompts, settings, generator, stats, listener, on_finished, None)
    try:
        return _plain_run(tier, prompts, settings, generator, stats, listener, on_finished, runner)
    finally:
        runner.lock.release()


def _graph_runner(tier: TierModel, settings: TierSettings) -> StepRunner | None:
    """The model's CUDA-graph runner where it applies: the tier on CUDA with `cuda_graphs` on,
    and a model the lean path computes. Elsewhere (a CPU) decoding is as it was without graphs."""
    if not settings.cuda_graphs or tier.device.type != "cuda":
        return None
    return step_runner(tier.model)


def _plain_run(
    tier: TierModel,
    prompts: Sequence[PromptInput],
    settings: TierSettings,
    generator: torch.Generator | None,
    stats: GenerationStats,
    listener: TokenListener | None,
    on_finished: FinishListener | None,
    runner: StepRunner | None,
) -> list[Completion]:
    """The plain decode loop, its steps through `runner` when there is one."""
    batch = _plain_prefill(tier, prompts, settings, generator, stats, listener, on_finished, runner)
    while True:
        tokens, running = _plain_accept(batch)
        if not bool(running.any()):
            break
        stats.steps += 1
        _plain_verify(batch, tokens, running)
    return _plain_finish(batch)


def _plain_prefill(
    tier: TierModel,
    prompts: Sequence[PromptInput],
    settings: TierSettings,
    generator: torch.Generator | None,
    stats: GenerationStats,
    listener: TokenListener | None,
    on_finished: FinishListener | None,
    runner: StepRunner | None = None,
) -> _Plain:
    """Each distinct prompt through the model once (its cache copied to the rows that repeat it
    when prefixes are shared); the logits of every row's first token. With `runner`, into the
    cache the runner keeps (its captures read that one)."""
    started = time.perf_counter()
    model, tokenizer, params = tier.model, tier.tokenizer, settings.sampling_params()
    device = tier.device
    if settings.prefix_cache:
        unique = list(dict.fromkeys(prompts))
        index = {prompt: row for row, prompt in enumerate(unique)}
        rows = torch.tensor([index[prompt] for prompt in prompts], device=device)
    else:
        unique, rows = list(prompts), torch.arange(len(prompts), device=device)
    encoded = {name: tensor.to(device) for name, tensor in prompts_encode(tokenizer, unique).items()}
    cache = DynamicCache()  # the Hugging Face forward's; the lean path keeps its own
    width = encoded["input_ids"].size(1)
    if runner is not None:
        runner.prepare(model, len(prompts), width + params.max_new_tokens)
        lean: LeanLlama | None = runner.lean
        logits = runner.prefill(encoded["input_ids"], encoded["attention_mask"])
    elif (lean := lean_llama(model)) is not None:
        logits = lean.prefill(encoded["input_ids"], encoded["attention_mask"], width + params.max_new_tokens)
    else:
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
    prefilled = int(encoded["attention_mask"].sum())
    stats.target_forwards += 1
    stats.prefill_positions += prefilled
    stats.target_positions += prefilled
    if len(unique) < len(prompts):
        if runner is not None:
            runner.select(rows)
        elif lean is not None:
            lean.select(rows)
        else:
            cache.batch_select_indices(rows)
    encoded = {name: tensor[rows] for name, tensor in encoded.items()}
    size = len(prompts)
    mask = encoded["attention_mask"]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    key_mask = torch.cat([mask, mask.new_ones(size, params.max_new_tokens)], dim=-1)
    return _Plain(
        tier=tier,
        params=params,
        generator=generator,
        stats=stats,
        listener=listener,
        on_finished=on_finished,
        started=started,
        lean=lean,
        cache=cache,
        width=width,
        pad_id=pad_id,
        stops=torch.tensor(sorted(stop_token_ids(model, tokenizer)), device=device),
        prompt_ids=[ids[m.bool()].tolist() for ids, m in zip(encoded["input_ids"], mask, strict=True)],
        logits=logits[rows],
        key_mask=key_mask.bool() if lean is not None else key_mask,
        positions=(mask.cumsum(-1) - 1).clamp(min=0)[:, -1:],
        record=Record.empty(size, params.max_new_tokens, pad_id, device),
        alive=torch.arange(size, device=device),
        ended=torch.full((size,), -1, dtype=torch.long, device=device),
        graphs=runner,
    )


def _plain_accept(batch: _Plain) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample each running row's next token, record it with its log-prob, and end the rows it
    stops (a stop token or sequence). The tokens and the rows still running, over `batch.alive`."""
    params, alive, step = batch.params, batch.alive, batch.step
    next_tokens, next_logprobs, running, stopped = accept_sampled(
        batch.logits,
        params,
        batch.generator,
        record=batch.record,
        rows=alive,
        step=step,
        stops=batch.stops,
        tokenizer=batch.tier.tokenizer,
    )
    batch.step_seconds.append(time.perf_counter() - batch.started)
    if batch.listener is not None:
        _plain_tell(batch, next_tokens, next_logprobs, running)
    batch.ended[alive] = torch.where(stopped, step, batch.ended[alive])
    if batch.on_finished is not None:  # only then: building a completion costs a sync per row
        for row in alive[stopped].tolist():
            batch.done[row] = _plain_completion(batch, row)
            batch.on_finished(row, batch.done[row])
    return next_tokens, running & ~stopped & (step + 1 < params.max_new_tokens)


def _plain_tell(batch: _Plain, tokens: torch.Tensor, logprobs: torch.Tensor, running: torch.Tensor) -> None:
    """Hand the listener each running row's token, its log-prob and the vocabulary's log-probs."""
    listener = batch.listener
    if listener is None:
        return
    distributions = _log_distribution(batch.logits, batch.params)
    for position, row in enumerate(batch.alive.tolist()):
        if running[position]:
            listener(row, int(tokens[position]), float(logprobs[position]), distributions[position])


def _plain_verify(batch: _Plain, tokens: torch.Tensor, running: torch.Tensor) -> None:
    """Run each running row's new token (`tokens`, over `batch.alive`) through the model: the
    logits of the token after it. The finished rows leave first when enough have."""
    if int(running.sum()) <= len(batch.alive) * 3 // 4:
        keep = running.nonzero().flatten()
        batch.alive, batch.positions, batch.key_mask = (
            batch.alive[keep],
            batch.positions[keep],
            batch.key_mask[keep],
        )
        tokens, running = tokens[keep], running[keep]
        if batch.graphs is not None:
            batch.graphs.select(keep)
        elif batch.lean is not None:
            batch.lean.select(keep)
        else:
            batch.cache.batch_select_indices(keep)
    batch.positions = batch.positions + 1
    next_input = tokens.masked_fill(~running, batch.pad_id)[:, None]
    batch.stats.target_forwards += 1
    batch.stats.target_positions += int(running.sum())
    if batch.graphs is not None:
        batch.logits = batch.graphs.step(next_input, batch.positions, batch.key_mask)
    elif batch.lean is not None:
        batch.logits = batch.lean.forward(next_input, batch.positions, batch.key_mask)
    else:
        batch.logits = (
            batch.tier.model(
                input_ids=next_input,
                attention_mask=batch.key_mask[:, : batch.width + batch.step + 1],
                position_ids=batch.positions,
                cache=batch.cache,
                use_cache=True,
            )
            .logits[:, -1]
            .float()
        )
    batch.step += 1


def _plain_finish(batch: _Plain) -> list[Completion]:
    """Every row's completion; the rows the token budget ended are reported now. Tokens and
    per-request timings are counted in the stats."""
    size = batch.record.tokens.size(0)
    completions = [
        batch.done[row] if row in batch.done else _plain_completion(batch, row) for row in range(size)
    ]
    for row in range(size):
        if row not in batch.done and batch.on_finished is not None:
            batch.on_finished(row, completions[row])
    stats = batch.stats
    stats.generated_tokens += int(batch.record.lengths.sum())
    stats.first_token_seconds += [batch.step_seconds[0]] * size
    stats.latency_seconds += [
        batch.step_seconds[step] if step >= 0 else batch.step_seconds[-1] for step in batch.ended.tolist()
    ]
    return completions


def _plain_completion(batch: _Plain, row: int) -> Completion:
    count = int(batch.record.lengths[row])
    return completion_build(
        batch.tier.tokenizer,
        batch.record.tokens[row, :count].tolist(),
        batch.record.logprobs[row, :count].tolist(),
        batch.params,
        batch.prompt_ids[row],
        frozenset(batch.stops.tolist()),
    )


# --- a speculative batch ------------------------------------------------------------------------


@dataclass
class _Batch:
    """A batch while it decodes: both models' caches and, per row, what it has emitted so far and
    what each model has yet to see (the last accepted token, for the draft sometimes more)."""

    tokenizer: PreTrainedTokenizerBase
    params: SamplingParams
    generator: torch.Generator | None
    stats: GenerationStats
    mode: str  # "none", "prompt_lookup" or "draft_model"
    k: int  # tokens proposed per step
    target: RaggedDecoder
    draft: RaggedDecoder | None
    prompt_ids: list[list[int]]
    started: float
    stop_ids: frozenset[int]  # generation_config's EOS ids, the tokenizer's, the template's end of turn
    listener: TokenListener | None = None
    tokens: list[list[int]] = field(init=False)
    logprobs: list[list[float]] = field(init=False)
    finished: list[bool] = field(init=False)
    first_at: list[float | None] = field(init=False)  # seconds from `started`
    done_at: list[float | None] = field(init=False)
    pending_target: list[list[int]] = field(init=False)
    pending_draft: list[list[int]] = field(init=False)
    window: int = field(init=False)  # tokens decoded to look for a stop sequence: enough for any

    def __post_init__(self) -> None:
        size = len(self.prompt_ids)
        self.tokens, self.logprobs = [[] for _ in range(size)], [[] for _ in range(size)]
        self.finished = [False] * size
        self.first_at, self.done_at = [None] * size, [None] * size
        self.pending_target, self.pending_draft = [[] for _ in range(size)], [[] for _ in range(size)]
        self.window = 4 * max((len(stop) for stop in self.params.stop), default=0) + 4

    @property
    def size(self) -> int:
        return len(self.prompt_ids)

    @property
    def pad_id(self) -> int:
        return self.target.pad_id

    def emit(self, row: int, token: int, logprob: float, distribution: torch.Tensor | None = None) -> bool:
        """Append a token; True when the row is finished (EOS, a stop sequence, the budget).
        `distribution` (log-probs over the vocabulary) is passed on to the listener, if any."""
        self.tokens[row].append(token)
        self.logprobs[row].append(logprob)
        if self.listener is not None:
            assert distribution is not None, "a listener's callers pass each token's distribution"
            self.listener(row, token, logprob, distribution)
        if self.first_at[row] is None:
            self.first_at[row] = time.perf_counter() - self.started
        if self._stops(self.tokens[row]):
            self.finished[row] = True
            self.done_at[row] = time.perf_counter() - self.started
        return self.finished[row]

    def _stops(self, tokens: list[int]) -> bool:
        params = self.params
        return (
            tokens[-1] in self.stop_ids
            or len(tokens) >= params.max_new_tokens
            or (
                bool(params.stop)
                and stop_position(decoded_text(self.tokenizer, tokens[-self.window :]), params.stop)
                is not None
            )
        )


@dataclass
class _Proposal:
    """One step's draft tokens per row, the draft distributions they were sampled from (None when
    greedy or looked up) and the draft cache columns that hold the ones the draft was fed back."""

    active: list[bool]
    tokens: list[list[int]]
    dists: list[list[torch.Tensor | None]]
    draft_columns: list[list[int]]


@dataclass
class _Verified:
    """The tier's model over each row's pending token and proposals, from cache column `column`."""

    column: int
    logits: torch.Tensor
    logprobs: torch.Tensor
    greedy: list[list[int]] | None


def _prefill(
    tier: TierModel,
    prompts: Sequence[PromptInput],
    settings: TierSettings,
    generator: torch.Generator | None,
    stats: GenerationStats,
    listener: TokenListener | None = None,
) -> _Batch:
    """Each distinct prompt through both models once (copied to the rows that repeat it when
    prefixes are shared), and each row's first token from the prefill's logits."""
    started = time.perf_counter()
    tokenizer = tier.tokenizer
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    mode = settings.speculation if settings.speculative else "none"
    draft_model = tier.draft if mode == "draft_model" else None
    if mode == "draft_model" and draft_model is None:
        raise TierError("speculation draft_model needs the draft model loaded (tier_prepare loads it)")
    if settings.prefix_cache:
        unique = list(dict.fromkeys(prompts))
        row_of = torch.tensor([unique.index(prompt) for prompt in prompts])
    else:
        unique, row_of = list(prompts), torch.arange(len(prompts))
    encoded = prompts_encode(tokenizer, unique)
    prompt_valid = encoded["attention_mask"].bool()
    target = RaggedDecoder(tier.model, pad_id, stats, target=True)
    logits = target.feed(encoded["input_ids"], prompt_valid)[:, -1]
    stats.prefill_positions += int(prompt_valid.sum())
    draft = None
    if draft_model is not None:
        draft = RaggedDecoder(draft_model, pad_id, stats, target=False)
        draft.feed(encoded["input_ids"], prompt_valid)
    if len(unique) != len(prompts):
        target.select_rows(row_of)
        if draft is not None:
            draft.select_rows(row_of)
    logits = logits[row_of.to(logits.device)]
    batch = _Batch(
        tokenizer=tokenizer,
        params=settings.sampling_params(),
        generator=generator,
        stats=stats,
        mode=mode,
        k=int(settings.speculative_tokens) if mode != "none" else 0,
        target=target,
        draft=draft,
        prompt_ids=[encoded["input_ids"][i][prompt_valid[i]].tolist() for i in row_of.tolist()],
        started=started,
        stop_ids=stop_token_ids(tier.model, tokenizer),
        listener=listener,
    )
    first = _choose(logits, batch.params, generator)
    for row in range(batch.size):
        distribution = _log_distribution(logits[row], batch.params) if listener is not None else None
        batch.emit(row, first[row], _logprob(logits[row], first[row], batch.params), distribution)
    batch.pending_target = [[tokens[-1]] for tokens in batch.tokens]
    batch.pending_draft = [[tokens[-1]] for tokens in batch.tokens]
    return batch


def _propose(batch: _Batch) -> _Proposal:
    """Up to k draft tokens for each unfinished row, within what is left of its token budget."""
    active = [not done for done in batch.finished]
    size = batch.size
    proposal = _Proposal(
        active=active,
        tokens=[[] for _ in range(size)],
        dists=[[] for _ in range(size)],
        draft_columns=[[] for _ in range(size)],
    )
    # Room for proposals: the budget less the token the tier's model adds after them.
    budgets = [
        max(0, batch.params.max_new_tokens - len(batch.tokens[row]) - 1) if active[row] else 0
        for row in range(size)
    ]
    if batch.mode == "prompt_lookup":
        _propose_by_lookup(batch, proposal, budgets)
    elif batch.mode == "draft_model" and max(budgets) > 0:
        _propose_by_draft(batch, proposal, budgets)
    return proposal


def _propose_by_lookup(batch: _Batch, proposal: _Proposal, budgets: list[int]) -> None:
    for row in range(batch.size):
        if proposal.active[row]:
            proposal.tokens[row] = lookup_draft(
                batch.prompt_ids[row] + batch.tokens[row], min(batch.k, budgets[row])
            )
            proposal.dists[row] = [None] * len(proposal.tokens[row])


def _propose_by_draft(batch: _Batch, proposal: _Proposal, budgets: list[int]) -> None:
    """The draft model catches up on the tokens it has not seen, then drafts one token a round,
    feeding each back while a row still has budget for another."""
    draft, params, generator = batch.draft, batch.params, batch.generator
    assert draft is not None, "mode draft_model: _prefill made the draft's decoder"
    rounds = min(batch.k, max(budgets))
    drafting = [budget > 0 for budget in budgets]  # an unfinished row with room for a proposal
    ids, valid = _padded(
        [batch.pending_draft[row] if drafting[row] else [] for row in range(batch.size)], batch.pad_id
    )
    out = draft.feed(ids, valid)
    last = (valid.long().sum(-1) - 1).clamp(min=0).to(out.device)
    logits = out[torch.arange(batch.size, device=out.device), last]
    for round_index in range(rounds):
        chosen, dists = _draft_choose(logits, params, generator)
        for row in range(batch.size):
            if drafting[row] and round_index < budgets[row]:
                proposal.tokens[row].append(chosen[row])
                proposal.dists[row].append(None if dists is None else dists[row])
        if round_index == rounds - 1:
            break
        feeding = torch.tensor(
            [drafting[row] and round_index + 1 < budgets[row] for row in range(batch.size)]
        )
        if not feeding.any():
            break
        column = draft.width
        logits = draft.feed(torch.tensor(chosen)[:, None], feeding[:, None])[:, 0]
        for row in range(batch.size):
            if feeding[row]:
                proposal.draft_columns[row].append(column)


def _verify(batch: _Batch, proposal: _Proposal) -> _Verified:
    """Each row's pending token and proposals through the tier's model, in one forward pass."""
    sequences = [
        batch.pending_target[row] + proposal.tokens[row] if proposal.active[row] else []
        for row in range(batch.size)
    ]
    ids, valid = _padded(sequences, batch.pad_id)
    column = batch.target.width
    logits = batch.target.feed(ids, valid)
    temperature = batch.params.temperature
    scaled = logits if temperature == 0 else logits / temperature
    greedy = logits.argmax(-1).tolist() if temperature == 0 else None
    return _Verified(column=column, logits=logits, logprobs=scaled.log_softmax(-1), greedy=greedy)


def _accept(batch: _Batch, proposal: _Proposal, verified: _Verified) -> None:
    """Per row: keep the proposals the tier's model accepts and the token it adds after them,
    drop the rejected ones from both caches, and note what each model has yet to see."""
    stats = batch.stats
    for row in range(batch.size):
        if not proposal.active[row]:
            continue
        proposed = proposal.tokens[row]
        stats.proposed += len(proposed)
        if verified.greedy is not None:
            accepted, new_token = _accepted_greedy(proposed, verified.greedy[row])
        else:
            accepted, new_token = _accepted_sampled(
                verified.logits[row], proposed, proposal.dists[row], batch.params, batch.generator
            )
        stats.accepted += accepted
        batch.target.drop(row, [verified.column + 1 + j for j in range(accepted, len(proposed))])
        if batch.draft is not None:
            batch.draft.drop(row, proposal.draft_columns[row][accepted:])
        for index, token in enumerate(proposed[:accepted] + [new_token]):
            distribution = verified.logprobs[row, index] if batch.listener is not None else None
            if batch.emit(row, token, float(verified.logprobs[row, index, token]), distribution):
                break
        batch.pending_target[row] = [new_token]
        if batch.draft is not None and proposed:
            # The draft has seen its proposals up to the last one it fed back; when every
            # proposal was accepted, the last proposal is still new to it.
            seen = len(proposal.draft_columns[row])
            batch.pending_draft[row] = proposed[seen:accepted] + [new_token]
        elif batch.draft is not None:  # the draft sat this step out: it has yet to see the new token too
            batch.pending_draft[row] = batch.pending_draft[row] + [new_token]


def _finish(batch: _Batch) -> list[Completion]:
    """The batch's completions, its tokens and per-request timings counted in its stats."""
    stats = batch.stats
    stats.generated_tokens += sum(len(row_tokens) for row_tokens in batch.tokens)
    for row in range(batch.size):
        stats.first_token_seconds.append(batch.first_at[row] or 0.0)
        stats.latency_seconds.append(batch.done_at[row] or (time.perf_counter() - batch.started))
    return [
        completion_build(
            batch.tokenizer,
            batch.tokens[row],
            batch.logprobs[row],
            batch.params,
            batch.prompt_ids[row],
            batch.stop_ids,
        )
        for row in range(batch.size)
    ]


def _padded(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids (rows × the longest sequence) and the mask of their real positions."""
    width = max(len(sequence) for sequence in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    valid = torch.zeros((len(sequences), width), dtype=torch.bool)
    for row, sequence in enumerate(sequences):
        if sequence:
            ids[row, : len(sequence)] = torch.tensor(sequence)
            valid[row, : len(sequence)] = True
    return ids, valid


def _accepted_greedy(proposed: list[int], greedy: list[int]) -> tuple[int, int]:
    """Greedy: proposals are accepted while each is the model's argmax; the argmax after the last
    accepted one is added, so the output is exactly greedy decoding's.

    >>> _accepted_greedy([4, 5, 6], [4, 5, 9, 7])
    (2, 9)
    """
    accepted = 0
    while accepted < len(proposed) and proposed[accepted] == greedy[accepted]:
        accepted += 1
    return accepted, greedy[accepted]


def _choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> list[int]:
    if params.temperature == 0:
        return logits.argmax(-1).tolist()
    probabilities = _distribution(logits, params)
    return torch.multinomial(probabilities.cpu(), 1, generator=generator).squeeze(-1).tolist()


def _draft_choose(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[list[int], torch.Tensor | None]:
    """The draft's token per row and, when sampling, the distribution it was drawn from."""
    if params.temperature == 0:
        return logits.argmax(-1).tolist(), None
    probabilities = _distribution(logits, params).cpu()
    return torch.multinomial(probabilities, 1, generator=generator).squeeze(-1).tolist(), probabilities


def _accepted_sampled(
    logits: torch.Tensor,
    proposed: list[int],
    draft_dists: list[torch.Tensor | None],
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Sampling: how many proposals the tier's model accepts, and the token it adds after them.

    Proposal x drawn from q is accepted with probability min(1, p(x) / q(x)) (q is a point mass for prompt
    lookup); a rejection samples from max(0, p - q) renormalised, so tokens follow p exactly.
    """
    for index, token in enumerate(proposed):
        p = _distribution(logits[index], params).cpu()
        q = draft_dists[index]
        q_token = 1.0 if q is None else float(q[token])
        u = float(torch.rand((), generator=generator))
        if q_token > 0 and u < min(1.0, float(p[token]) / q_token):
            continue
        if q is None:
            residual = p.clone()
            residual[token] = 0.0
        else:
            residual = (p - q).clamp(min=0)
        if float(residual.sum()) <= 0:
            residual = p
        return index, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    p = _distribution(logits[len(proposed)], params).cpu()
    return len(proposed), int(torch.multinomial(p, 1, generator=generator))

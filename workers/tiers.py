"""Tiers at work: generate the way a tier says, wherever a tier generates (rollouts, evaluation, judges).

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

The decoder keeps one KV cache per model over a batch whose rows advance by different amounts:
each cache slot is masked in or out per row and position ids count only a row's valid slots, so
rejected draft tokens are simply masked out. Every emitted token carries its log-prob under the
tier's model, as `workers.generation.generate` records it.
"""

import copy
import statistics
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from workers.generation import Completion, SamplingParams, completion_build, filter_logits, stop_position
from workers.policy import Policy, PolicyLoadError, policy_load

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MAX_NGRAM = 3  # prompt lookup tries the last 3, 2, then 1 tokens


class TierError(ValueError):
    """The tier cannot run here (no such device, a precision the device lacks, a draft model whose
    tokenizer differs): the message says which setting and why."""


@dataclass(frozen=True)
class TierSettings:
    """A tier's settings as generation uses them (a Tier row, a run's tier_config, or by hand)."""

    base_model: str = ""
    device: str = "auto"
    precision: str = "fp32"
    speculation: str = "none"
    draft_model: str = ""
    speculative_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    max_new_tokens: int = 256
    batch_size: int = 8
    prefix_cache: bool = True  # share a prompt's prefill among the rows that repeat it
    name: str = ""

    @classmethod
    def from_config(cls, config: Mapping | object) -> "TierSettings":
        """From a tier_config dict or a Tier row; unknown keys are ignored, missing ones default."""
        names = {f.name for f in fields(cls)}
        if isinstance(config, Mapping):
            values = {key: value for key, value in config.items() if key in names}
        else:
            values = {name: getattr(config, name) for name in names if hasattr(config, name)}
        if "stop" in values:
            values["stop"] = tuple(values["stop"] or ())
        return cls(**values)

    def with_(self, **changes) -> "TierSettings":
        from dataclasses import replace

        return replace(self, **changes)

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop=tuple(self.stop),
        )

    @property
    def speculative(self) -> bool:
        return self.speculation != "none" and self.speculative_tokens > 0


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
        return Policy(model=self.model, tokenizer=self.tokenizer, version=self.version)

    def prompt_text(self, prompt: str) -> str:
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
    """The model at the tier's precision on the tier's device (int8: Linear layers quantised)."""
    device = resolve_device(settings)
    if settings.precision == "int8":
        model = model.to(device="cpu", dtype=torch.float32)
        with warnings.catch_warnings():  # torch.ao's eager quantisation warns that torchao succeeds it
            warnings.simplefilter("ignore", (DeprecationWarning, UserWarning))
            model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    else:
        if settings.precision not in DTYPES:
            raise TierError(f"precision must be one of fp32, bf16, fp16, int8; got {settings.precision!r}")
        model = model.to(device=device, dtype=DTYPES[settings.precision])
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
                draft = policy_load(_source(settings.draft_model))
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


def _source(reference: str | Path) -> str | Path:
    if isinstance(reference, str) and reference.startswith(("/", "./", "../", "~")):
        return Path(reference).expanduser()
    return reference


def tier_load(settings: TierSettings, source: str | Path | None = None, *, version: int = 0) -> TierModel:
    """Load `source` (default: the tier's base model) and prepare it for the tier."""
    source = source or settings.base_model
    try:
        policy = policy_load(_source(source))
    except PolicyLoadError as exc:
        raise TierError(str(exc)) from exc
    policy.version = version
    return tier_prepare(policy, settings)


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
        if self.mask is None:
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
        self.cache.batch_select_indices(indices)
        self.mask = self.mask[indices]
        self.next_pos = self.next_pos[indices]

    def drop(self, row: int, columns: list[int]) -> None:
        """Mask out real slots of a row (its rejected draft tokens)."""
        if not columns:
            return
        self.mask[row, columns] = 0
        self.next_pos[row] -= len(columns)


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


def _logprob(logits: torch.Tensor, token: int, params: SamplingParams) -> float:
    scaled = logits if params.temperature == 0 else logits / params.temperature
    return float(scaled.log_softmax(-1)[token])


# --- generation ----------------------------------------------------------------------------------


@torch.no_grad()
def tier_generate(
    tier: TierModel,
    prompts: list[str],
    settings: TierSettings | None = None,
    *,
    generator: torch.Generator | None = None,
    stats: GenerationStats | None = None,
) -> list[Completion]:
    """One completion per prompt (repeat a prompt for a group), in `batch_size` chunks."""
    settings = settings or tier.settings
    stats = stats if stats is not None else GenerationStats()
    started = time.perf_counter()
    completions: list[Completion] = []
    size = max(1, int(settings.batch_size))
    for start in range(0, len(prompts), size):
        completions += _generate_batch(tier, prompts[start : start + size], settings, generator, stats)
    stats.seconds += time.perf_counter() - started
    return completions


def _generate_batch(
    tier: TierModel,
    prompts: list[str],
    settings: TierSettings,
    generator: torch.Generator | None,
    stats: GenerationStats,
) -> list[Completion]:
    tokenizer = tier.tokenizer
    params = settings.sampling_params()
    started = time.perf_counter()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos_id = tokenizer.eos_token_id
    mode = settings.speculation if settings.speculative else "none"
    if mode == "draft_model" and tier.draft is None:
        raise TierError("speculation draft_model needs the draft model loaded (tier_prepare loads it)")
    k = int(settings.speculative_tokens) if mode != "none" else 0

    # Prefill: each distinct prompt once when prefixes are shared, then copied to its rows.
    if settings.prefix_cache:
        unique = list(dict.fromkeys(prompts))
        row_of = torch.tensor([unique.index(prompt) for prompt in prompts])
    else:
        unique, row_of = list(prompts), torch.arange(len(prompts))
    encoded = tokenizer(unique, padding=True, padding_side="left", return_tensors="pt")
    prompt_valid = encoded["attention_mask"].bool()
    target = RaggedDecoder(tier.model, pad_id, stats, target=True)
    logits = target.feed(encoded["input_ids"], prompt_valid)[:, -1]
    stats.prefill_positions += int(prompt_valid.sum())
    draft = None
    if mode == "draft_model":
        draft = RaggedDecoder(tier.draft, pad_id, stats, target=False)
        draft.feed(encoded["input_ids"], prompt_valid)
    if len(unique) != len(prompts):
        target.select_rows(row_of)
        if draft is not None:
            draft.select_rows(row_of)
    logits = logits[row_of.to(logits.device)]
    prompt_ids = [encoded["input_ids"][i][prompt_valid[i]].tolist() for i in row_of.tolist()]

    batch = len(prompts)
    tokens: list[list[int]] = [[] for _ in range(batch)]
    logprobs: list[list[float]] = [[] for _ in range(batch)]
    finished = [False] * batch
    first_at: list[float | None] = [None] * batch
    done_at: list[float | None] = [None] * batch
    window = 4 * max((len(stop) for stop in params.stop), default=0) + 4

    def emit(row: int, token: int, logprob: float) -> bool:
        """Append a token; True when the row is finished (EOS, a stop sequence, the budget)."""
        tokens[row].append(token)
        logprobs[row].append(logprob)
        if first_at[row] is None:
            first_at[row] = time.perf_counter() - started
        stopped = (
            token == eos_id
            or len(tokens[row]) >= params.max_new_tokens
            or (
                bool(params.stop)
                and stop_position(tokenizer.decode(tokens[row][-window:]), params.stop) is not None
            )
        )
        if stopped:
            finished[row] = True
            done_at[row] = time.perf_counter() - started
        return stopped

    # The first token comes from the prefill's logits.
    first = _choose(logits, params, generator)
    for row in range(batch):
        emit(row, first[row], _logprob(logits[row], first[row], params))
    pending_target = [[tokens[row][-1]] for row in range(batch)]
    pending_draft = [[tokens[row][-1]] for row in range(batch)]

    while not all(finished):
        stats.steps += 1
        active = [not done for done in finished]
        budgets = [
            max(0, params.max_new_tokens - len(tokens[row]) - 1) if active[row] else 0 for row in range(batch)
        ]
        proposals: list[list[int]] = [[] for _ in range(batch)]
        draft_dists: list[list[torch.Tensor | None]] = [[] for _ in range(batch)]
        draft_columns: list[list[int]] = [[] for _ in range(batch)]
        if mode == "prompt_lookup":
            for row in range(batch):
                if active[row]:
                    proposals[row] = lookup_draft(prompt_ids[row] + tokens[row], min(k, budgets[row]))
                    draft_dists[row] = [None] * len(proposals[row])
        elif mode == "draft_model" and max(budgets) > 0:
            rounds = min(k, max(budgets))
            drafting = [active[row] and budgets[row] > 0 for row in range(batch)]
            width = max(len(pending_draft[row]) for row in range(batch) if drafting[row])
            ids = torch.full((batch, width), pad_id, dtype=torch.long)
            valid = torch.zeros((batch, width), dtype=torch.bool)
            for row in range(batch):
                if drafting[row]:
                    ids[row, : len(pending_draft[row])] = torch.tensor(pending_draft[row])
                    valid[row, : len(pending_draft[row])] = True
            out = draft.feed(ids, valid)
            last = (valid.long().sum(-1) - 1).clamp(min=0).to(out.device)
            draft_logits = out[torch.arange(batch, device=out.device), last]
            for round_index in range(rounds):
                chosen, dists = _draft_choose(draft_logits, params, generator)
                for row in range(batch):
                    if drafting[row] and round_index < budgets[row]:
                        proposals[row].append(chosen[row])
                        draft_dists[row].append(None if dists is None else dists[row])
                if round_index == rounds - 1:
                    break
                step_valid = torch.tensor(
                    [drafting[row] and round_index + 1 < budgets[row] for row in range(batch)]
                )
                if not step_valid.any():
                    break
                column = draft.width
                draft_logits = draft.feed(torch.tensor(chosen)[:, None], step_valid[:, None])[:, 0]
                for row in range(batch):
                    if step_valid[row]:
                        draft_columns[row].append(column)

        # Verify: the pending token and each row's proposals, in one forward pass of the tier's model.
        width = 1 + max(len(proposals[row]) for row in range(batch))
        ids = torch.full((batch, width), pad_id, dtype=torch.long)
        valid = torch.zeros((batch, width), dtype=torch.bool)
        for row in range(batch):
            if active[row]:
                sequence = pending_target[row] + proposals[row]
                ids[row, : len(sequence)] = torch.tensor(sequence)
                valid[row, : len(sequence)] = True
        column = target.width
        verify = target.feed(ids, valid)
        scaled = verify if params.temperature == 0 else verify / params.temperature
        step_logprobs = scaled.log_softmax(-1)
        greedy = verify.argmax(-1).tolist() if params.temperature == 0 else None
        for row in range(batch):
            if not active[row]:
                continue
            proposed = proposals[row]
            stats.proposed += len(proposed)
            if greedy is not None:
                accepted = 0
                while accepted < len(proposed) and proposed[accepted] == greedy[row][accepted]:
                    accepted += 1
                new_token = greedy[row][accepted]
            else:
                accepted, new_token = _accept(verify[row], proposed, draft_dists[row], params, generator)
            stats.accepted += accepted
            # Drop the rejected proposals from both caches.
            target.drop(row, [column + 1 + j for j in range(accepted, len(proposed))])
            if draft is not None:
                draft.drop(row, draft_columns[row][accepted:])
            emitted = proposed[:accepted] + [new_token]
            for index, token in enumerate(emitted):
                if emit(row, token, float(step_logprobs[row, index, token])):
                    break
            pending_target[row] = [new_token]
            if draft is not None and proposed:
                # The draft has seen its proposals up to the last one it fed back; when every
                # proposal was accepted, the last proposal is still new to it.
                seen = len(draft_columns[row])
                pending_draft[row] = proposed[seen:accepted] + [new_token]
            elif draft is not None:  # the draft sat this step out: it has yet to see the new token too
                pending_draft[row] = pending_draft[row] + [new_token]

    stats.generated_tokens += sum(len(row_tokens) for row_tokens in tokens)
    for row in range(batch):
        stats.first_token_seconds.append(first_at[row] or 0.0)
        stats.latency_seconds.append(done_at[row] or (time.perf_counter() - started))
    return [
        completion_build(tokenizer, tokens[row], logprobs[row], params, prompt_ids[row])
        for row in range(batch)
    ]


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


def _accept(
    logits: torch.Tensor,
    proposed: list[int],
    draft_dists: list[torch.Tensor | None],
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Sampling: how many proposals the tier's model accepts, and the token it adds after them.

    (Greedy decoding accepts a proposal while it is the model's argmax and adds the argmax after
    the last accepted one, so its output is exactly greedy decoding's.) Proposal x
    drawn from q is accepted with probability min(1, p(x) / q(x)) (q is a point mass for prompt
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


# --- judges ----------------------------------------------------------------------------------------


def _message_text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return str(content.get("text") or content.get("content") or "")
    return "\n".join(_message_text(part) for part in content or [])


def judge_prompt(tokenizer: PreTrainedTokenizerBase, messages: list[dict]) -> str:
    """Chat messages as the judge model reads them: its chat template, else role-prefixed lines."""
    plain = [{"role": m.get("role", "user"), "content": _message_text(m.get("content"))} for m in messages]
    if getattr(tokenizer, "chat_template", None):
        try:
            return tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
        except Exception:  # noqa: BLE001  (a template that refuses some role: fall back to plain text)
            pass
    return "".join(f"{m['role']}: {m['content']}\n" for m in plain) + "assistant: "


def tier_judge(tier_config: Mapping | object, *, tier_model: TierModel | None = None):
    """A judge for model graders (rewards.engine.Judge): `judge(tier_ref, messages, params) -> str`.

    `tier_config` is one tier's settings (a tier_config dict or a Tier), which answers every
    `tier_ref`, or a mapping of tier name to settings, which answers the grader's `model` by name.
    Models load on first use and stay loaded; the rule's sampling parameters override the tier's
    (temperature, top_p, max_tokens / max_completions_tokens, seed).
    """
    import threading

    single = not isinstance(tier_config, Mapping) or "base_model" in tier_config
    configs = {"": tier_config} if single else dict(tier_config)
    loaded: dict[str, TierModel] = {"": tier_model} if tier_model is not None else {}
    lock = threading.Lock()

    def judge(tier_ref: str, messages: list[dict], params: dict) -> str:
        key = "" if single else tier_ref
        if key not in configs:
            raise TierError(f"no tier named {tier_ref!r} to judge with; known: {', '.join(sorted(configs))}")
        with lock:  # graders run in threads; one model generates one request at a time
            if key not in loaded:
                loaded[key] = tier_load(TierSettings.from_config(configs[key]))
            model = loaded[key]
            settings = model.settings
            changes: dict = {}
            if "temperature" in params:
                changes["temperature"] = float(params["temperature"])
            if "top_p" in params:
                changes["top_p"] = float(params["top_p"])
            budget = params.get("max_completions_tokens") or params.get("max_tokens")
            if budget:
                changes["max_new_tokens"] = int(budget)
            generator = torch.Generator().manual_seed(int(params["seed"])) if "seed" in params else None
            prompt = judge_prompt(model.tokenizer, messages)
            [completion] = tier_generate(model, [prompt], settings.with_(**changes), generator=generator)
        return completion.text

    return judge

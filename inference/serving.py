"""Serving a tier or a checkpoint: models kept loaded between requests, prompts prepared and checked
against the context, and generation with every token handed to a listener as it is emitted.

A web process keeps the `capacity` models it served last (least recently used goes first); a model
generates one decode at a time (its lock), in the thread of a request that calls `serve_generate`.
Requests that arrive while a model decodes wait, and the next of them to take the lock decodes
every waiting request that decodes the same way (same settings and adapter, no seed) in one batch:
agents playing a run's episodes side by side share its forward passes instead of queueing.
"""

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from inference.adapters import AdapterError, adapter_activate, adapter_remove, adapters_disabled
from inference.chat import chat_render
from inference.decoding import TierError, TierModel, decode, device_class, tier_load
from inference.generation import Completion, decoded_text
from inference.openai_protocol import OpenAIError, ServeRequest, Token
from inference.settings import TierSettings
from inference.tool_chat import chat_render as tool_chat_render

# What changes the loaded model; decoding settings do not.
LOAD_FIELDS = ("base_model", "device", "precision", "speculation", "draft_model", "speculative_tokens")


@dataclass
class Served:
    """A loaded model and the lock that keeps it to one generation at a time; `adapter`: the LoRA
    adapter (a local folder) its model carries now, if any."""

    tier: TierModel
    lock: threading.Lock
    adapter: str | None = None
    waiting: list["_Job"] = field(default_factory=list)  # requests queued for the next decode
    waiting_lock: threading.Lock = field(default_factory=threading.Lock)


class ModelCache:
    """The models a process serves, the least recently used dropped past `capacity`."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self.models: OrderedDict[tuple, Served] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, source: str | Path, settings: TierSettings) -> Served:
        key = (str(source), _written_at(source), *(getattr(settings, name) for name in LOAD_FIELDS))
        with self.lock:  # loads are rare: one at a time keeps two requests from loading one model twice
            if key in self.models:
                self.models.move_to_end(key)
                return self.models[key]
            try:
                tier = tier_load(settings, source)
            except TierError as exc:
                message = f"the model cannot be loaded here: {exc}"
                raise OpenAIError(503, message, "model", "model_unavailable") from exc
            if not isinstance(tier, TierModel):  # the views send an engine tier's requests to its engine
                message = (
                    f"the tier decodes on an external engine ({settings.engine_url}); send requests there"
                )
                raise OpenAIError(400, message, "model", "model_not_served_here")
            served = Served(tier=tier, lock=threading.Lock())
            self.models[key] = served
            while len(self.models) > self.capacity:
                self.models.popitem(last=False)
            return served


def _written_at(source: str | Path) -> int | None:
    """When a local model folder was written: a policy version republished after a resume rolled it
    back is a new folder (renamed into place), so it is loaded again, not served from the cache."""
    path = Path(source)
    return path.stat().st_mtime_ns if path.is_dir() else None


def chat_prompt(tier: TierModel, messages: list[dict[str, str]]) -> str:
    """The conversation as the tier's rollouts render a prompt (inference/chat.py): through the
    tokenizer's chat template, ready for the assistant's turn, when the tier chats and the model
    has a template; otherwise the raw text."""
    return chat_render(tier.tokenizer, messages, chat=tier.settings.chat)


def _chat_text(tier: TierModel, request: ServeRequest) -> str:
    """A chat request's prompt; a conversation with tools (offered, called or answered) renders as
    Flywheel's own agents' turns do (inference/tool_chat.py), so a policy trained on either reads
    the same text."""
    with_tools = request.tools or any(
        message["role"] == "tool" or message.get("tool_calls") for message in request.messages
    )
    if not with_tools:
        return chat_prompt(tier, request.messages)
    return tool_chat_render(tier.tokenizer if tier.settings.chat else None, request.messages, request.tools)


@dataclass
class Prepared:
    """A request ready to generate: the prompt of every row (each prompt n times), the settings,
    and the prompt tokens counted for usage."""

    served: Served
    prompts: list[str | tuple[int, ...]]
    settings: TierSettings
    prompt_tokens: int
    adapter: str | None = None  # a LoRA adapter's local folder to generate with, on the served base


def serve_prepare(
    served: Served, request: ServeRequest, tier_settings: TierSettings, adapter: str | Path | None = None
) -> Prepared:
    """Render and measure the prompts; refuse a request that does not fit the model's context,
    or an adapter on a tier that cannot carry one."""
    tier = served.tier
    if adapter is not None and tier.settings.precision == "int8":
        raise OpenAIError(
            400,
            "an int8 tier cannot carry a LoRA adapter (its layers are quantised)",
            "model",
            "invalid_value",
        )
    texts = [_chat_text(tier, request)] if request.chat else request.prompts
    settings = request.settings(tier_settings)
    vocabulary = len(tier.tokenizer)
    counts = []
    for index, text in enumerate(texts):
        if isinstance(text, tuple):
            if max(text) >= vocabulary:
                raise OpenAIError(
                    400,
                    f"token id {max(text)} is outside the model's vocabulary ({vocabulary})",
                    "prompt" if len(texts) == 1 else f"prompt[{index}]",
                    "invalid_value",
                )
            counts.append(len(text))
        else:
            counts.append(len(tier.tokenizer(text)["input_ids"]))
    longest = max(counts)
    if longest + settings.max_new_tokens > tier.max_context:
        where = "messages" if request.chat else "prompt"
        raise OpenAIError(
            400,
            f"This model's maximum context length is {tier.max_context} tokens. However, you requested "
            f"{longest + settings.max_new_tokens} tokens ({longest} in the {where}, "
            f"{settings.max_new_tokens} in the completion). Reduce the length of the {where} or "
            "of the completion (max_tokens).",
            where,
            "context_length_exceeded",
        )
    rows = [text for text in texts for _ in range(request.n)]
    return Prepared(
        served=served,
        prompts=rows,
        settings=settings,
        prompt_tokens=sum(counts),
        adapter=None if adapter is None else str(adapter),
    )


def _adapter_use(served: Served, adapter: str | None) -> None:
    """Put the requested adapter's weights into the served model (peft's hot swap, in place),
    attaching fresh LoRA layers when the new adapter's shape differs from the one there."""
    if adapter is None or served.adapter == adapter:
        return
    try:
        served.tier.model = adapter_activate(served.tier.model, adapter)
    except AdapterError:  # another rank or other modules: start again from the bare base
        served.tier.model = adapter_activate(adapter_remove(served.tier.model), adapter)
    served.adapter = adapter


TokenSink = Callable[[int, Token], None]  # (row, token): told of each token as it is emitted


@dataclass
class _Job:
    """A request waiting for (or in) a decode: its rows' completions once done, or its error."""

    prepared: Prepared
    request: ServeRequest
    sink: TokenSink
    completions: list[Completion] | None = None
    error: BaseException | None = None
    gone: bool = False  # its client went away: its rows' tokens are dropped

    def batches_with(self, other: "_Job") -> bool:
        """Whether both decode the same way, so one batch serves them (a seeded request decodes
        alone: its generator must see only its own rows)."""
        return (
            self.request.seed is None
            and other.request.seed is None
            and self.prepared.settings == other.prepared.settings
            and self.prepared.adapter == other.prepared.adapter
        )


def serve_generate(prepared: Prepared, request: ServeRequest, sink: TokenSink) -> list[Completion]:
    """Generate every row, telling `sink` of each token (with its top log-probs when asked). The
    request joins the model's waiting ones; whoever takes the model's lock next decodes every
    waiting request that batches with its own."""
    served, job = prepared.served, _Job(prepared, request, sink)
    with served.waiting_lock:
        served.waiting.append(job)
    with served.lock:
        if job.completions is None and job.error is None:
            with served.waiting_lock:
                batch = [other for other in served.waiting if job.batches_with(other) or other is job]
                served.waiting = [other for other in served.waiting if other not in batch]
            _decode_jobs(served, batch)
    if job.error is not None:
        raise job.error
    assert job.completions is not None
    return job.completions


def _decode_jobs(served: Served, jobs: list[_Job]) -> None:
    """One decode over every job's rows; each job gets its own rows' completions and tokens."""
    owners = [(job, row) for job in jobs for row in range(len(job.prepared.prompts))]
    top = max(job.request.top_logprobs for job in jobs)

    def listener(row: int, token: int, logprob: float, distribution: torch.Tensor | None) -> None:
        job, own_row = owners[row]
        if job.gone:
            return
        best: list[tuple[int, float]] = []
        if job.request.top_logprobs and distribution is not None:
            values, ids = torch.topk(distribution.float(), top)
            best = list(zip(ids.tolist(), values.tolist(), strict=True))[: job.request.top_logprobs]
        try:
            job.sink(own_row, Token(id=token, logprob=logprob, top=best))
        except Exception as exc:  # noqa: BLE001 - that request stops (its client went away); the rest go on
            job.gone, job.error = True, exc
            if all(other.gone for other in jobs):
                raise

    first = jobs[0]
    generator = None
    if first.request.seed is not None:
        generator = torch.Generator().manual_seed(first.request.seed % (2**63))
    prompts = [prompt for job in jobs for prompt in job.prepared.prompts]
    started = time.monotonic()
    try:
        _adapter_use(served, first.prepared.adapter)
        plain = first.prepared.adapter is None and served.adapter is not None
        # The base model's own requests skip the adapter its layers hold.
        with adapters_disabled(served.tier.model) if plain else contextlib.nullcontext():
            completions = decode(
                served.tier, prompts, first.prepared.settings, generator=generator, listener=listener
            )
    except Exception as exc:  # noqa: BLE001 - every request of the batch answers with the error
        for job in jobs:
            job.error = job.error or exc
        return
    # Each row's share of the time the decode held the device: what an episode's turn is billed.
    share, where = (time.monotonic() - started) / max(1, len(completions)), device_class(served.tier.device)
    for completion in completions:
        completion.device_seconds, completion.device_class = share, where
    start = 0
    for job in jobs:
        count = len(job.prepared.prompts)
        job.completions = completions[start : start + count]
        start += count


def token_text(tier: TierModel, as_ids: bool = False) -> Callable[[int], str]:
    """A token's text in log-probs: decoded, or `token_id:<n>` (vLLM's return_tokens_as_token_ids)."""
    if as_ids:
        return lambda token: f"token_id:{token}"
    return lambda token: decoded_text(tier.tokenizer, [token])


def text_decoder(tier: TierModel) -> Callable[[list[int]], str]:
    return lambda ids: decoded_text(tier.tokenizer, ids, skip_special_tokens=True)

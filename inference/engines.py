"""External inference engines: a tier whose completions come from an OpenAI-compatible server
(vLLM, SGLang, or another Flywheel's /v1) instead of Flywheel's own decoder.

Rollouts, held-out evaluation and judges decode through `engine_generate` exactly as they do through
`inference.decoding.decode` (which hands engine tiers here): one `/completions` request per
distinct prompt, with `n` samples, the tier's temperature, top_p, top_k, stop and token budget, and
`logprobs: 0` with `return_tokens_as_token_ids: true` (vLLM's flag, which Flywheel's /v1 serves
too), so every generated token comes back as `token_id:<n>` with its log-prob: what GRPO needs as
its behaviour policy. Prompts are sent as token ids (`prompt_token_ids`, the way training encodes
them), so the engine never tokenizes differently from the learner. Requests run concurrently, up
to the tier's `batch_size` at once: the engine batches them itself.

A LoRA run's policy versions are adapters; an engine that loads adapters at run time is told to
(`engine_adapter_load`: vLLM's `POST /v1/load_lora_adapter {lora_name, lora_path}`, SGLang's
`POST /load_lora_adapter`) and requests then name the adapter as their model. The worker needs
only the base model's tokenizer and config here, never its weights.

The API key is read from the environment variable the tier names, on the worker's host, at the
moment of the request: a tier stores the variable's name, never the key. Django-free.
"""

import itertools
import os
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from inference.chat import Prompt, chat_render
from inference.generation import Completion, prompt_token_ids
from inference.settings import SamplingParams, TierSettings, engine_urls, model_source

TOKEN_ID_PREFIX = "token_id:"
_spread = itertools.count()
MAX_N = 16  # samples a request asks for (Flywheel's /v1 limit; vLLM and SGLang take more)
TIMEOUT_SECONDS = 600.0  # a whole request: n samples of up to the token budget, queued behind others


class EngineError(RuntimeError):
    """The engine could not be reached or answered something unusable: the message says which
    setting or which answer, and why (`status`: the engine's HTTP status, when it answered)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Engine:
    """Where an engine tier sends its requests, from the tier's settings."""

    urls: tuple[str, ...]  # one or more servers of the same model; requests spread over them
    model: str
    api_key_env: str = ""
    adapters: str = "none"
    adapter_root: str = ""

    @classmethod
    def of(cls, settings: TierSettings) -> "Engine":
        return cls(
            urls=tuple(url.rstrip("/") for url in engine_urls(settings.engine_url)),
            model=settings.engine_model,
            api_key_env=settings.engine_api_key_env,
            adapters=settings.engine_adapters,
            adapter_root=settings.engine_adapter_root,
        )

    def headers(self) -> dict[str, str]:
        if not self.api_key_env:
            return {}
        key = os.environ.get(self.api_key_env)
        if not key:
            raise EngineError(
                f"engine_api_key_env: the environment variable {self.api_key_env} is not set on this "
                "host; set it to the engine's API key in the worker's environment"
            )
        return {"Authorization": f"Bearer {key}"}

    @property
    def url(self) -> str:
        return self.urls[0]

    @property
    def loads_adapters(self) -> bool:
        return self.adapters in ("vllm", "sglang")

    def adapter_path(self, artifact: str) -> str:
        """What the engine is told to load: the artifact's name (Flywheel's /v1 reads its own
        artifact storage), or its path where the engine's host mounts the storage."""
        return f"{self.adapter_root.rstrip('/')}/{artifact}" if self.adapter_root else artifact


@dataclass
class EngineTier:
    """An engine tier prepared for generation: what rollouts and judges use in place of a
    `TierModel` (prompt rendering and token counting with the base model's tokenizer)."""

    engine: Engine
    tokenizer: Any
    settings: TierSettings
    served_model: str  # the engine's model, or the loaded adapter's name
    context: int
    version: int = 0
    adapter_artifact: str = ""  # the loaded adapter's artifact, to load it again where it went missing
    model: None = None  # no weights on this host
    draft: None = None

    def prompt_text(self, prompt: Prompt) -> str:
        return chat_render(self.tokenizer, prompt, chat=self.settings.chat)

    @property
    def max_context(self) -> int:
        return self.context


_tokenizers: dict[str, tuple[Any, int]] = {}
_tokenizers_lock = threading.Lock()


def engine_tier_load(
    settings: TierSettings, *, served_model: str | None = None, version: int = 0, adapter_artifact: str = ""
) -> EngineTier:
    """The tier's engine with the base model's tokenizer (loaded once per process; no weights)."""
    from transformers import AutoConfig, AutoTokenizer

    base = settings.base_model
    with _tokenizers_lock:
        if base not in _tokenizers:
            source = str(model_source(base))
            try:
                tokenizer = AutoTokenizer.from_pretrained(source)
                config = AutoConfig.from_pretrained(source)
            except (OSError, ValueError) as exc:
                raise EngineError(f"base_model: cannot load the tokenizer of {base}: {exc}") from exc
            if tokenizer.pad_token is None:
                tokenizer.pad_token = tokenizer.eos_token
            positions = getattr(config, "max_position_embeddings", None)
            _tokenizers[base] = (tokenizer, int(positions or min(tokenizer.model_max_length, 1 << 20)))
        tokenizer, context = _tokenizers[base]
    return EngineTier(
        engine=Engine.of(settings),
        tokenizer=tokenizer,
        settings=settings,
        served_model=served_model or settings.engine_model,
        context=context,
        version=version,
        adapter_artifact=adapter_artifact,
    )


# --- completions ----------------------------------------------------------------------------------


@dataclass
class _Group:
    """A prompt and the rows of the call that repeat it."""

    text: str
    rows: list[int] = field(default_factory=list)


def engine_generate(
    tier: EngineTier, prompts: list[str], settings: TierSettings, *, seeds: Iterable[int] | None = None
) -> list[Completion]:
    """One completion per prompt (a prompt repeated for a group is one request with `n`), with
    token ids and behaviour log-probs. `seeds` (one per request, drawn by the caller) make a
    seeded engine's sampling reproducible."""
    groups: dict[str, _Group] = {}
    for row, prompt in enumerate(prompts):
        groups.setdefault(prompt, _Group(prompt)).rows.append(row)
    requests = [
        (group, group.rows[start : start + MAX_N])
        for group in groups.values()
        for start in range(0, len(group.rows), MAX_N)
    ]
    seed_list = list(seeds) if seeds is not None else []
    urls = tier.engine.urls
    first = next(_spread)  # calls start on different servers, so small calls spread too
    params = settings.sampling_params()
    results: list[Completion | None] = [None] * len(prompts)
    client = httpx.Client(timeout=TIMEOUT_SECONDS, headers=tier.engine.headers())
    with client, ThreadPoolExecutor(max_workers=max(1, min(int(settings.batch_size), len(requests)))) as pool:
        futures = [
            pool.submit(
                _complete,
                client,
                urls[(first + index) % len(urls)],
                tier,
                group.text,
                len(rows),
                params,
                seed_list[index] if index < len(seed_list) else None,
            )
            for index, (group, rows) in enumerate(requests)
        ]
        for future, (_, rows) in zip(futures, requests, strict=True):
            for row, completion in zip(rows, future.result(), strict=True):
                results[row] = completion
    return [completion for completion in results if completion is not None]


def completion_request(
    tier: EngineTier, ids: list[int], n: int, params: SamplingParams, seed: int | None
) -> dict:
    """The `/completions` body: the prompt as token ids, the tier's decoding, token ids back."""
    body: dict[str, Any] = {
        "model": tier.served_model,
        "prompt": ids,
        "n": n,
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
    }
    if params.top_k:
        body["top_k"] = params.top_k  # vLLM's, SGLang's and Flywheel's extension of the API
    if params.stop:
        body["stop"] = list(params.stop)
    if seed is not None:
        body["seed"] = seed
    return body


def _complete(
    client: httpx.Client,
    url: str,
    tier: EngineTier,
    prompt: str,
    n: int,
    params: SamplingParams,
    seed: int | None,
) -> list[Completion]:
    ids = prompt_token_ids(tier.tokenizer, prompt)
    body = completion_request(tier, ids, n, params, seed)
    try:
        answer = _post(client, f"{url}/completions", body)
    except EngineError as exc:
        if exc.status != 404 or not tier.adapter_artifact:
            raise
        # The server lost the adapter (restarted, or another worker unloaded it): load it again.
        _adapter_load_on(tier.engine, url, tier.served_model, tier.adapter_artifact)
        answer = _post(client, f"{url}/completions", body)
    choices = sorted(answer.get("choices") or [], key=lambda choice: choice.get("index", 0))
    if len(choices) != n:
        raise EngineError(f"the engine at {url} answered {len(choices)} choices for n={n}")
    served_by = str(answer.get("model") or "")
    return [_completion(url, choice, ids, served_by) for choice in choices]


def _completion(url: str, choice: dict, prompt_ids: list[int], served_by: str) -> Completion:
    logprobs = choice.get("logprobs") or {}
    tokens, values = logprobs.get("tokens"), logprobs.get("token_logprobs")
    if not isinstance(tokens, list) or not isinstance(values, list) or len(tokens) != len(values):
        raise EngineError(
            f"the engine at {url} sent no per-token log-probs; it must answer `logprobs` "
            "for /completions (vLLM, SGLang and Flywheel do)"
        )
    token_ids = [token_id(token, url) for token in tokens]
    return Completion(
        text=choice.get("text") or "",
        token_ids=token_ids,
        logprobs=[float(value) for value in values],
        finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
        prompt_token_ids=list(prompt_ids),
        served_by=served_by,
    )


def token_id(token: str, url: str = "the engine") -> int:
    """A token as `return_tokens_as_token_ids` reports it.

    >>> token_id("token_id:42")
    42
    """
    if not isinstance(token, str) or not token.startswith(TOKEN_ID_PREFIX):
        raise EngineError(
            f"{url} reported a token as {token!r}, not token_id:<n>: the engine must support "
            "return_tokens_as_token_ids (vLLM does, and Flywheel's /v1)"
        )
    return int(token.removeprefix(TOKEN_ID_PREFIX))


def _post(client: httpx.Client, url: str, body: dict) -> dict:
    try:
        response = client.post(url, json=body)
    except httpx.HTTPError as exc:
        raise EngineError(f"engine_url: cannot reach {url}: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise EngineError(
            f"{url} answered {response.status_code}: {_error_message(response)}", response.status_code
        )
    try:
        return response.json()
    except ValueError as exc:
        raise EngineError(f"{url} answered something that is not JSON: {response.text[:200]!r}") from exc


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return (
        str(body.get("message") or body.get("detail") or body)[:500] if isinstance(body, dict) else str(body)
    )


# --- adapters ---------------------------------------------------------------------------------------

# Per process: the adapters each server has been told to load (a server keeps them until told otherwise).
_loaded: dict[str, set[str]] = {}
_loaded_lock = threading.Lock()


def _adapter_endpoint(engine: Engine, url: str, action: str) -> str:
    if engine.adapters == "sglang":  # SGLang serves it beside /v1, not under it
        return f"{url.removesuffix('/v1')}/{action}"
    return f"{url}/{action}"


def engine_adapter_load(engine: Engine, name: str, artifact: str) -> None:
    """Have every server of the engine serve the adapter stored as `artifact` under `name` (once
    per process and server; a server that already holds the name counts as loaded)."""
    if not engine.loads_adapters:
        raise EngineError("engine_adapters: this engine tier does not load adapters (none)")
    for url in engine.urls:
        with _loaded_lock:
            if name in _loaded.get(url, set()):
                continue
        _adapter_load_on(engine, url, name, artifact)
        with _loaded_lock:
            _loaded.setdefault(url, set()).add(name)


def _adapter_load_on(engine: Engine, server: str, name: str, artifact: str) -> None:
    body: dict[str, Any] = {"lora_name": name, "lora_path": engine.adapter_path(artifact)}
    if engine.adapters == "vllm":
        body["base_model"] = (
            engine.model
        )  # Flywheel's /v1: which served model it attaches to (vLLM ignores it)
    url = _adapter_endpoint(engine, server, "load_lora_adapter")
    with httpx.Client(timeout=TIMEOUT_SECONDS, headers=engine.headers()) as client:
        try:
            response = client.post(url, json=body)
        except httpx.HTTPError as exc:
            raise EngineError(f"engine_url: cannot reach {url}: {type(exc).__name__}: {exc}") from exc
    message = _error_message(response) if response.status_code != 200 else ""
    if response.status_code == 404 and "adapter" not in message.lower():
        raise EngineError(
            f"engine_adapters: {url} has no runtime adapter loading (404); start vLLM with "
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora, or SGLang with --enable-lora"
        )
    if response.status_code != 200 and "already" not in message:
        raise EngineError(f"{url} would not load adapter {name} from {body['lora_path']}: {message}")


def engine_adapter_unload(engine: Engine, name: str) -> int:
    """Tell each server that this process loaded the adapter into to drop it; returns how many
    did (one that could not keeps serving it, harmlessly: the name is never asked for again)."""
    dropped = 0
    for server in engine.urls:
        with _loaded_lock:
            if name not in _loaded.get(server, set()):
                continue
            _loaded[server].discard(name)
        url = _adapter_endpoint(engine, server, "unload_lora_adapter")
        try:
            with httpx.Client(timeout=TIMEOUT_SECONDS, headers=engine.headers()) as client:
                dropped += client.post(url, json={"lora_name": name}).status_code == 200
        except (httpx.HTTPError, EngineError):
            pass
    return dropped


def engine_adapters_loaded(url: str) -> set[str]:
    """The adapters this process has loaded into the server at `url`."""
    with _loaded_lock:
        return set(_loaded.get(url.rstrip("/"), set()))

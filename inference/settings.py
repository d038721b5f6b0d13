"""Tier settings: what a tier holds, its snapshot, and which settings can run together.

Pure and Django-free: the web process validates tiers (forms, REST and services all ask
`tier_problems`) and snapshots them into runs, evaluations and judges without importing torch.

A tier is a named inference configuration of a checkpoint. `SETTING_FIELDS` are the settings that
change generation, in the order forms show them; `TIER_FIELDS` adds the name and description a
tier row holds beside them. `tier_snapshot` is the one way a tier (a row, any object with those
attributes, or a mapping) becomes plain JSON, and `TierSettings` is that snapshot as generation
reads it.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Protocol

SETTING_FIELDS = (
    "base_model",
    "device",
    "precision",
    "speculation",
    "draft_model",
    "speculative_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "max_new_tokens",
    "batch_size",
    "chat",
    "engine",
    "engine_url",
    "engine_model",
    "engine_api_key_env",
    "engine_adapters",
    "engine_adapter_root",
)
TIER_FIELDS = ("name", "description", *SETTING_FIELDS)
PRECISIONS = ("fp32", "bf16", "fp16", "int8")
ENGINES = ("local", "openai")
# How an OpenAI-compatible engine is told to load a LoRA adapter at run time: not at all, vLLM's
# POST <base URL>/load_lora_adapter (Flywheel's /v1 serves the same), or SGLang's POST /load_lora_adapter.
ENGINE_ADAPTERS = ("none", "vllm", "sglang")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LOOKS_LIKE_A_KEY = ("sk-", "fw_", "hf_", "Bearer ")

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
MAX_SPECULATIVE_TOKENS = 16
MAX_NEW_TOKENS = 32768
MAX_BATCH_SIZE = 1024


def looks_like_path(reference: str) -> bool:
    return reference.startswith(("/", "./", "../", "~"))


def model_source(reference: str | Path) -> str | Path:
    """What `from_pretrained` should open: a local path as a Path (`~` expanded), a hub id as is.

    >>> model_source("./models/tiny"), model_source("org/model")
    (PosixPath('models/tiny'), 'org/model')
    """
    if isinstance(reference, str) and looks_like_path(reference):
        return Path(reference).expanduser()
    return reference


def model_reference_problem(reference: str) -> str | None:
    reference = reference.strip()
    if not reference:
        return "is required: a local path or a hub id such as org/model"
    if looks_like_path(reference) or HUB_ID.match(reference):
        return None
    return "must be a local path (starting with / or ./) or a hub id such as org/model"


def tier_problems(values: dict[str, Any]) -> dict[str, str]:
    """Every reason these settings cannot run, by field; empty when they can.

    >>> tier_problems({"base_model": "./m", "precision": "int8", "device": "cuda"})
    {'precision': 'int8 dynamic quantisation runs on the CPU; choose device cpu or auto'}
    """
    problems: dict[str, str] = {}
    base = values.get("base_model", "")
    if (problem := model_reference_problem(base)) is not None:
        problems["base_model"] = problem
    problems.update(_precision_problems(values))
    problems.update(_speculation_problems(values))
    problems.update(_decoding_problems(values))
    problems.update(engine_problems(values))
    return problems


def engine_problems(values: dict[str, Any]) -> dict[str, str]:
    """What is wrong with a tier's engine settings, by field.

    >>> problems = engine_problems({"engine": "openai", "engine_url": "gpu:80", "engine_api_key_env": "sk-x"})
    >>> sorted(problems)
    ['engine_api_key_env', 'engine_model', 'engine_url']
    >>> problems["engine_api_key_env"][:30]
    'this looks like a key itself; '
    """
    engine = values.get("engine") or "local"
    url = (values.get("engine_url") or "").strip()
    model = (values.get("engine_model") or "").strip()
    key_env = (values.get("engine_api_key_env") or "").strip()
    adapters = values.get("engine_adapters") or "none"
    root = (values.get("engine_adapter_root") or "").strip()
    if engine not in ENGINES:
        return {"engine": f"must be one of {', '.join(ENGINES)}"}
    if engine == "local":
        set_here = {
            "engine_url": url,
            "engine_model": model,
            "engine_api_key_env": key_env,
            "engine_adapter_root": root,
        }
        problems = {
            name: "only an openai engine tier has this setting; set engine to openai or leave it empty"
            for name, value in set_here.items()
            if value
        }
        if adapters != "none":
            problems["engine_adapters"] = (
                "only an openai engine tier loads adapters; set engine to openai or choose none"
            )
        return problems
    problems = {}
    urls = engine_urls(url)
    bad = [one for one in urls if not one.startswith(("http://", "https://")) or len(one) < 10]
    if not urls or bad:
        problems["engine_url"] = (
            "must be an http:// or https:// URL, such as http://gpu-1:8000/v1 (several servers of the "
            f"same model: separated by commas){f'; not {bad[0]}' if urls and len(urls) > 1 else ''}"
        )
    if not model:
        problems["engine_model"] = "is required: the model name the engine serves (its --served-model-name)"
    if key_env.startswith(LOOKS_LIKE_A_KEY):
        problems["engine_api_key_env"] = (
            "this looks like a key itself; put the key in an environment variable of the worker hosts "
            "and name that variable here"
        )
    elif key_env and not ENV_NAME.match(key_env):
        problems["engine_api_key_env"] = (
            "must be the name of an environment variable (letters, digits and _), such as VLLM_API_KEY"
        )
    if adapters not in ENGINE_ADAPTERS:
        problems["engine_adapters"] = f"must be one of {', '.join(ENGINE_ADAPTERS)}"
    if root and not root.startswith("/"):
        problems["engine_adapter_root"] = (
            "must be an absolute path: where the engine's host mounts the artifact storage"
        )
    local_only = {
        "precision": ("fp32", "the engine's own (its --dtype)"),
        "device": ("auto", "the engine's host's"),
        "speculation": ("none", "the engine's own (its speculative decoding flags)"),
    }
    for name, (default, whose) in local_only.items():
        if (values.get(name) or default) != default:
            problems[name] = (
                f"an openai engine tier decodes on its engine; {name} is {whose}: leave it {default}"
            )
    return problems


def _precision_problems(values: dict[str, Any]) -> dict[str, str]:
    precision, device = values.get("precision", "fp32"), values.get("device", "auto")
    if precision == "int8" and device == "cuda":
        return {"precision": "int8 dynamic quantisation runs on the CPU; choose device cpu or auto"}
    if precision == "fp16" and device == "cpu":
        return {"precision": "fp16 generation is not supported on the CPU; use bf16 or fp32"}
    return {}


def _speculation_problems(values: dict[str, Any]) -> dict[str, str]:
    mode = values.get("speculation", "none")
    draft = (values.get("draft_model") or "").strip()
    tokens = values.get("speculative_tokens") or 0
    if mode == "none":
        problems = {}
        if draft:
            problems["draft_model"] = "a draft model needs speculation set to draft_model"
        if tokens:
            problems["speculative_tokens"] = "draft tokens need speculative decoding turned on"
        return problems
    problems = {}
    if not 1 <= tokens <= MAX_SPECULATIVE_TOKENS:
        problems["speculative_tokens"] = (
            f"speculative decoding needs between 1 and {MAX_SPECULATIVE_TOKENS} draft tokens per step"
        )
    if mode == "draft_model":
        if not draft:
            problems["draft_model"] = "speculation draft_model needs a draft model"
        elif (problem := model_reference_problem(draft)) is not None:
            problems["draft_model"] = problem
        elif draft == (values.get("base_model") or "").strip():
            problems["draft_model"] = "the draft model must be smaller than, not the same as, the base model"
    elif mode == "prompt_lookup" and draft:
        problems["draft_model"] = "prompt lookup drafts from the prompt itself; leave draft model empty"
    return problems


def _decoding_problems(values: dict[str, Any]) -> dict[str, str]:
    problems: dict[str, str] = {}
    temperature = values.get("temperature", 1.0)
    top_p = values.get("top_p", 1.0)
    if temperature is not None and temperature < 0:
        problems["temperature"] = "must be 0 (greedy) or more"
    if top_p is not None and not 0 < top_p <= 1:
        problems["top_p"] = "must be in (0, 1]"
    max_new = values.get("max_new_tokens", 256)
    if max_new is not None and not 1 <= max_new <= MAX_NEW_TOKENS:
        problems["max_new_tokens"] = f"must be between 1 and {MAX_NEW_TOKENS}"
    batch = values.get("batch_size", 8)
    if batch is not None and not 1 <= batch <= MAX_BATCH_SIZE:
        problems["batch_size"] = f"must be between 1 and {MAX_BATCH_SIZE}"
    if not isinstance(values.get("chat", True), bool):
        problems["chat"] = "must be true (render prompts with the chat template) or false (raw prompts)"
    stop = values.get("stop") or []
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        problems["stop"] = "must be a list of non-empty strings"
    elif len(stop) > 16:
        problems["stop"] = "at most 16 stop sequences"
    return problems


def engine_urls(value: str) -> list[str]:
    """The servers an engine tier names: one base URL, or several separated by commas or spaces.

    >>> engine_urls("http://gpu-1:8000/v1, http://gpu-2:8000/v1")
    ['http://gpu-1:8000/v1', 'http://gpu-2:8000/v1']
    """
    return [url for url in re.split(r"[,\s]+", value or "") if url]


def engine_refusal(values: Mapping | object, *, lora: bool) -> str | None:
    """Why an engine tier cannot serve a training run's policy versions; None when it can (a LoRA
    run on an engine that loads adapters) or the tier decodes locally.

    >>> engine_refusal({"engine": "openai", "engine_url": "http://gpu:8000/v1"}, lora=False)[:60]
    'decodes on an external engine (http://gpu:8000/v1), which se'
    """
    get = (
        values.get
        if isinstance(values, Mapping)
        else lambda name, default=None: getattr(values, name, default)
    )
    if (get("engine") or "local") != "openai":
        return None
    where = f"decodes on an external engine ({get('engine_url')})"
    if not lora:
        return (
            f"{where}, which serves its own model and cannot load a full-weight run's policy versions: "
            "train with adapter lora on an engine that loads adapters (engine_adapters vllm or sglang), "
            "or use a local tier"
        )
    if (get("engine_adapters") or "none") == "none":
        return (
            f"{where} that does not load adapters (engine_adapters none), so it cannot serve this LoRA "
            "run's policy versions: set engine_adapters to vllm or sglang, or use a local tier"
        )
    return None


# --- snapshots --------------------------------------------------------------------------------


class TierRow(Protocol):
    """A tier as an object (a Tier row): its name, and each setting as an attribute."""

    @property
    def name(self) -> str: ...


def tier_snapshot(tier: Mapping | TierRow) -> dict[str, Any]:
    """A tier's name and settings: what a run records as its `tier_config`, what a tier evaluation
    and a judge load, and what `tier_problems` checks. Values are taken as they are (a row's are
    plain JSON); a mapping's missing settings are left out, not defaulted.

    >>> from types import SimpleNamespace
    >>> tier = SimpleNamespace(name="fast", description="d", **dict.fromkeys(SETTING_FIELDS, 0))
    >>> list(tier_snapshot(tier)) == ["name", *SETTING_FIELDS]
    True
    >>> tier_snapshot({"name": "fast", "base_model": "./m", "id": 3})
    {'name': 'fast', 'base_model': './m'}
    """
    if isinstance(tier, Mapping):
        return {name: tier[name] for name in ("name", *SETTING_FIELDS) if name in tier}
    return {"name": tier.name} | {name: getattr(tier, name) for name in SETTING_FIELDS}


# --- settings as generation reads them ----------------------------------------------------------


@dataclass(frozen=True)
class SamplingParams:
    """Decoding parameters. temperature 0 is greedy; top_k 0 and top_p 1 disable truncation."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1; got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be 0 (greedy) or more; got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1]; got {self.top_p}")


@dataclass(frozen=True)
class TierSettings:
    """A tier's settings as generation uses them (from a snapshot, a Tier row, or by hand)."""

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
    chat: bool = True  # render prompts with the tokenizer's chat template when it has one
    engine: str = "local"  # or "openai": an OpenAI-compatible engine decodes (inference/engines.py)
    engine_url: str = ""
    engine_model: str = ""
    engine_api_key_env: str = ""
    engine_adapters: str = "none"
    engine_adapter_root: str = ""
    prefix_cache: bool = True  # share a prompt's prefill among the rows that repeat it
    cuda_graphs: bool = True  # on CUDA, replay the lean decode step as CUDA graphs (a benchmark's off switch)
    name: str = ""

    @classmethod
    def from_config(cls, config: Mapping | TierRow) -> "TierSettings":
        """From a snapshot (a run's tier_config) or a tier row; other keys are ignored, missing
        ones default.

        >>> TierSettings.from_config({"base_model": "./m", "stop": ["\\n"], "id": 3}).stop
        ('\\n',)
        """
        snapshot = config if isinstance(config, Mapping) else tier_snapshot(config)
        names = {f.name for f in fields(cls)}
        values = {key: value for key, value in snapshot.items() if key in names}
        if "stop" in values:
            values["stop"] = tuple(values["stop"] or ())
        return cls(**values)

    def with_(self, **changes: Any) -> "TierSettings":
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

    @property
    def remote(self) -> bool:
        """Whether an external OpenAI-compatible engine decodes for this tier."""
        return self.engine == "openai"

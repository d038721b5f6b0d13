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
from typing import Any

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
)
TIER_FIELDS = ("name", "description", *SETTING_FIELDS)
PRECISIONS = ("fp32", "bf16", "fp16", "int8")

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


# --- snapshots --------------------------------------------------------------------------------


def tier_snapshot(tier: Mapping | object) -> dict[str, Any]:
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
    prefix_cache: bool = True  # share a prompt's prefill among the rows that repeat it
    name: str = ""

    @classmethod
    def from_config(cls, config: Mapping | object) -> "TierSettings":
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

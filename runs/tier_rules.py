"""Which tier settings can run together. Pure: forms, REST and services all ask `tier_problems`."""

import re
from typing import Any

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
MAX_SPECULATIVE_TOKENS = 16
MAX_NEW_TOKENS = 32768
MAX_BATCH_SIZE = 1024


def looks_like_path(reference: str) -> bool:
    return reference.startswith(("/", "./", "../", "~"))


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
    stop = values.get("stop") or []
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        problems["stop"] = "must be a list of non-empty strings"
    elif len(stop) > 16:
        problems["stop"] = "at most 16 stop sequences"
    return problems

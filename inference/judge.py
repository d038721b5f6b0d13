"""The model judge: a tier that reads a grader's chat messages and writes its verdict.

`rewards` builds one per project for its `score_model` / `label_model` graders. Building a judge
imports no torch: the decoder and the tier's model load on the first judgement, so a reward
dry-run without a model grader stays light in the web process.
"""

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from inference.chat import template_text
from inference.settings import TierRow, TierSettings

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from inference.decoding import TierModel
    from inference.engines import EngineTier

Judge = Callable[[str, list[dict], dict], str]


class JudgeError(ValueError):
    """The judge cannot answer: the grader names a tier the project does not have."""


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return str(content.get("text") or content.get("content") or "")
    return "\n".join(_message_text(part) for part in content or [])


def judge_prompt(tokenizer: "PreTrainedTokenizerBase", messages: list[dict]) -> str:
    """Chat messages as the judge model reads them: its chat template, else role-prefixed lines."""
    plain = [{"role": m.get("role", "user"), "content": _message_text(m.get("content"))} for m in messages]
    if getattr(tokenizer, "chat_template", None):
        try:
            return template_text(tokenizer, plain, add_generation_prompt=True)
        except Exception:  # noqa: BLE001  (a template that refuses some role: fall back to plain text)
            pass
    return "".join(f"{m['role']}: {m['content']}\n" for m in plain) + "assistant: "


def judge_settings(settings: TierSettings, params: dict) -> TierSettings:
    """The tier's settings with the rule's sampling parameters over them (temperature, top_p,
    max_tokens / max_completions_tokens).

    >>> judged = judge_settings(TierSettings(temperature=1.0), {"temperature": 0, "max_tokens": 9})
    >>> judged.temperature, judged.max_new_tokens
    (0.0, 9)
    """
    changes: dict[str, Any] = {}
    if "temperature" in params:
        changes["temperature"] = float(params["temperature"])
    if "top_p" in params:
        changes["top_p"] = float(params["top_p"])
    budget = params.get("max_completions_tokens") or params.get("max_tokens")
    if budget:
        changes["max_new_tokens"] = int(budget)
    return settings.with_(**changes)


def tier_judge(tier_config: Mapping | TierRow, *, tier_model: "TierModel | None" = None) -> Judge:
    """A judge for model graders (rewards.engine.Judge): `judge(tier_ref, messages, params) -> str`.

    `tier_config` is one tier's settings (a snapshot or a Tier), which answers every `tier_ref`, or
    a mapping of tier name to settings, which answers the grader's `model` by name. Models load on
    first use and stay loaded; the rule's sampling parameters override the tier's (temperature,
    top_p, max_tokens / max_completions_tokens, seed).
    """
    configs: dict[str, Mapping | TierRow]
    if isinstance(tier_config, Mapping) and "base_model" not in tier_config:
        single, configs = False, dict(tier_config)  # tier name -> its settings
    else:
        single, configs = True, {"": tier_config}
    loaded: dict[str, TierModel | EngineTier] = {"": tier_model} if tier_model is not None else {}
    lock = threading.Lock()

    def judge(tier_ref: str, messages: list[dict], params: dict) -> str:
        key = "" if single else tier_ref
        if key not in configs:
            raise JudgeError(f"no tier named {tier_ref!r} to judge with; known: {', '.join(sorted(configs))}")
        import torch  # only once a model is about to run

        from inference.decoding import decode, tier_load  # torch too: a judge that never runs loads none

        with lock:  # graders run in threads; one model generates one request at a time
            if key not in loaded:
                loaded[key] = tier_load(TierSettings.from_config(configs[key]))
            model = loaded[key]
            generator = torch.Generator().manual_seed(int(params["seed"])) if "seed" in params else None
            prompt = judge_prompt(model.tokenizer, messages)
            settings = judge_settings(model.settings, params)
            [completion] = decode(model, [prompt], settings, generator=generator)
        return completion.text

    return judge

"""Policies: any Hugging Face causal LM and its tokenizer, loaded from a local path or a hub id.

A hub id only works where the machine reaches a hub; Flywheel's own tiny base model
(`python manage.py build_base_model`) is a local path loaded the same way.
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from inference.adapters import adapter_activate, adapter_base, is_adapter
from inference.chat import Prompt, chat_render

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class PolicyLoadError(ValueError):
    """The policy could not be loaded: the message says which path or id and why."""


@dataclass
class Policy:
    """A model, its tokenizer and the version of its weights that trajectories record."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    version: int = 0
    chat: bool = True  # the tier's setting: render prompts with the chat template when there is one

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def prompt_text(self, prompt: Prompt) -> str:
        """The prompt (a string or chat messages) as the model expects it: through its chat
        template when it has one and the tier chats, else the raw text."""
        return chat_render(self.tokenizer, prompt, chat=self.chat)


def prompt_text(tokenizer: PreTrainedTokenizerBase, prompt: Prompt, *, chat: bool = True) -> str:
    return chat_render(tokenizer, prompt, chat=chat)


def policy_modules_load() -> None:
    """Import what transformers imports lazily on a first load (Auto classes, Llama, the base
    model's architecture), so that a worker's first batch does not wait for it."""
    import transformers.models.auto.modeling_auto  # noqa: F401
    import transformers.models.auto.tokenization_auto  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401


def policy_load(source: str | Path, *, device: str = "cpu", dtype: str = "float32") -> Policy:
    """Load a causal LM and its tokenizer; a tokenizer without a pad token pads with its EOS. A
    published LoRA adapter loads its base model and attaches the adapter (workers that keep the
    base resident swap adapters with `inference.adapters.adapter_activate` instead)."""
    if dtype not in DTYPES:
        raise PolicyLoadError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    adapter = is_adapter(source)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source))
        weights = adapter_base(source) if adapter else str(source)
        model = AutoModelForCausalLM.from_pretrained(weights, dtype=DTYPES[dtype])
        if adapter:
            model = adapter_activate(model, source)
    except (OSError, ValueError) as exc:
        raise PolicyLoadError(f"cannot load a policy from {source}: {exc}") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # transformers wraps PreTrainedModel.to with functools.wraps, whose stub leaves `self` unbound.
    model.to(device)  # type: ignore[arg-type]
    model.eval()
    return Policy(model=model, tokenizer=tokenizer)

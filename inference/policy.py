"""Policies: any Hugging Face causal LM and its tokenizer, loaded from a local path or a hub id.

A hub id only works where the machine reaches a hub; Flywheel's own tiny base model
(`python manage.py build_base_model`) is a local path loaded the same way.
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class PolicyLoadError(ValueError):
    """The policy could not be loaded: the message says which path or id and why."""


@dataclass
class Policy:
    """A model, its tokenizer and the version of its weights that trajectories record."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    version: int = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def prompt_text(self, prompt: str) -> str:
        """The prompt as the model expects it: through its chat template when it has one."""
        return prompt_text(self.tokenizer, prompt)


def prompt_text(tokenizer: PreTrainedTokenizerBase, prompt: str) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
    return prompt


def policy_modules_load() -> None:
    """Import what transformers imports lazily on a first load (Auto classes, Llama, the base
    model's architecture), so that a worker's first batch does not wait for it."""
    import transformers.models.auto.modeling_auto  # noqa: F401
    import transformers.models.auto.tokenization_auto  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401


def policy_load(source: str | Path, *, device: str = "cpu", dtype: str = "float32") -> Policy:
    """Load a causal LM and its tokenizer; a tokenizer without a pad token pads with its EOS."""
    if dtype not in DTYPES:
        raise PolicyLoadError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source))
        model = AutoModelForCausalLM.from_pretrained(str(source), dtype=DTYPES[dtype])
    except (OSError, ValueError) as exc:
        raise PolicyLoadError(f"cannot load a policy from {source}: {exc}") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device)
    model.eval()
    return Policy(model=model, tokenizer=tokenizer)

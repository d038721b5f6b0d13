"""LoRA adapters (peft): what a LoRA run trains, publishes and serves.

A LoRA run trains low-rank adapters on the attention and MLP projections of a frozen base model.
Its reference policy (KL, DPO) is the same model with the adapters disabled, so there is no second
copy of the weights. Each policy version is published as its adapter alone (`adapter_config.json`
and `adapter_model.safetensors`, a few hundred kB where the full weights are hundreds of MB), and a
rollout or eval worker keeps the base resident and swaps the new version's adapter weights into it
in place (`adapter_activate`), never reloading the base.

peft is imported where an adapter is built or loaded, so importing this module stays light.
"""

import json
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# Module names that are never adapted: the output head and the embeddings.
NEVER_ADAPTED = ("lm_head", "embed_out", "score", "wte", "wpe", "embed_tokens")


class AdapterError(ValueError):
    """An adapter cannot be built or applied: the message names the setting or path and why."""


@dataclass(frozen=True)
class LoraSettings:
    """A LoRA run's adapter: rank, scaling (alpha / rank), dropout and the modules it adapts
    ("auto": every attention and MLP projection of the family; or a comma-separated list)."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: str = "auto"


def is_adapter(path: str | Path) -> bool:
    """Whether `path` is a published adapter (a LoRA policy version), not full weights."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def adapter_base(path: str | Path) -> str:
    """The base model an adapter was trained on (a local path or hub id), from its config."""
    config = json.loads((Path(path) / ADAPTER_CONFIG).read_text())
    base = config.get("base_model_name_or_path")
    if not base:
        raise AdapterError(f"{path}/{ADAPTER_CONFIG} names no base model (base_model_name_or_path)")
    return str(base)


def lora_targets(model: Any, spec: str = "auto") -> list[str]:
    """The module names LoRA adapts. "auto": the linear layers inside the transformer blocks (the
    family's attention and MLP projections: q/k/v/o and gate/up/down for Llama, Qwen, Mistral and
    Gemma; qkv_proj, gate_up_proj for Phi-3; query_key_value, dense_* for GPT-NeoX; c_attn, c_proj,
    c_fc for GPT-2), never the embeddings or the output head. Otherwise a comma-separated list of
    module names and groups: `attention` and `mlp` (those projections, by where they sit; a name
    used in both, as GPT-2's c_proj, counts as attention), `unembed` (the output head)."""
    names = sorted(
        {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if _is_projection(name, module)}
    )
    if spec.strip() in ("", "auto"):
        if not names:
            raise AdapterError("lora_target_modules auto: this model has no linear layers inside its blocks")
        return names
    wanted: list[str] = []
    for name in (part.strip() for part in spec.split(",")):
        if name in GROUPS:  # a group of the family's own modules (the Tinker API's LoRA flags)
            wanted += [found for found in _group(model, name, names) if found not in wanted]
        elif name and name not in wanted:
            wanted.append(name)
    every = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [name for name in wanted if name not in every]
    if missing:
        raise AdapterError(
            f"lora_target_modules: no module named {', '.join(missing)} in this model; "
            f"its projections are {', '.join(names)}"
        )
    return wanted


GROUPS = ("attention", "mlp", "unembed")


def _group(model: Any, group: str, projections: list[str]) -> list[str]:
    """The module names of a group: the projections inside attention blocks, the other projections
    (the MLP's), or the output head."""
    if group == "unembed":
        head = model.get_output_embeddings()
        return [name.rsplit(".", 1)[-1] for name, module in model.named_modules() if module is head][:1]
    in_attention = {
        name.rsplit(".", 1)[-1]
        for name, _ in model.named_modules()
        if any(part in name.lower() for part in ("attn", "attention"))
    }
    chosen = [name for name in projections if (name in in_attention) == (group == "attention")]
    if not chosen:
        raise AdapterError(f"lora_target_modules {group}: this model has no such projections")
    return chosen


def _is_projection(name: str, module: Any) -> bool:
    import torch

    kind = type(module).__name__
    linear = isinstance(module, torch.nn.Linear) or kind == "Conv1D"  # GPT-2 keeps its projections as Conv1D
    in_block = any(part.isdigit() for part in name.split("."))
    return linear and in_block and name.rsplit(".", 1)[-1] not in NEVER_ADAPTED


def lora_wrap(model: Any, settings: LoraSettings) -> Any:
    """The model with fresh trainable LoRA adapters (peft); the base weights are frozen."""
    from peft import LoraConfig, get_peft_model

    if settings.rank < 1:
        raise AdapterError(f"lora_rank must be at least 1; got {settings.rank}")
    if not 0 <= settings.dropout < 1:
        raise AdapterError(f"lora_dropout must be in [0, 1); got {settings.dropout}")
    config = LoraConfig(
        r=settings.rank,
        # peft annotates lora_alpha as int, but only divides it by r: a fractional alpha scales as asked.
        lora_alpha=settings.alpha,  # type: ignore[arg-type]
        lora_dropout=settings.dropout,
        target_modules=lora_targets(model, settings.target_modules),
        fan_in_fan_out=getattr(model.config, "model_type", "") == "gpt2",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def model_save(model: Any, path: str | Path) -> None:
    """`save_pretrained`, an adapter without the frozen base weights peft would add to it: a LoRA on
    the output head tied to the embeddings makes peft save the head's base weight too, which peft's
    hot swap (`adapter_activate`) then refuses; the base model holds it already."""
    if getattr(model, "peft_config", None) is not None:
        model.save_pretrained(path, save_embedding_layers=False)
    else:
        model.save_pretrained(path)


def lora_resume(model: Any, path: str | Path, *, trainable: bool) -> Any:
    """The base `model` with the adapter at `path` attached (to continue training it, or to serve)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(path), is_trainable=trainable)


def adapter_activate(model: Any, path: str | Path) -> Any:
    """Serve the adapter at `path` on a resident base: the first time its LoRA layers are attached,
    afterwards the new version's weights are copied into them in place (peft's hot swap). Returns
    the model to generate with."""
    from peft import PeftModel
    from peft.utils.hotswap import hotswap_adapter

    if not isinstance(model, PeftModel):
        adapted = PeftModel.from_pretrained(model, str(path), is_trainable=False)
        adapted.eval()
        return adapted
    device = str(next(model.parameters()).device)
    try:
        hotswap_adapter(model, str(path), adapter_name="default", torch_device=device)
    except (ValueError, RuntimeError) as exc:
        raise AdapterError(f"cannot apply the adapter at {path} to the resident model: {exc}") from exc
    return model


# A model that carries adapters is a PeftModel; these name peft's calls on one, typed `Any` like
# the rest of this module's models (peft is imported only where an adapter is built or loaded).


def adapter_merge(model: Any) -> Any:
    """The base model with the adapter's weights merged into its own (peft's merge_and_unload)."""
    return model.merge_and_unload()


def adapter_remove(model: Any) -> Any:
    """The base model with the LoRA layers taken out, its weights as they were (peft's unload)."""
    return model.unload()


def adapters_disabled(model: Any) -> AbstractContextManager[None]:
    """Within it, the model computes as its base model (peft's disable_adapter)."""
    return model.disable_adapter()


def trainable_parameters(model: Any) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    total = sum(parameter.numel() for parameter in model.parameters())
    trainable = sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)
    return trainable, total

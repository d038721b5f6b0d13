"""How well a learner step used its device: the step's peak memory and its model FLOPs utilisation.

MFU is the PaLM paper's (Chowdhery et al. 2022, appendix B): the FLOPs the model's training needs,
divided by the step's time and the device's peak. A dense transformer's forward pass costs 2N FLOPs
per token for N weights in matrix products; backward twice that, 2N for the activations' gradients
and 2N for the weights'. So a step on all weights costs 6N per token. With LoRA the frozen weights
still pass gradients back to the activations but compute none of their own: 4N + 2N_trained per
token. Attention's score and value products (PaLM's 12·L·H·Q·T, a few per cent at a few hundred
tokens per row), a reference model's forward passes, gradient checkpointing's recomputation and
padding are not counted: the figure is the useful work, as its definition wants, never the
hardware's total. Tokens are those the step trained on (prompts and completions, padding not
counted; each of GRPO's `num_iterations` passes counts again).
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class DeviceSpec:
    """A GPU's dense bf16 tensor-core peak (no sparsity) and its memory bandwidth."""

    name: str
    bf16_tflops: float
    memory_tbps: float


# From NVIDIA's data sheets (H200, H100, A100, L40S, L40, L4), dense figures: the sheets print the
# tensor-core peaks with 2:4 sparsity, twice these. Matched against `torch.cuda.get_device_name`
# (an H100 SXM reports "NVIDIA H100 80GB HBM3"), the first whose words all appear winning.
KNOWN_DEVICES: tuple[tuple[tuple[str, ...], DeviceSpec], ...] = (
    (("H200", "NVL"), DeviceSpec("H200 NVL", 835.5, 4.8)),
    (("H200",), DeviceSpec("H200 SXM", 989.4, 4.8)),
    (("H100", "NVL"), DeviceSpec("H100 NVL", 835.5, 3.9)),
    (("H100", "PCIE"), DeviceSpec("H100 PCIe", 756.5, 2.0)),
    (("H100",), DeviceSpec("H100 SXM", 989.4, 3.35)),
    (("A100", "40GB"), DeviceSpec("A100 40GB", 312.0, 1.555)),
    (("A100", "PCIE"), DeviceSpec("A100 80GB PCIe", 312.0, 1.935)),
    (("A100",), DeviceSpec("A100 80GB SXM", 312.0, 2.039)),
    (("L40S",), DeviceSpec("L40S", 362.05, 0.864)),
    (("L40",), DeviceSpec("L40", 181.05, 0.864)),
    (("L4",), DeviceSpec("L4", 121.0, 0.3)),
)


def device_spec(name: str) -> DeviceSpec | None:
    """The known GPU a device name describes, or None.

    >>> device_spec("NVIDIA H100 80GB HBM3").name, device_spec("NVIDIA H100 PCIe").name
    ('H100 SXM', 'H100 PCIe')
    >>> device_spec("NVIDIA L40S").bf16_tflops, device_spec("NVIDIA GeForce GTX 1080") is None
    (362.05, True)
    """
    words = set(re.split(r"[\s\-_]+", name.upper()))
    return next((spec for needed, spec in KNOWN_DEVICES if set(needed) <= words), None)


def peak_flops(device: torch.device, override_tflops: float = 0.0) -> float | None:
    """The device's peak FLOP/s: `override_tflops` (FLYWHEEL_DEVICE_PEAK_TFLOPS) when set, else a
    known GPU's dense bf16 peak; None for a device whose peak is unknown (a CPU), so no MFU is
    made up for it."""
    if override_tflops > 0:
        return override_tflops * 1e12
    if device.type != "cuda":
        return None
    spec = device_spec(torch.cuda.get_device_name(device))
    return spec.bf16_tflops * 1e12 if spec is not None else None


def model_flops_per_token(model: torch.nn.Module) -> float:
    """Training FLOPs per token: 4N + 2N_trained, N the weights in matrix products (every
    parameter but an untied input embedding, a lookup; a tied one is also the output head), so
    6N with all weights trained (see the module's docstring)."""
    embedding = _input_embedding(model)
    matmul = [p for p in model.parameters() if p is not embedding or _is_tied(model, embedding)]
    weights = sum(p.numel() for p in matmul)
    trained = sum(p.numel() for p in matmul if p.requires_grad)
    return 4.0 * weights + 2.0 * trained


def _input_embedding(model: torch.nn.Module) -> torch.nn.Parameter | None:
    get = getattr(model, "get_input_embeddings", None)
    module = get() if get is not None else None
    return module.weight if module is not None else None


def _is_tied(model: torch.nn.Module, embedding: torch.nn.Parameter) -> bool:
    get = getattr(model, "get_output_embeddings", None)
    head = get() if get is not None else None
    return head is not None and head.weight is embedding


def mfu(flops_per_token: float, tokens: float, seconds: float, peak: float) -> float:
    """The share of the device's peak the step's model FLOPs used.

    >>> round(mfu(6 * 0.5e9, 12_288, 0.25, 989.4e12), 4)
    0.149
    """
    return flops_per_token * tokens / seconds / peak


def synchronise(device: torch.device) -> None:
    """Wait for the device's queued work, so a time read next covers it (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def step_memory_reset(device: torch.device) -> None:
    """Start the step's peak memory afresh: CUDA's allocator peak, or on Linux the process's
    peak resident set (writing 5 to clear_refs resets VmHWM; elsewhere there is nothing to reset
    and `step_peak_memory_mb` says None)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    if _resettable():
        _CLEAR_REFS.write_text("5")


def step_peak_memory_mb(device: torch.device) -> float | None:
    """The most memory the step held at once, in MiB: on CUDA the tensors allocated on the GPU
    (weights, optimiser state, activations; not the allocator's cache), on a CPU the learner
    process's peak resident set (the Python runtime and libraries included) where Linux could
    reset it at the step's start; otherwise None, not a lifetime peak passed off as the step's."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if not _resettable():
        return None
    match = re.search(r"^VmHWM:\s+(\d+) kB", _STATUS.read_text(), re.MULTILINE)
    return int(match.group(1)) / 1024 if match else None


def _resettable() -> bool:
    return os.access(_CLEAR_REFS, os.W_OK)


def step_figures(
    model: torch.nn.Module,
    device: torch.device,
    tokens: float | None,
    seconds: float,
    peak_tflops: float = 0.0,
) -> dict[str, float]:
    """A step's `step_seconds`, `peak_memory_mb` (where it can be measured) and `mfu` (where the
    device's peak is known and the step trained on tokens), for the step's metrics; call after
    `synchronise` and with `step_memory_reset` called at the step's start."""
    figures = {"step_seconds": seconds}
    if (peak_memory := step_peak_memory_mb(device)) is not None:
        figures["peak_memory_mb"] = peak_memory
    peak = peak_flops(device, peak_tflops)
    if peak is not None and tokens and seconds > 0:
        figures["mfu"] = mfu(model_flops_per_token(model), tokens, seconds, peak)
    return figures

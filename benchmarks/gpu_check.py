"""`make gpu-check`: what Flywheel's model paths do on a CUDA GPU, in under five minutes.

Builds a random-initialised Qwen2 of about 0.5B parameters (Qwen2-0.5B's widths: hidden 896, MLP
4864, 14 query and 2 key/value heads; 32 layers, with the suite's small local tokenizer, so nothing
is downloaded), saves it with `save_pretrained`, then measures:

- generation in bf16 through the tier decoder, batch 1 and batch 32: tokens/s, latency;
- one GRPO optimiser step with all weights and one with LoRA (rank 16, the family's projections),
  bf16 autocast: samples/s and peak GPU memory;
- precision rules: fp16 and bf16 generate finite greedy text (and how much of it matches fp32);
  an int8 tier on CUDA is refused with its reason.

Prints one JSON line. Without a CUDA device it refuses (exit status 2) unless `--dry-run`, which
runs every step on a tiny model on the CPU (what the test suite checks; its figures mean nothing).

Run: .venv/bin/python benchmarks/gpu_check.py [--dry-run]
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

import django  # noqa: E402

django.setup()

import torch  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from inference.decoding import TierError, decode, resolve_device, tier_load  # noqa: E402
from inference.settings import TierSettings  # noqa: E402
from tests.model_families import FAMILIES, tokenizer_build  # noqa: E402
from workers.learners.common import learner_create, sequence_batch  # noqa: E402
from workers.learners.grpo import GRPOBatch, GRPOConfig, learn_on_batch  # noqa: E402

FULL_SIZE = {"hidden": 896, "intermediate": 4864, "layers": 32, "heads": 14, "kv_heads": 2}
DRY_SIZE = {"hidden": 64, "intermediate": 128, "layers": 2, "heads": 2, "kv_heads": 1}


def model_build(path: Path, size: dict) -> int:
    """A random-init Qwen2 and its tokenizer, saved; returns the parameter count."""
    tokenizer = tokenizer_build(FAMILIES["qwen2"])
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=size["hidden"],
        intermediate_size=size["intermediate"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["kv_heads"],
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return sum(parameter.numel() for parameter in model.parameters())


def synchronise(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def generation(path: Path, device: str, precision: str, batch: int, tokens: int) -> dict:
    """Tokens/s and per-request latency of sampled generation at one batch size."""
    settings = TierSettings(
        base_model=str(path),
        device=device,
        precision=precision,
        temperature=1.0,
        max_new_tokens=tokens,
        batch_size=batch,
    )
    tier = tier_load(settings)
    prompts = [tier.prompt_text(f"Write a function that returns x plus {n}.") for n in range(batch)]
    decode(tier, prompts[:1], settings.with_(max_new_tokens=4))  # warm-up
    synchronise(device)
    started = time.perf_counter()
    completions = decode(tier, prompts, settings, generator=torch.Generator().manual_seed(0))
    synchronise(device)
    seconds = time.perf_counter() - started
    generated = sum(len(c.token_ids) for c in completions)
    del tier
    return {
        "batch": batch,
        "tokens": generated,
        "tokens_per_second": round(generated / seconds, 1),
        "latency_seconds": round(seconds, 3),
    }


def grpo_step(path: Path, work: Path, adapter: str, rows: int, prompt: int, completion: int) -> dict:
    """One GRPO optimiser step on `rows` sequences (bf16 autocast where the device has it)."""
    config = GRPOConfig(
        model=str(path),
        output_dir=str(work / adapter),
        mixed_precision="auto",
        adapter=adapter,
        lora_rank=16,
        lora_alpha=32,
        learning_rate=1e-5,
    )
    learner, _ = learner_create(config)
    device = learner.accelerator.device
    generator = torch.Generator().manual_seed(0)
    vocab = len(learner.tokenizer)
    prompts = torch.randint(10, vocab, (rows // 4, prompt), generator=generator).repeat_interleave(4, 0)
    completions = torch.randint(10, vocab, (rows, completion), generator=generator)
    sequences = sequence_batch(prompts.tolist(), completions.tolist(), learner.tokenizer.pad_token_id)
    old = torch.full((rows, prompt + completion - 1), -5.0)
    batch = GRPOBatch(sequences, old, torch.randn(rows, generator=generator))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    learn_on_batch(learner, batch, config, reference=None)  # warm-up step
    synchronise(device.type)
    started = time.perf_counter()
    learn_on_batch(learner, batch, config, reference=None)
    synchronise(device.type)
    seconds = time.perf_counter() - started
    trainable = sum(p.numel() for p in learner.model.parameters() if p.requires_grad)
    result = {
        "rows": rows,
        "tokens_per_row": prompt + completion,
        "step_seconds": round(seconds, 3),
        "samples_per_second": round(rows / seconds, 2),
        "trainable_parameters": trainable,
        "mixed_precision": learner.accelerator.mixed_precision,
    }
    if device.type == "cuda":
        result["peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    del learner
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def precision_checks(path: Path, device: str) -> dict:
    """fp16 / bf16 greedy text against fp32's, and the int8-on-CUDA refusal."""
    checks: dict = {}
    reference = None
    for precision in ("fp32", "bf16", "fp16"):
        settings = TierSettings(
            base_model=str(path),
            device=device,
            precision=precision,
            temperature=0.0,
            max_new_tokens=16,
            batch_size=4,
        )
        try:
            tier = tier_load(settings)
        except TierError as refused:
            checks[precision] = {"refused": str(refused)}
            continue
        prompts = [tier.prompt_text(f"Write f(x) returning x plus {n}.") for n in range(4)]
        completions = decode(tier, prompts, settings)
        finite = all(
            all(value == value and abs(value) != float("inf") for value in c.logprobs) for c in completions
        )
        tokens = [c.token_ids for c in completions]
        if reference is None:
            reference = tokens
        same = sum(
            a == b for row, ref in zip(tokens, reference, strict=True) for a, b in zip(row, ref, strict=False)
        )
        total = sum(len(row) for row in reference)
        checks[precision] = {
            "finite_logprobs": finite,
            "greedy_tokens_matching_fp32": round(same / max(1, total), 3),
        }
    try:
        resolve_device(TierSettings(base_model=str(path), device="cuda", precision="int8"))
        checks["int8_on_cuda"] = {"refused": False}
    except TierError as refused:
        checks["int8_on_cuda"] = {"refused": True, "reason": str(refused)}
    return checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dry-run", action="store_true", help="a tiny model on the CPU: the steps, not figures"
    )
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not args.dry_run:
        print(
            json.dumps(
                {
                    "gpu_check": "refused",
                    "reason": "no CUDA device on this machine; "
                    "run it on a GPU machine, or with --dry-run for a tiny CPU rehearsal",
                }
            )
        )
        return 2
    device = "cuda" if cuda and not args.dry_run else "cpu"
    size = DRY_SIZE if args.dry_run else FULL_SIZE
    gen_tokens, rows, prompt, completion = (8, 8, 16, 16) if args.dry_run else (128, 32, 128, 256)
    started = time.monotonic()
    report: dict = {"gpu_check": "dry-run" if args.dry_run else "cuda", "device": device}
    if device == "cuda":
        report["gpu"] = torch.cuda.get_device_name(0)
        report["bf16_supported"] = torch.cuda.is_bf16_supported()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:
        work = Path(folder)
        path = work / "qwen2-random"
        report["parameters"] = model_build(path, size)
        report["model"] = f"Qwen2 (random init) {size}"
        precision = "bf16" if device == "cuda" else "fp32"
        report["generation"] = [
            generation(path, device, precision, batch, gen_tokens) | {"precision": precision}
            for batch in (1, 32)
        ]
        report["grpo_step"] = {
            adapter: grpo_step(path, work, adapter, rows, prompt, completion) for adapter in ("none", "lora")
        }
        report["precision"] = precision_checks(path, device)
    report["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""LoRA against full weights, in one run: what a policy version costs to publish and to load, and
what GRPO on the demo tasks lifts.

1. Publish and load, on the same model: the tiny demo model and a bigger random Llama built here
   (`--mid-hidden`, `--mid-layers`). Full weights: a version is `save_pretrained` (bytes, seconds)
   and a rollout worker loads it (`policy_load` + `tier_prepare`). LoRA: a version is its adapter
   (bytes, seconds) and a worker swaps it into the base it keeps resident
   (`tier_adapter_serve`, peft's in-place hot swap). Medians of `--repeats`.
2. Lift: GRPO on the demo tasks from the tiny model, full weights and LoRA with the same steps,
   data, seeds and sampling, both evaluated on the same held-out set (greedy, sandboxed unit tests).
   The target: LoRA's held-out lift within 5 points of the full-weight run's.

Run: .venv/bin/python benchmarks/bench_lora.py [--steps 30 --heldout 160 --skip-lift].
Prints a table, then one line of JSON.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

import django  # noqa: E402

django.setup()

import torch  # noqa: E402
from django.conf import settings as django_settings  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from inference.adapters import LoraSettings, lora_wrap, trainable_parameters  # noqa: E402
from inference.decoding import _resident, tier_adapter_serve, tier_prepare  # noqa: E402
from inference.policy import policy_load  # noqa: E402
from inference.settings import TierSettings  # noqa: E402
from projects.demo_tasks import demo_task_sets  # noqa: E402
from workers.base_model import BaseModelConfig, base_model_build  # noqa: E402
from workers.evaluation import pass_rates  # noqa: E402
from workers.learners.grpo import GRPOConfig, train_grpo  # noqa: E402


def folder_bytes(path: Path) -> int:
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file())


def weight_bytes(path: Path) -> int:
    """The weights' files only (the tokenizer is published with every version either way)."""
    return sum(file.stat().st_size for file in path.glob("*.safetensors"))


def mid_model(tiny: Path, out: Path, hidden: int, layers: int) -> Path:
    """A bigger random Llama with the tiny model's tokenizer, saved like any checkpoint."""
    if (out / "config.json").exists():
        return out
    tokenizer = policy_load(tiny).tokenizer
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 64),
        max_position_embeddings=256,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def publish_and_load(model_path: Path, work: Path, repeats: int, lora: LoraSettings) -> dict:
    """Seconds and bytes to publish a version and to have a worker serve it, full vs LoRA."""
    settings = TierSettings(base_model=str(model_path), temperature=0.0, batch_size=8)
    full_model = policy_load(model_path)
    adapted = lora_wrap(policy_load(model_path).model, lora)
    rows: dict[str, list[dict]] = {"full": [], "lora": []}
    _resident.clear()
    tier_adapter_serve(settings, _publish(adapted, full_model.tokenizer, work / "lora-warm")[1], version=0)
    for repeat in range(repeats):
        for name, model in (("full", full_model.model), ("lora", adapted)):
            with torch.no_grad():  # a new version: different weights each time
                for parameter in (p for p in model.parameters() if p.requires_grad):
                    parameter.add_(1e-3)
            seconds, path = _publish(model, full_model.tokenizer, work / f"{name}-{repeat}")
            started = time.perf_counter()
            if name == "full":
                tier_prepare(policy_load(path), settings)
            else:
                tier_adapter_serve(settings, path, version=repeat + 1)
            load = time.perf_counter() - started
            rows[name].append(
                {
                    "publish_s": seconds,
                    "load_s": load,
                    "bytes": weight_bytes(path),
                    "folder": folder_bytes(path),
                }
            )
    trainable, total = trainable_parameters(adapted)
    result = {"parameters": total - trainable, "lora_trainable": trainable}
    for name, measured in rows.items():
        result[name] = {
            "publish_seconds": round(statistics.median(r["publish_s"] for r in measured), 4),
            "load_seconds": round(statistics.median(r["load_s"] for r in measured), 4),
            "weights_bytes": measured[0]["bytes"],
            "folder_bytes": measured[0]["folder"],
        }
    result["bytes_ratio"] = round(result["full"]["weights_bytes"] / result["lora"]["weights_bytes"], 1)
    result["load_speedup"] = round(result["full"]["load_seconds"] / result["lora"]["load_seconds"], 1)
    return result


def _publish(model, tokenizer, path: Path) -> tuple[float, Path]:
    shutil.rmtree(path, ignore_errors=True)
    started = time.perf_counter()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return time.perf_counter() - started, path


def lift(model: Path, work: Path, args: argparse.Namespace) -> dict:
    """GRPO full vs LoRA from the same base, same steps and data; held-out pass rates."""
    sets = demo_task_sets(seed=0, train_size=100_000, heldout_size=args.heldout, kinds=("scalar",))
    base = pass_rates(policy_load(model), sets["heldout"]).overall
    common = {
        "model": str(model),
        "seed": 0,
        "steps": args.steps,
        "group_size": 8,
        "prompts_per_step": 16,
        "lr_scheduler": "linear",
        "log_every": 10,
    }
    variants = {
        "full": {"learning_rate": 3e-4},
        "lora": {
            "learning_rate": args.lora_lr,
            "adapter": "lora",
            "lora_rank": args.rank,
            "lora_alpha": args.alpha,
        },
    }
    result = {"base": round(100 * base, 2), "steps": args.steps, "heldout_items": len(sets["heldout"])}
    for name, extra in variants.items():
        out = work / f"grpo-{name}"
        shutil.rmtree(out, ignore_errors=True)
        started = time.monotonic()
        train_grpo(GRPOConfig(output_dir=str(out), **common, **extra), sets["train"], log=lambda line: None)
        seconds = time.monotonic() - started
        final = pass_rates(policy_load(out / "final"), sets["heldout"]).overall
        result[name] = {
            "heldout": round(100 * final, 2),
            "lift_points": round(100 * (final - base), 2),
            "train_seconds": round(seconds, 1),
            **{key: value for key, value in extra.items() if key != "adapter"},
        }
        print(f"{name}: held-out {100 * final:.2f}% (base {100 * base:.2f}%) in {seconds:.0f} s", flush=True)
    gap = result["full"]["lift_points"] - result["lora"]["lift_points"]
    result["lift_gap_points"] = round(gap, 2)
    result["within_5_points"] = (
        abs(gap) <= 5.0 or result["lora"]["lift_points"] >= result["full"]["lift_points"]
    )
    return result


def main() -> None:
    home = Path(django_settings.FLYWHEEL_HOME) / "models"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=home / "tiny-base")
    parser.add_argument("--mid-hidden", type=int, default=512)
    parser.add_argument("--mid-layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--heldout", type=int, default=160)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--alpha", type=float, default=32.0)
    parser.add_argument("--lora-lr", type=float, default=3e-3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the machine is shared)")
    parser.add_argument("--skip-lift", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not (args.model / "config.json").exists():
        print(f"building the tiny base model into {args.model} ...", flush=True)
        base_model_build(args.model, BaseModelConfig(), log=lambda line: None)
    lora = LoraSettings(rank=args.rank, alpha=args.alpha)
    report: dict = {"bench": "lora", "threads": args.threads}
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as folder:
        work = Path(folder)
        mid = mid_model(args.model, work / "mid", args.mid_hidden, args.mid_layers)
        for name, path in (("tiny", args.model), ("mid", mid)):
            figures = publish_and_load(path, work / name, args.repeats, lora)
            report[f"publish_load_{name}"] = figures
            full, adapter = figures["full"], figures["lora"]
            print(
                f"{name:5s} {figures['parameters'] / 1e6:7.2f}M | full: {full['weights_bytes']:>11,d} B, "
                f"publish {full['publish_seconds']:.3f} s, load {full['load_seconds']:.3f} s | "
                f"lora: {adapter['weights_bytes']:>9,d} B, publish {adapter['publish_seconds']:.3f} s, "
                f"swap {adapter['load_seconds']:.3f} s",
                flush=True,
            )
        if not args.skip_lift:
            report["lift"] = lift(args.model, work, args)
    print(json.dumps(report))


if __name__ == "__main__":
    main()

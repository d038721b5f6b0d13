"""Tiers against plain Hugging Face `model.generate` of the same model, in one run.

On the tiny demo model (`manage.py build_base_model`) and its 1-layer draft (`manage.py
build_draft_model`; both are built here when missing), every tier generates a completion for each
item of the demo functions' held-out set (`demo_task_sets(seed=0, heldout_size=160)`), greedy, and:

- its speed: tokens/s (generated tokens over wall time), time to first token, latency p50 / p95
  per request (from the start of the request's batch), peak memory, draft acceptance rate;
- the same for plain `model.generate` (fp32, greedy, the tier's batch size, left padding), and the
  ratios tier / generate: tokens/s and latency p50 (a generate request ends when its batch does);
- the pass rate of the tier's completions, unit tests run in the sandbox (identical completions
  graded once), and how many completions equal generate's token for token.

Timings are medians of `--repeats` runs.

The target is memory-bound by default (`--target wide`): the tiny model widened inside the bench,
its MLPs `--widen` times wider with the new units' weights zero, so it computes exactly the tiny
model's function (the same completions and pass rate) while each decoded token reads tens of MB
of weights, as a real model's does; the bench measures its per-token cost against the draft's
(`cost_ratio`, at least 10 is the point). `--target tiny` measures the tiny model itself.

The headline compares each speed tier with the capability tier **at the same batch size** (batch 1:
latency; batch 16: throughput): tokens/s ratio, latency p50 / p95, and the held-out pass rate
difference in points. Batching alone is not a speed tier.

Run: .venv/bin/python benchmarks/bench_tiers.py [--repeats 3 --heldout 160 --threads 1 --no-grade].
Prints a table, then one line of JSON.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

import django  # noqa: E402

django.setup()

import torch  # noqa: E402
from django.conf import settings as django_settings  # noqa: E402

from inference.decoding import decode, tier_prepare  # noqa: E402
from inference.policy import policy_load  # noqa: E402
from inference.settings import TierSettings  # noqa: E402
from projects.demo_tasks import demo_task_sets  # noqa: E402
from workers.base_model import BaseModelConfig, base_model_build  # noqa: E402
from workers.draft_model import draft_model_build  # noqa: E402
from workers.tier_eval import PeakRss, grade_items, tier_measure  # noqa: E402

CAPABILITY, SPEED = "capability", "speed"
UNMEASURED = {"tokens_per_second": 1.0, "latency_ms_p50": 1.0, "token_ids": []}


SAME_BATCH = {1: CAPABILITY, 16: "b16"}  # the capability tier each speed tier is compared with


def tiers(draft: str, max_new_tokens: int) -> dict[str, TierSettings]:
    """The tiers measured. capability: fp32, one request at a time, greedy, no speculation (a
    server answering each request alone); speed: the same model and decoding, 16 requests per
    batch and a 1-layer draft model proposing 4 tokens per step."""
    base = TierSettings(temperature=0.0, max_new_tokens=max_new_tokens, batch_size=1)
    lookup = {"speculation": "prompt_lookup", "speculative_tokens": 4}
    drafted = {"speculation": "draft_model", "speculative_tokens": 4, "draft_model": draft}
    return {
        CAPABILITY: base.with_(name=CAPABILITY),
        "b1-int8": base.with_(name="b1-int8", precision="int8"),
        "b1-prompt-lookup": base.with_(name="b1-prompt-lookup", **lookup),
        "b1-draft": base.with_(name="b1-draft", **drafted),
        "b16": base.with_(name="b16", batch_size=16),
        "b16-bf16": base.with_(name="b16-bf16", batch_size=16, precision="bf16"),
        "b16-int8": base.with_(name="b16-int8", batch_size=16, precision="int8"),
        "b16-prompt-lookup": base.with_(name="b16-prompt-lookup", batch_size=16, **lookup),
        SPEED: base.with_(name=SPEED, batch_size=16, **drafted),
        "b16-int8-draft": base.with_(name="b16-int8-draft", batch_size=16, precision="int8", **drafted),
    }


def wide_model(tiny: Path, out: Path, widen: int) -> Path:
    """The tiny model with every MLP `widen` times wider, the added units zero: the same function
    (SiLU(0) * 0 adds nothing), many times the weights read per decoded token."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (out / "config.json").exists():
        return out
    small = AutoModelForCausalLM.from_pretrained(tiny)
    config = small.config
    width = config.intermediate_size
    config.intermediate_size = width * widen
    torch.manual_seed(0)
    big = type(small)(config)
    state = big.state_dict()
    for name, value in small.state_dict().items():
        target = state[name]
        target.zero_()
        target[tuple(slice(0, size) for size in value.shape)] = value
    big.load_state_dict(state)
    big.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(out)
    return out


@torch.no_grad()
def decode_cost_ms(model, steps: int = 32, context: int = 32, width: int = 1) -> float:
    """Milliseconds per forward of `width` new tokens at batch 1 with a KV cache (median of
    `steps`): width 1 is a decoded token, width k + 1 a speculative verify step."""
    from transformers import DynamicCache

    times = []
    ids = torch.randint(3, 100, (1, context))
    for _ in range(steps):
        cache = DynamicCache()
        model(input_ids=ids, cache=cache, use_cache=True)
        positions = torch.arange(context, context + width)[None]
        started = time.perf_counter()
        model(input_ids=ids[:, :width], position_ids=positions, cache=cache, use_cache=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def cell(value, width: int, spec: str) -> str:
    """A table cell, '-' where nothing was measured."""
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


def same_batch_headline(report: dict) -> dict:
    """Each speed tier against the capability tier of its batch size."""
    pairs = {}
    for name, row in report.items():
        if row["settings"]["speculation"] == "none" or row["settings"]["precision"] != "fp32":
            continue
        base_name = SAME_BATCH.get(row["settings"]["batch_size"])
        base = report.get(base_name)
        if base is None:
            continue
        delta = None
        if row["pass_rate"] is not None and base["pass_rate"] is not None:
            delta = round(100 * (row["pass_rate"] - base["pass_rate"]), 2)
        pairs[name] = {
            "against": base_name,
            "batch_size": row["settings"]["batch_size"],
            "tokens_per_second_ratio": round(row["tokens_per_second"] / base["tokens_per_second"], 2),
            "latency_ms_p50": [base["latency_ms_p50"], row["latency_ms_p50"]],
            "latency_ms_p95": [base["latency_ms_p95"], row["latency_ms_p95"]],
            "pass_rate_delta_points": delta,
            "acceptance_rate": row["acceptance_rate"],
        }
    return pairs


def ensure_models(model: Path, draft: Path) -> None:
    if not (model / "config.json").exists():
        print(f"building the tiny base model into {model} ...", flush=True)
        base_model_build(model, BaseModelConfig(), log=lambda line: None)
    if not (draft / "config.json").exists():
        print(f"building the draft model into {draft} ...", flush=True)
        draft_model_build(model, draft, log=lambda line: None)


@torch.no_grad()
def hf_generate(model, tokenizer, prompts: list[str], batch_size: int, max_new_tokens: int) -> dict:
    """Plain `model.generate`, greedy, in batches: tokens/s, per-request latency, token ids."""
    eos = tokenizer.eos_token_id
    token_ids, latencies, generated = [], [], 0
    with PeakRss() as memory:
        started = time.perf_counter()
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            batch_started = time.perf_counter()
            encoded = tokenizer(chunk, padding=True, padding_side="left", return_tensors="pt")
            output = model.generate(
                **encoded,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=eos,
            )
            elapsed = time.perf_counter() - batch_started
            for row in output[:, encoded["input_ids"].size(1) :].tolist():
                if eos in row:
                    row = row[: row.index(eos) + 1]
                token_ids.append(row)
                generated += len(row)
                latencies.append(elapsed)
        seconds = time.perf_counter() - started
    return {
        "tokens_per_second": generated / seconds,
        "latency_ms_p50": statistics.median(latencies) * 1000,
        "peak_rss_growth_mb": memory.growth_bytes / 2**20,
        "token_ids": token_ids,
    }


def median_of(runs: list[dict], key: str):
    values = [run[key] for run in runs if run.get(key) is not None]
    return round(statistics.median(values), 2) if values else None


def main() -> None:
    home = Path(django_settings.FLYWHEEL_HOME) / "models"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=home / "tiny-base")
    parser.add_argument("--draft", type=Path, default=home / "tiny-draft")
    parser.add_argument("--heldout", type=int, default=160)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the machine is shared)")
    parser.add_argument("--only", default="", help="comma-separated tier names")
    parser.add_argument("--no-grade", action="store_true", help="skip the sandboxed pass rates")
    parser.add_argument("--target", choices=("wide", "tiny"), default="wide", help="wide: memory-bound")
    parser.add_argument("--widen", type=int, default=64, help="MLP width multiple of the wide target")
    parser.add_argument("--no-generate", action="store_true", help="skip the plain model.generate baseline")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ensure_models(args.model, args.draft)
    tiny = args.model
    if args.target == "wide":
        args.model = wide_model(tiny, tiny.with_name(f"{tiny.name}-wide{args.widen}"), args.widen)
    target = policy_load(args.model).model
    target_ms = decode_cost_ms(target)
    verify_ms = decode_cost_ms(target, width=5)
    draft_ms = decode_cost_ms(policy_load(args.draft).model)
    cost = {
        "target_ms_per_token": round(target_ms, 3),
        "draft_ms_per_token": round(draft_ms, 3),
        "cost_ratio": round(target_ms / draft_ms, 1),
        # 1.0: memory-bound (a 5-token verify costs one decoded token); 5.0: compute-bound.
        "target_verify5_over_decode1": round(verify_ms / target_ms, 2),
        "target_weights_mb": round(
            sum(p.numel() * 4 for p in policy_load(args.model).model.parameters()) / 2**20, 1
        ),
    }
    print(f"target {args.model.name}: {cost}", flush=True)

    items = demo_task_sets(seed=0, train_size=0, heldout_size=args.heldout)["heldout"]
    plain = policy_load(args.model)
    prompts = [plain.prompt_text(item["prompt"]) for item in items]
    chosen = tiers(str(args.draft), args.max_new_tokens)
    if args.only:
        chosen = {name: tier for name, tier in chosen.items() if name in args.only.split(",")}

    baselines: dict[int, list[dict]] = {}
    verdict_cache: dict[tuple[str, str], bool | None] = {}
    report: dict[str, dict] = {}
    print(
        f"{'tier':20s} {'tok/s':>8s} {'generate':>9s} {'ratio':>6s} {'ttft':>7s} {'lat p50':>8s} {'p95':>8s} "
        f"{'gen p50':>8s} {'mem MB':>7s} {'accept':>7s} {'pass':>6s} {'same':>5s}",
        flush=True,
    )
    for name, tier in chosen.items():
        if tier.batch_size not in baselines and args.no_generate:
            baselines[tier.batch_size] = [UNMEASURED]
        elif tier.batch_size not in baselines:
            tier_generate_warm(plain, prompts, tier.batch_size, args.max_new_tokens)
            baselines[tier.batch_size] = [
                hf_generate(plain.model, plain.tokenizer, prompts, tier.batch_size, args.max_new_tokens)
                for _ in range(args.repeats)
            ]
        hf = baselines[tier.batch_size]
        draft = policy_load(args.draft) if tier.speculation == "draft_model" else None
        prepared = tier_prepare(policy_load(args.model), tier, draft=draft)
        decode(prepared, prompts[:2], tier.with_(max_new_tokens=2))  # warm-up
        runs = [tier_measure(prepared, items, grade=False) for _ in range(args.repeats)]
        texts = runs[0]["texts"]
        same = None
        if hf[0] is not UNMEASURED:  # one more pass, for its token ids: only with something to compare
            completions = decode(prepared, prompts, tier)
            same = sum(c.token_ids == ids for c, ids in zip(completions, hf[0]["token_ids"], strict=False))
        pass_rate = None
        if not args.no_grade:
            missing = [i for i, item in enumerate(items) if (item["id"], texts[i]) not in verdict_cache]
            for index, verdict in zip(
                missing, grade_items([items[i] for i in missing], [texts[i] for i in missing]), strict=True
            ):
                verdict_cache[(items[index]["id"], texts[index])] = verdict
            verdicts = [verdict_cache[(item["id"], text)] for item, text in zip(items, texts, strict=True)]
            scored = [v for v in verdicts if v is not None]
            pass_rate = round(sum(scored) / len(scored), 4) if scored else None
        row = {
            "settings": {
                key: getattr(tier, key)
                for key in ("precision", "batch_size", "speculation", "speculative_tokens")
            },
            "tokens_per_second": median_of(runs, "tokens_per_second"),
            "generate_tokens_per_second": median_of(hf, "tokens_per_second"),
            "ttft_ms_p50": median_of(runs, "ttft_ms_p50"),
            "latency_ms_p50": median_of(runs, "latency_ms_p50"),
            "latency_ms_p95": median_of(runs, "latency_ms_p95"),
            "generate_latency_ms_p50": median_of(hf, "latency_ms_p50"),
            "peak_memory_mb": median_of(runs, "peak_memory_mb"),
            "acceptance_rate": runs[0]["acceptance_rate"],
            "target_forwards": runs[0]["target_forwards"],
            "draft_forwards": runs[0]["draft_forwards"],
            "generated_tokens": runs[0]["generated_tokens"],
            "pass_rate": pass_rate,
            "same_as_generate": same,
        }
        if hf[0] is UNMEASURED:  # --no-generate: nothing to divide by
            row |= dict.fromkeys(("generate_tokens_per_second", "generate_latency_ms_p50"))
            row |= {"speedup_vs_generate": None, "latency_ratio_vs_generate": None}
        else:
            row["speedup_vs_generate"] = round(
                row["tokens_per_second"] / row["generate_tokens_per_second"], 3
            )
            row["latency_ratio_vs_generate"] = round(
                row["latency_ms_p50"] / row["generate_latency_ms_p50"], 3
            )
        report[name] = row
        print(
            f"{name:20s} {cell(row['tokens_per_second'], 8, '.1f')} "
            f"{cell(row['generate_tokens_per_second'], 9, '.1f')} "
            f"{cell(row['speedup_vs_generate'], 6, '.2f')} {cell(row['ttft_ms_p50'], 7, '.1f')} "
            f"{cell(row['latency_ms_p50'], 8, '.1f')} {cell(row['latency_ms_p95'], 8, '.1f')} "
            f"{cell(row['generate_latency_ms_p50'], 8, '.1f')} {cell(row['peak_memory_mb'], 7, '.2f')} "
            f"{cell(row['acceptance_rate'], 7, '')} {cell(pass_rate, 6, '')} {cell(same, 5, '')}",
            flush=True,
        )

    headline = {}
    if CAPABILITY in report and SPEED in report:
        cap, fast = report[CAPABILITY], report[SPEED]
        headline = {
            "capability": CAPABILITY,
            "speed": SPEED,
            # Batch 16 against batch 1: batching's gain, shown for reference, not a speed tier's.
            "cross_batch_tokens_per_second_ratio": round(
                fast["tokens_per_second"] / cap["tokens_per_second"], 2
            ),
            "pass_rate_capability": cap["pass_rate"],
            "pass_rate_speed": fast["pass_rate"],
            "pass_rate_delta_points": None
            if cap["pass_rate"] is None or fast["pass_rate"] is None
            else round(100 * (fast["pass_rate"] - cap["pass_rate"]), 2),
        }
        if "b16" in report:
            headline["speed_vs_b16_tokens_per_second_ratio"] = round(
                fast["tokens_per_second"] / report["b16"]["tokens_per_second"], 2
            )
        print(f"\nheadline: {headline}")
    headline["same_batch"] = same_batch_headline(report)
    for name, pair in headline["same_batch"].items():
        print(f"same batch: {name} vs {pair['against']}: {pair}", flush=True)
    summary = {
        "bench": "tiers",
        "model": str(args.model),
        "draft": str(args.draft),
        "items": len(items),
        "repeats": args.repeats,
        "threads": args.threads,
        "max_new_tokens": args.max_new_tokens,
        "target": args.target,
        "decode_cost": cost,
        "headline": headline,
        "tiers": report,
    }
    print(json.dumps(summary, separators=(",", ":")))


def tier_generate_warm(policy, prompts: list[str], batch_size: int, max_new_tokens: int) -> None:
    hf_generate(policy.model, policy.tokenizer, prompts[:batch_size], batch_size, 2)


if __name__ == "__main__":
    main()

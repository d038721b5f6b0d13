"""GRPO learner throughput at equal learning: Flywheel's `train_grpo` against TRL's `GRPOTrainer`.

Like for like, so that the ratio means what it says:

- the same base model `make up` uses (FLYWHEEL_HOME/models/tiny-base, built here with the same
  settings as `manage.py build_base_model` when it is missing, or --model); the bench fails loudly
  when neither learner lifts the base's held-out pass rate (a speed-up where nothing was learned
  counts for nothing);
- the same items, group size, prompts per step, steps, optimiser (AdamW, no weight decay),
  constant learning rate without warm-up, gradient clipping at norm 1, token budget, sampling
  (temperature 1, top-p 1, top-k pinned off on both), loss (token mean = TRL's `bnpo`, which is
  its default `dapo` on one process; clip 0.2 both ways; rewards scaled by the group's std; no KL,
  so no reference model on either side; one optimisation pass per batch, so the old policy's
  log-probs are the current ones on both), seed, and grading: both sides score through
  `workers.rollout`'s sandboxed unit tests, identical completions of an item graded once per batch;
- the same compute per step: TRL's default activation checkpointing (a second forward in the
  backward pass, to save GPU memory) is off, as it is by default in Flywheel;
- the same zero-variance policy: TRL learns from every group, so the headline compares Flywheel
  with `skip_zero_variance_groups` off; Flywheel's default (groups whose rewards are all equal are
  skipped: their advantages are zero) is reported beside it;
- the same device and threads: the CPU on both (CUDA hidden before torch loads), and
  `torch.get_num_threads()` asserted inside both training loops;
- the same timed span: steps 2..N on both (Flywheel's own step clock; a `TrainerCallback` on
  TRL's side), so neither side's set-up or first step is counted;
- the order alternates over repeats, and the figure is the median of the per-repeat ratios, with
  their range.

What differs is each product's own machinery: Flywheel decodes a plain Llama through its lean
decode path (inference/lean_llama.py), lets finished rows leave the batch, prefills a group's
shared prompt once (in generation and in the learner's forward), grades each completion while the
rest of the batch still decodes, and learns in passes of rows of like lengths; TRL runs
`transformers`' `generate`, grades after it, and pads every row to the longest. Both step with
fused AdamW.

Reported per learner: samples/s over the timed span, the learner process's CPU seconds over it
(the ratio a machine nobody else loads would show; wall-clock figures on a shared machine move
with the load, printed beside them), the mean training reward of the last step, and the held-out
pass rate of the final weights (greedy, sandboxed) on every held-out scalar task the base's corpus
left out, per repeat and pooled over repeats with its 95 % interval (training noise between seeds
is larger than that interval: compare the per-repeat figures too). Target: at least 1.5x at equal
or better held-out pass rate, both above the base.

Run: .venv/bin/python benchmarks/bench_learner.py [--steps 20 --group-size 8 --prompts 4 --repeats 3]
Prints a table, then one line of JSON.
"""

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# The CPU on both sides: Accelerate would pick a GPU for Flywheel where TRL is pinned to the CPU.
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ["ACCELERATE_USE_CPU"] = "true"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

import django  # noqa: E402

django.setup()

import torch  # noqa: E402
from django.conf import settings  # noqa: E402

from inference.policy import policy_load  # noqa: E402
from projects.demo_tasks import demo_task_sets  # noqa: E402
from workers.base_model import BaseModelConfig, base_model_build  # noqa: E402
from workers.evaluation import pass_rates  # noqa: E402
from workers.learners.grpo import GRPOConfig, train_grpo  # noqa: E402
from workers.rollout import grade_completions  # noqa: E402

TARGET_RATIO = 1.5
SIDES = ("flywheel", "trl")  # the headline pair; "flywheel_skip" (Flywheel's default) runs beside them


def base_model(path: str | None) -> Path:
    """The base `make up` trains from: --model, else FLYWHEEL_HOME/models/tiny-base, built here
    with `manage.py build_base_model`'s settings when it is missing."""
    if path:
        return Path(path)
    tiny_base = Path(settings.FLYWHEEL_HOME) / "models" / "tiny-base"
    if not (tiny_base / "config.json").exists():
        print(
            f"building the tiny base model into {tiny_base} (as manage.py build_base_model does)", flush=True
        )
        base_model_build(tiny_base, BaseModelConfig(), log=lambda line: None)
    return tiny_base


def threads_checked(expected: int) -> None:
    found = torch.get_num_threads()
    if found != expected:
        raise RuntimeError(f"the training loop runs on {found} torch threads, not {expected}")


def samples_per_s(args, seconds: float) -> float:
    """Samples over the timed span: steps 2..N."""
    return (args.steps - 1) * args.prompts * args.group_size / seconds


def run_flywheel(model: Path, items: list[dict], args, out: Path, *, skip_zero_variance: bool) -> dict:
    config = GRPOConfig(
        model=str(model),
        output_dir=str(out),
        seed=args.seed,
        steps=args.steps,
        learning_rate=args.learning_rate,
        lr_scheduler="constant",
        group_size=args.group_size,
        prompts_per_step=args.prompts,
        max_new_tokens=args.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        loss_aggregation="token_mean",
        skip_zero_variance_groups=skip_zero_variance,
        log_every=1,
    )
    cpu_ends: list[float] = []

    def step_logged(line: str) -> None:  # logged at the end of every step (log_every=1)
        threads_checked(args.threads)
        cpu_ends.append(time.process_time())

    result = train_grpo(config, items, log=step_logged)
    history = result.history
    seconds = history[-1]["seconds"] - history[0]["seconds"]  # from the end of step 1 to the end
    learned = sum(step["learned"] for step in history) / len(history)
    return {
        "seconds": seconds,
        "samples_per_s": samples_per_s(args, seconds),
        "cpu_seconds": cpu_ends[-1] - cpu_ends[0],
        "last_reward": history[-1]["reward"],
        "learned_per_step": learned,
        "final": out / "final",
    }


def run_trl(model: Path, items: list[dict], args, out: Path) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig as TRLGRPOConfig
    from trl import GRPOTrainer

    by_id = {item["id"]: item for item in items}
    rewards_seen: list[list[float]] = []
    step_ends: list[float] = []
    cpu_ends: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, args_, state, control, **kwargs):
            threads_checked(args.threads)
            step_ends.append(time.monotonic())
            cpu_ends.append(time.process_time())

    def unit_tests_reward(completions, item_id, **kwargs) -> list[float]:
        """Flywheel's own grading: sandboxed unit tests, identical completions graded once."""
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        grades = grade_completions([by_id[key] for key in item_id], texts)
        rewards = [grade.reward or 0.0 for grade in grades]
        rewards_seen.append(rewards)
        return rewards

    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": item["prompt"]}], "item_id": item["id"]} for item in items]
    )
    trl_args = TRLGRPOConfig(
        output_dir=str(out),
        seed=args.seed,
        max_steps=args.steps,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        # TRL turns activation checkpointing on by default (to save GPU memory); Flywheel's default
        # is off. Recomputing activations costs a second forward, so leaving TRL's default would
        # slow it for nothing on this model: both run without.
        gradient_checkpointing=False,
        per_device_train_batch_size=args.prompts * args.group_size,
        gradient_accumulation_steps=1,
        num_generations=args.group_size,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        loss_type="bnpo",
        scale_rewards="group",
        num_iterations=1,
        use_vllm=False,
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=str(model),
        reward_funcs=unit_tests_reward,
        args=trl_args,
        train_dataset=dataset,
        callbacks=[StepClock()],
    )
    trainer.train()
    trainer.save_model(str(out / "final"))
    trainer.processing_class.save_pretrained(str(out / "final"))
    seconds = step_ends[-1] - step_ends[0]
    last = rewards_seen[-1]
    return {
        "seconds": seconds,
        "samples_per_s": samples_per_s(args, seconds),
        "cpu_seconds": cpu_ends[-1] - cpu_ends[0],
        "last_reward": sum(last) / len(last),
        "learned_per_step": float(args.prompts * args.group_size),
        "final": out / "final",
    }


def one_repeat(repeat: int, model: Path, items: list[dict], heldout: list[dict], args, scratch: Path) -> dict:
    seeded = argparse.Namespace(**vars(args) | {"seed": args.seed + repeat})
    runners = {
        "flywheel": lambda out: run_flywheel(model, items, seeded, out, skip_zero_variance=False),
        "trl": lambda out: run_trl(model, items, seeded, out),
        "flywheel_skip": lambda out: run_flywheel(model, items, seeded, out, skip_zero_variance=True),
    }
    order = list(runners) if repeat % 2 == 0 else ["trl", "flywheel", "flywheel_skip"]
    figures = {}
    for name in order:
        print(f"repeat {repeat + 1}: {name}", flush=True)
        found = runners[name](scratch / f"{name}-{repeat}")
        rates = pass_rates(policy_load(found.pop("final")), heldout)
        found["heldout_pass_rate"] = rates.overall
        found["heldout_passed"] = round(rates.overall * rates.count)
        found["heldout_count"] = rates.count
        figures[name] = found
        print(
            f"repeat {repeat + 1}: {name}: {found['samples_per_s']:.2f} samples/s, "
            f"{found['cpu_seconds']:.2f} s of learner-process CPU, held-out {found['heldout_pass_rate']:.3f}",
            flush=True,
        )
    return figures


def wilson_interval(passed: int, count: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of a pass rate.

    >>> [round(bound, 3) for bound in wilson_interval(60, 80)]
    [0.645, 0.832]
    """
    if count == 0:
        return 0.0, 1.0
    rate = passed / count
    centre = (rate + z * z / (2 * count)) / (1 + z * z / count)
    half = z * math.sqrt(rate * (1 - rate) / count + z * z / (4 * count * count)) / (1 + z * z / count)
    return max(0.0, centre - half), min(1.0, centre + half)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model", default=None, help="a base model folder (default: the tiny base make up uses)"
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--heldout",
        type=int,
        default=BaseModelConfig.heldout_size,
        help="the held-out split's size (half of it scalar items, the ones evaluated); the default is "
        "every task the base model's corpus left out",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs with seeds seed..seed+N-1, order alternated"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the same for both learners)")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]  # other processes share the CPU: reported beside the figures
    torch.set_num_threads(args.threads)
    sets = demo_task_sets(seed=0, train_size=100_000, heldout_size=args.heldout, kinds=("scalar",))
    heldout = [item for item in sets["heldout"] if item["metadata"]["family"] == "scalar"]
    model = base_model(args.model)
    base_rate = pass_rates(policy_load(model), heldout).overall
    with tempfile.TemporaryDirectory(prefix="bench-learner-") as scratch:
        repeats = [
            one_repeat(r, model, sets["train"], heldout, args, Path(scratch)) for r in range(args.repeats)
        ]
    names = list(repeats[0])
    medians = {
        name: {key: round(statistics.median(r[name][key] for r in repeats), 4) for key in repeats[0][name]}
        for name in names
    }
    ratios = sorted(r["flywheel"]["samples_per_s"] / r["trl"]["samples_per_s"] for r in repeats)
    skip_ratios = sorted(r["flywheel_skip"]["samples_per_s"] / r["trl"]["samples_per_s"] for r in repeats)
    ratio = statistics.median(ratios)
    # The learner process's own CPU over the same span (the sandboxes grade in other processes,
    # the same work on both sides): what the ratio is on a machine no one else loads.
    cpu_ratios = sorted(r["trl"]["cpu_seconds"] / r["flywheel"]["cpu_seconds"] for r in repeats)
    header = ("learner", "samples/s", "seconds", "last reward", "held-out", "learned/step")
    print("{:14} {:>10} {:>8} {:>12} {:>9} {:>13}".format(*header))
    for name, f in medians.items():
        row = (
            name,
            f["samples_per_s"],
            f["seconds"],
            f["last_reward"],
            f["heldout_pass_rate"],
            f["learned_per_step"],
        )
        print("{:14} {:10.2f} {:8.1f} {:12.3f} {:9.3f} {:13.1f}".format(*row))
    # Every repeat's held-out verdicts pooled, with the 95 % interval of the pooled rate: how far
    # apart two held-out figures must be before the difference means anything.
    pooled = {}
    for name in names:
        passed = sum(r[name]["heldout_passed"] for r in repeats)
        count = sum(r[name]["heldout_count"] for r in repeats)
        low, high = wilson_interval(passed, count)
        pooled[name] = {"rate": round(passed / max(1, count), 4), "ci95": [round(low, 3), round(high, 3)]}
        print(
            f"{name:14} held-out pooled over repeats {passed}/{count} = {passed / max(1, count):.3f} "
            f"(95% interval {low:.3f}-{high:.3f})"
        )
    base_low, base_high = wilson_interval(round(base_rate * len(heldout)), len(heldout))
    learned = {name: medians[name]["heldout_pass_rate"] > base_rate for name in names}
    skip_ratio = statistics.median(skip_ratios)
    print(
        f"base held-out {base_rate:.3f}; samples/s ratio {ratio:.2f}x "
        f"(per repeat {ratios[0]:.2f}-{ratios[-1]:.2f}; target {TARGET_RATIO}x); "
        f"Flywheel's default (zero-variance groups skipped) {skip_ratio:.2f}x"
    )
    report = {
        "bench": "learner",
        "model": str(model),
        "steps": args.steps,
        "timed_steps": f"2..{args.steps}",
        "group_size": args.group_size,
        "prompts_per_step": args.prompts,
        "learning_rate": args.learning_rate,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
        "repeats": args.repeats,
        "threads": args.threads,
        "device": "cpu",
        "heldout_items": len(heldout),
        "base_heldout_pass_rate": round(base_rate, 4),
        "base_heldout_ci95": [round(base_low, 3), round(base_high, 3)],
        **{f"{name}_heldout_pooled": figures["rate"] for name, figures in pooled.items()},
        **{f"{name}_heldout_pooled_ci95": figures["ci95"] for name, figures in pooled.items()},
        **{f"{name}_{key}": value for name, figures in medians.items() for key, value in figures.items()},
        "throughput_ratio": round(ratio, 2),
        "throughput_ratio_range": [round(ratios[0], 2), round(ratios[-1], 2)],
        "skip_zero_variance_ratio": round(skip_ratio, 2),
        "cpu_ratio": round(statistics.median(cpu_ratios), 2),
        "cpu_ratio_range": [round(cpu_ratios[0], 2), round(cpu_ratios[-1], 2)],
        "per_repeat": [
            {
                name: {"samples_per_s": round(f["samples_per_s"], 2), "heldout": f["heldout_pass_rate"]}
                for name, f in r.items()
            }
            for r in repeats
        ],
        "load_average_start_end": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio >= TARGET_RATIO
        and medians["flywheel"]["heldout_pass_rate"] >= medians["trl"]["heldout_pass_rate"]
        and learned["flywheel"]
        and learned["trl"],
    }
    print(json.dumps(report))
    if not any(learned.values()):
        raise SystemExit(
            f"no learner lifted the base's held-out pass rate ({base_rate:.3f}): the throughput figures "
            "above measure nothing learned; use a base that learns on this task (--model)"
        )


if __name__ == "__main__":
    main()

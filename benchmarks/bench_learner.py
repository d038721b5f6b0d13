"""GRPO learner throughput and reward: Flywheel's `train_grpo` against TRL's `GRPOTrainer`, one run.

Both train the same tiny base model (FLYWHEEL_HOME/models/tiny-base, else --model, else a small
one built here) on the demo task family's scalar items with the same group size, prompts per
step, steps, learning rate, token budget, temperature, loss (token mean = TRL's `bnpo`, no KL)
and seed, and both are rewarded by the same sandboxed unit tests (`rewards.engine.score_batch`
with the `unit_tests` grader). TRL runs on CPU without vLLM.

Reported per learner: samples/s (completions sampled, scored and learned from, over the training
loop's wall time: model loading and the final save are outside it for both), the mean training
reward of the last step, and the held-out pass rate of the final weights (greedy, sandboxed);
then Flywheel's throughput over TRL's. Target: at least 1.5x at equal or better reward. With
--repeats N every figure is the median of N runs (seeds seed, seed+1, ...).

Run: .venv/bin/python benchmarks/bench_learner.py [--steps 20 --group-size 8 --prompts 4 --repeats 3]
Prints a table, then one line of JSON.
"""

import argparse
import json
import os
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
from django.conf import settings  # noqa: E402

from inference.policy import policy_load  # noqa: E402
from rewards.engine import Sample, score_batch  # noqa: E402
from runs.demo_tasks import demo_task_sets  # noqa: E402
from workers.base_model import BaseModelConfig, base_model_build  # noqa: E402
from workers.evaluation import pass_rates  # noqa: E402
from workers.learners.grpo import GRPOConfig, train_grpo  # noqa: E402
from workers.rollout import UNIT_TESTS_RULE  # noqa: E402

TARGET_RATIO = 1.5
SMALL = BaseModelConfig(steps=300, hidden_size=96, layers=2, corpus_size=6000)  # when no tiny-base exists


def base_model(path: str | None, scratch: Path) -> Path:
    for candidate in (path, Path(settings.FLYWHEEL_HOME) / "models" / "tiny-base"):
        if candidate and (Path(candidate) / "config.json").exists():
            return Path(candidate)
    print("no tiny-base model found: building a small one (manage.py build_base_model builds the real one)")
    base_model_build(scratch / "base", SMALL, log=lambda line: None)
    return scratch / "base"


def run_flywheel(model: Path, items: list[dict], args, out: Path) -> dict:
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
        loss_aggregation="token_mean",
        log_every=10**6,
    )
    result = train_grpo(config, items, log=lambda line: None)
    # The training loop's own time, as TRL's `trainer.train()` is timed: TRL loads its model in
    # the trainer's constructor and saves after, both outside the timed call; so here too.
    seconds = result.history[-1]["seconds"]
    return {"seconds": seconds, "last_reward": result.history[-1]["reward"], "final": out / "final"}


def run_trl(model: Path, items: list[dict], args, out: Path) -> dict:
    from datasets import Dataset
    from trl import GRPOConfig as TRLGRPOConfig
    from trl import GRPOTrainer

    by_id = {item["id"]: item for item in items}
    rewards_seen: list[list[float]] = []

    def unit_tests_reward(completions, item_id, **kwargs) -> list[float]:
        """The same sandboxed unit-tests grader Flywheel's rollouts use."""
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        pairs = [(by_id[key], Sample(output_text=text)) for key, text in zip(item_id, texts, strict=True)]
        rewards = [result.total or 0.0 for result in score_batch(UNIT_TESTS_RULE, pairs)]
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
        per_device_train_batch_size=args.prompts * args.group_size,
        gradient_accumulation_steps=1,
        num_generations=args.group_size,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
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
        model=str(model), reward_funcs=unit_tests_reward, args=trl_args, train_dataset=dataset
    )
    started = time.monotonic()
    trainer.train()
    seconds = time.monotonic() - started
    trainer.save_model(str(out / "final"))
    trainer.processing_class.save_pretrained(str(out / "final"))
    last = rewards_seen[-1]
    return {"seconds": seconds, "last_reward": sum(last) / len(last), "final": out / "final"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heldout", type=int, default=80)
    parser.add_argument("--repeats", type=int, default=3, help="runs with seeds seed..seed+N-1")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the same for both learners)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sets = demo_task_sets(seed=0, train_size=100_000, heldout_size=args.heldout, kinds=("scalar",))
    heldout = [item for item in sets["heldout"] if item["metadata"]["family"] == "scalar"]
    runs: dict[str, list[dict]] = {"flywheel": [], "trl": []}
    with tempfile.TemporaryDirectory(prefix="bench-learner-") as scratch:
        model = base_model(args.model, Path(scratch))
        base_rate = pass_rates(policy_load(model), heldout).overall
        for repeat in range(args.repeats):
            for name, run in (("flywheel", run_flywheel), ("trl", run_trl)):
                seeded = argparse.Namespace(**vars(args) | {"seed": args.seed + repeat})
                figures = run(model, sets["train"], seeded, Path(scratch) / f"{name}-{repeat}")
                figures["heldout_pass_rate"] = pass_rates(policy_load(figures.pop("final")), heldout).overall
                figures["samples_per_s"] = args.steps * args.prompts * args.group_size / figures["seconds"]
                runs[name].append(figures)
    medians = {
        name: {key: round(statistics.median(run[key] for run in found), 4) for key in found[0]}
        for name, found in runs.items()
    }
    ratio = medians["flywheel"]["samples_per_s"] / medians["trl"]["samples_per_s"]
    print(f"{'learner':10} {'samples/s':>10} {'seconds':>8} {'last reward':>12} {'held-out pass':>14}")
    for name, figures in medians.items():
        print(
            f"{name:10} {figures['samples_per_s']:10.2f} {figures['seconds']:8.1f} "
            f"{figures['last_reward']:12.3f} {figures['heldout_pass_rate']:14.3f}"
        )
    print(f"base held-out pass rate {base_rate:.3f}; throughput ratio {ratio:.2f}x (target {TARGET_RATIO}x)")
    report = {
        "model": str(model),
        "steps": args.steps,
        "group_size": args.group_size,
        "prompts_per_step": args.prompts,
        "learning_rate": args.learning_rate,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
        "repeats": args.repeats,
        "threads": args.threads,
        "base_heldout_pass_rate": round(base_rate, 4),
        **{f"{name}_{key}": value for name, figures in medians.items() for key, value in figures.items()},
        "throughput_ratio": round(ratio, 2),
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio >= TARGET_RATIO
        and medians["flywheel"]["heldout_pass_rate"] >= medians["trl"]["heldout_pass_rate"],
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()

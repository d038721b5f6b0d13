"""Learner throughput on 2 processes (`accelerate launch`, DDP) against 1, at the same global batch.

Both sides run Flywheel's own GRPO step (`learn_on_batch` on each rank's share, as a run's learner
does under workers/learner_group.py) on the same synthetic batch: one process accumulates 2
micro-batches, two processes take one each and DDP averages their gradients. The model is a small
random Llama (no download), each process one torch thread, the CPU (gloo) on both. The first step
is not timed. Reported: samples/s (rows of the batch × timed steps / seconds) of each side and the
median of the per-repeat ratios (the order alternates); goal at least 1.6x. Other load on the
machine counts against both sides alike only when it is steady: say how loaded the machine was.

Run: .venv/bin/python benchmarks/bench_learner_processes.py [--steps 8 --rows 32 --hidden 192]
Prints a table, then one line of JSON.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 1.6


def worker(args) -> None:
    """One rank (or the only process): time `learn_on_batch` on its share of the batch."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    import torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from transformers import LlamaConfig, LlamaForCausalLM, get_scheduler

    from inference.generation import Completion
    from workers.learner_group import _share, group_init
    from workers.learners.common import Learner, TrainState
    from workers.learners.grpo import GRPOConfig, grpo_batch, learn_on_batch
    from workers.rollout import Trajectory

    torch.set_num_threads(1)
    group_init()
    accelerator = Accelerator(gradient_accumulation_steps=args.accumulation, cpu=True)
    set_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
    )
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scheduler = get_scheduler("constant", optimizer)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    learner = Learner(accelerator, model, None, optimizer, scheduler, TrainState())
    generator = torch.Generator().manual_seed(1)
    episodes = []
    for row in range(args.rows):
        prompt = torch.randint(3, 512, (24,), generator=generator).tolist()
        tokens = torch.randint(3, 512, (32,), generator=generator).tolist()
        completion = Completion("", tokens, [-6.0] * len(tokens), "length", prompt_token_ids=prompt)
        episodes.append(
            Trajectory(
                item_index=row // 4,
                completion=completion,
                reward=float(row % 2),
                outcome="scored",
                policy_version=0,
                passed=bool(row % 2),
            )
        )
    advantages = torch.tensor([1.0 if row % 2 else -1.0 for row in range(args.rows)])
    batch = _share(accelerator, grpo_batch(episodes, list(range(args.rows)), advantages, 0))
    grpo = GRPOConfig(model="", output_dir="", gradient_accumulation_steps=args.accumulation)
    learner.model.train()
    learn_on_batch(learner, batch, grpo, None)  # the first step: not timed
    accelerator.wait_for_everyone()
    started = time.perf_counter()
    for _ in range(args.steps):
        learn_on_batch(learner, batch, grpo, None)
    accelerator.wait_for_everyone()
    seconds = time.perf_counter() - started
    if accelerator.is_main_process:
        print(json.dumps({"seconds": seconds, "samples_per_s": args.rows * args.steps / seconds}), flush=True)


def side(args, processes: int) -> dict:
    common = ["--worker", "--steps", str(args.steps), "--rows", str(args.rows)]
    common += ["--hidden", str(args.hidden), "--layers", str(args.layers)]
    script = str(Path(__file__).resolve())
    if processes == 1:
        argv = [sys.executable, script, *common, "--accumulation", "2"]
    else:
        argv = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
        argv += [str(ROOT / "deploy" / "accelerate" / "ddp.yaml"), "--num_processes", str(processes)]
        argv += ["--main_process_port", "29531", script, *common, "--accumulation", "1"]
    env = os.environ | {"ACCELERATE_USE_CPU": "true", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    output = subprocess.run(argv, cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads([line for line in output.splitlines() if line.startswith("{")][-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--accumulation", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=8, help="timed optimiser steps")
    parser.add_argument("--rows", type=int, default=32, help="rows (episodes) of the global batch")
    parser.add_argument("--hidden", type=int, default=192)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="alternated repeats; the median ratio")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    print(f"{'repeat':<8}{'learner':<22}{'samples/s':>12}{'seconds':>10}")
    ratios, ones, twos = [], [], []
    for repeat in range(args.repeats):
        order = (1, 2) if repeat % 2 == 0 else (2, 1)  # alternated: a drift in load hits both sides
        result = {processes: side(args, processes) for processes in order}
        one, two = result[1], result[2]
        ones.append(one["samples_per_s"])
        twos.append(two["samples_per_s"])
        ratios.append(two["samples_per_s"] / one["samples_per_s"])
        print(f"{repeat:<8}{'1 process (accum 2)':<22}{one['samples_per_s']:>12.1f}{one['seconds']:>10.2f}")
        print(f"{repeat:<8}{'2 processes (DDP)':<22}{two['samples_per_s']:>12.1f}{two['seconds']:>10.2f}")
    ratio = statistics.median(ratios)
    load = os.getloadavg()[0]
    print(f"median ratio {ratio:.2f}x (range {min(ratios):.2f}-{max(ratios):.2f}x; goal {TARGET_RATIO}x)")
    print(f"load average {load:.1f} on {os.cpu_count()} cores")
    result = {
        "bench": "learner_processes",
        "samples_per_s_1": round(statistics.median(ones), 2),
        "samples_per_s_2": round(statistics.median(twos), 2),
        "ratio": round(ratio, 3),
        "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
        "goal": TARGET_RATIO,
        "load_average": round(load, 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

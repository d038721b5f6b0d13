"""Learner throughput on 2 processes (`accelerate launch`, DDP) against 1, at the same global batch
and the same total torch threads.

Both sides run Flywheel's own GRPO step (`learn_on_batch` on each rank's share, as a run's learner
does under workers/learner_group.py) on the same synthetic batch: one process accumulates 2
micro-batches, two processes take one each and DDP averages their gradients. The model is a small
random Llama (no download), on the CPU (gloo) on both sides. Threads are equal in total: the two
processes take one torch thread each, the one process two (torch's intra-op threads, waiting
passively: OMP_WAIT_POLICY=PASSIVE on both sides), so the baseline may use the same cores as the
pair, and the ratio is what splitting into processes gives over threading one process, not over
a process held to one core.

A learner's speed counts only where it learned: both sides start from the same weights (one
seed) and take the same steps on the same batch, so they must end at the same weights. Each side
writes its final weights; reported are how far each moved from the start and how far the two
ended apart, relative to that move (float-tolerance apart when the two learned the same thing;
`learned_alike` false says they did not, and then the ratio means nothing).

The first step is not timed. Reported: samples/s (rows of the batch × timed steps / seconds) of
each side and the median of the per-repeat ratios (the order alternates); goal at least 1.6x.
Other load on the machine counts against both sides alike only when it is steady: say how loaded
the machine was.

Run: .venv/bin/python benchmarks/bench_learner_processes.py [--steps 8 --rows 32 --hidden 192]
Prints a table, then one line of JSON.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 1.6
PROCESSES = 2  # the pair; the baseline is one process with as many threads
# The two sides' final weights may differ by float reordering (DDP's all-reduce, 2 threads'
# reductions) and nothing more: far less than a thousandth of what the steps moved them.
ALIKE_TOLERANCE = 1e-3


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

    torch.set_num_threads(args.threads)
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
    if accelerator.is_main_process:
        torch.save(flat_weights(accelerator.unwrap_model(learner.model)), f"{args.weights}.start")
    learn_on_batch(learner, batch, grpo, None)  # the first step: not timed
    accelerator.wait_for_everyone()
    started = time.perf_counter()
    for _ in range(args.steps):
        learn_on_batch(learner, batch, grpo, None)
    accelerator.wait_for_everyone()
    seconds = time.perf_counter() - started
    if accelerator.is_main_process:
        torch.save(flat_weights(accelerator.unwrap_model(learner.model)), f"{args.weights}.end")
        rate = args.rows * args.steps / seconds
        print(json.dumps({"seconds": seconds, "samples_per_s": rate, "threads": torch.get_num_threads()}))


def flat_weights(model):
    """Every parameter in one float64 vector, in the model's own order."""
    import torch

    return torch.cat([p.detach().double().flatten() for p in model.parameters()])


def learned(one: str, two: str) -> dict:
    """How far each side's weights moved from the start, and how far apart the two ended,
    relative to the larger move."""
    import torch

    start = torch.load(f"{one}.start")
    if not torch.equal(start, torch.load(f"{two}.start")):
        raise RuntimeError("the two sides did not start from the same weights")
    end_one, end_two = torch.load(f"{one}.end"), torch.load(f"{two}.end")
    moved_one, moved_two = (end_one - start).norm().item(), (end_two - start).norm().item()
    apart = (end_one - end_two).norm().item() / max(moved_one, moved_two, 1e-30)
    return {"moved_1": moved_one, "moved_2": moved_two, "apart": apart}


def side(args, processes: int, weights: str) -> dict:
    """One side's run: `processes` processes whose torch threads add up to PROCESSES."""
    threads = PROCESSES // processes
    common = ["--worker", "--steps", str(args.steps), "--rows", str(args.rows), "--weights", weights]
    common += ["--hidden", str(args.hidden), "--layers", str(args.layers), "--threads", str(threads)]
    script = str(Path(__file__).resolve())
    if processes == 1:
        argv = [sys.executable, script, *common, "--accumulation", str(PROCESSES)]
    else:
        argv = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
        argv += [str(ROOT / "deploy" / "accelerate" / "ddp.yaml"), "--num_processes", str(processes)]
        argv += ["--main_process_port", "29531", script, *common, "--accumulation", "1"]
    env = os.environ | {"ACCELERATE_USE_CPU": "true", "CUDA_VISIBLE_DEVICES": ""}
    env["OMP_NUM_THREADS"] = str(threads)
    # Threads that wait by sleeping, not spinning, on both sides: with other jobs on the cores, a
    # spinning OpenMP thread burns the slice its partner needs (the 2-thread process measured 6x
    # slower at load 3 with OpenMP's default). One-thread ranks have no one to wait for.
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    output = subprocess.run(argv, cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout
    result = json.loads([line for line in output.splitlines() if line.startswith("{")][-1])
    if result["threads"] != threads:  # torch would not take the threads asked: not like for like
        raise RuntimeError(f"{processes} process(es) ran {result['threads']} torch threads, not {threads}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--accumulation", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--weights", default="", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=8, help="timed optimiser steps")
    parser.add_argument("--rows", type=int, default=32, help="rows (episodes) of the global batch")
    parser.add_argument("--hidden", type=int, default=192)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="alternated repeats; the median ratio")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    print(f"{'repeat':<8}{'learner':<30}{'samples/s':>12}{'seconds':>10}")
    ratios, ones, twos, aparts, moves = [], [], [], [], []
    loads = [os.getloadavg()[0]]
    folder = Path(tempfile.mkdtemp(prefix="bench-learner-processes-"))
    for repeat in range(args.repeats):
        order = (1, 2) if repeat % 2 == 0 else (2, 1)  # alternated: a drift in load hits both sides
        weights = {processes: str(folder / f"{repeat}-{processes}") for processes in order}
        result = {processes: side(args, processes, weights[processes]) for processes in order}
        one, two = result[1], result[2]
        alike = learned(weights[1], weights[2])
        ones.append(one["samples_per_s"])
        twos.append(two["samples_per_s"])
        ratios.append(two["samples_per_s"] / one["samples_per_s"])
        aparts.append(alike["apart"])
        moves.append(min(alike["moved_1"], alike["moved_2"]))
        loads.append(os.getloadavg()[0])
        for label, run in ((f"1 process x {PROCESSES} threads", one), ("2 processes x 1 thread (DDP)", two)):
            print(f"{repeat:<8}{label:<30}{run['samples_per_s']:>12.1f}{run['seconds']:>10.2f}")
        moved = f"{alike['moved_1']:.4g} and {alike['moved_2']:.4g}"
        print(f"{'':<8}weights moved {moved}, ended {alike['apart']:.2g} apart")
    ratio = statistics.median(ratios)
    learned_alike = max(aparts) < ALIKE_TOLERANCE and min(moves) > 0
    print(f"median ratio {ratio:.2f}x (range {min(ratios):.2f}-{max(ratios):.2f}x; goal {TARGET_RATIO}x)")
    print(f"learned alike: {learned_alike} (largest relative gap {max(aparts):.2g})")
    print(f"load average {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores")
    result = {
        "bench": "learner_processes",
        "baseline": f"1 process x {PROCESSES} torch threads (accumulating {PROCESSES}, passive OpenMP waits)",
        "peer": f"{PROCESSES} processes x 1 torch thread (DDP, gloo)",
        "samples_per_s_1": round(statistics.median(ones), 2),
        "samples_per_s_2": round(statistics.median(twos), 2),
        "ratio": round(ratio, 3),
        "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
        "goal": TARGET_RATIO,
        "learned_alike": learned_alike,
        "weights_apart_max": float(f"{max(aparts):.2g}"),
        "weights_moved_min": float(f"{min(moves):.4g}"),
        "load_average": [round(min(loads), 1), round(max(loads), 1)],
        "cores": os.cpu_count(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

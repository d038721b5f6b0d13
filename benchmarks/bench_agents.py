"""Agent episodes, long context: cache reuse across turns against re-encoding each turn, and the
learner's episode-as-one-sequence against a row per turn.

Both sides in the same run, on the same model, episodes and settings:

- generation: 8 episodes of 8 turns, played together (one batch) by `inference.sessions.ChatSessions`;
  each turn answers (8 new tokens at most, temperature 1) and gets a tool result of 24 lines
  (~240 tokens: a file, a test log), the shape of agent work where tool output dominates. With
  reuse a turn encodes only its new tokens into the episode's cache; without, it encodes the whole
  conversation again. Figure: generated tokens per second of wall time (CPU seconds and the
  prompts' tokens encoded are reported beside it). When answers are long and results short, the
  decode steps dominate both sides and the gap narrows (16 tokens and 12-line results: ~1x);
- learning: the same episodes (those reuse played), one GRPO forward and backward pass (token_mean
  loss) over the batch in micro-batches of 2 episodes, as one sequence per episode against one row
  per turn; figure: episodes (samples) per second; the two compute the same log-probs and
  gradients (tests/test_agent_reuse.py).

The model is the tiny base model's architecture (FLYWHEEL_HOME/models/tiny-base if it was built,
else one built here with a short pretraining: the speed does not depend on what it learned).
Targets: at least 2x on both. Each figure is the median of `--repeats` alternating repeats.
Torch runs with `--threads` (default `FLYWHEEL_TORCH_THREADS`, 1: what each rollout worker and
learner gives torch); on a shared host more threads wait on each other at every small operation,
which slows both sides and hides the difference (`--threads 0`: torch's default, one per core).

Run: .venv/bin/python benchmarks/bench_agents.py [--episodes 8 --turns 8 --repeats 3 --threads 1]
Prints a table, then one line of JSON.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ["CUDA_VISIBLE_DEVICES"] = ""
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

import django  # noqa: E402

django.setup()

import torch  # noqa: E402
from django.conf import settings  # noqa: E402

from inference.policy import policy_load  # noqa: E402
from inference.sessions import ChatSessions  # noqa: E402
from inference.settings import SamplingParams  # noqa: E402
from workers.agent import plain_render  # noqa: E402
from workers.base_model import BaseModelConfig, base_model_build  # noqa: E402
from workers.learners.common import completion_logprobs  # noqa: E402
from workers.learners.grpo import grpo_batch, grpo_loss  # noqa: E402
from workers.rollout import Trajectory  # noqa: E402

TOOL_OUTPUT = "line {n}: value {v} ok\n"  # ~10 tokens a line


def model_path(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    built = Path(settings.FLYWHEEL_HOME) / "models" / "tiny-base"
    if (built / "config.json").exists():
        return built
    path = Path(tempfile.mkdtemp()) / "tiny-base"
    base_model_build(path, replace(BaseModelConfig(), steps=30), log=lambda line: None)
    return path


def play(
    policy, *, episodes: int, turns: int, reuse: bool, seed: int, lines: int = 24, new_tokens: int = 8
) -> tuple[float, list, object]:
    """Play the episodes; (seconds, each episode's completions, the session's stats)."""
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, top_p=1.0, top_k=0)
    sessions = ChatSessions(
        policy.model, policy.tokenizer, params, reuse=reuse, generator=torch.Generator().manual_seed(seed)
    )
    messages = [
        [{"role": "user", "content": f"Task {n}: fix the module and run its tests."}] for n in range(episodes)
    ]
    played: list[list] = [[] for _ in range(episodes)]
    keys = list(range(episodes))
    started, cpu = time.perf_counter(), time.process_time()
    for turn in range(turns):
        prompts = [plain_render(messages[key], []) for key in keys]
        for key, completion in zip(keys, sessions.turn(keys, prompts), strict=True):
            played[key].append(completion)
            output = "".join(
                TOOL_OUTPUT.format(n=line, v=key * 100 + turn * 10 + line) for line in range(lines)
            )
            messages[key] += [
                {"role": "assistant", "content": completion.text, "raw": completion.text},
                {"role": "tool", "name": "shell", "content": output},
            ]
    sessions.stats.cpu_seconds = time.process_time() - cpu
    return time.perf_counter() - started, played, sessions.stats


def learn_seconds(policy, played: list, *, as_sequences: bool, micro: int = 2) -> tuple[float, int]:
    """One forward and backward pass over the batch, `micro` episodes at a time (gradients
    accumulate, as the learner's micro-batches do); (seconds, rows)."""
    trajectories = [
        Trajectory(index, turns[-1], float(index % 2), "scored", 0, False, turns=turns)
        for index, turns in enumerate(played)
    ]
    advantages = torch.tensor([1.0 if index % 2 else -1.0 for index in range(len(played))])
    policy.model.train()
    rows = 0
    started = time.perf_counter()
    for first in range(0, len(played), micro):
        batch = grpo_batch(
            trajectories,
            list(range(first, min(first + micro, len(played)))),
            advantages,
            policy.tokenizer.pad_token_id,
            episodes_as_sequences=as_sequences,
        )
        logprobs, mask = completion_logprobs(policy.model, batch.sequences)
        loss, _ = grpo_loss(logprobs, batch.old_logprobs, batch.advantages, mask, aggregation="token_mean")
        loss.backward()
        rows += int(batch.sequences.input_ids.shape[0])
    seconds = time.perf_counter() - started
    policy.model.zero_grad(set_to_none=True)
    policy.model.eval()
    return seconds, rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model")
    parser.add_argument(
        "--threads", type=int, default=settings.FLYWHEEL_TORCH_THREADS, help="torch threads (0: one per core)"
    )
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    policy = policy_load(model_path(args.model))
    policy.model.config.max_position_embeddings = 4096  # RoPE: 8 turns outgrow the base's 256
    threads = torch.get_num_threads()
    play(policy, episodes=2, turns=2, reuse=True, seed=99)  # warm-up, untimed
    generation = {True: [], False: []}
    learning = {True: [], False: []}
    stats = {}
    for repeat in range(args.repeats):
        for reuse in (True, False) if repeat % 2 == 0 else (False, True):
            seconds, played, run_stats = play(
                policy, episodes=args.episodes, turns=args.turns, reuse=reuse, seed=repeat
            )
            generation[reuse].append(run_stats.generated_tokens / seconds)
            stats[reuse] = run_stats
            if reuse:
                reused = played
        for as_sequences in (True, False) if repeat % 2 == 0 else (False, True):
            seconds, rows = learn_seconds(policy, reused, as_sequences=as_sequences)
            learning[as_sequences].append(args.episodes / seconds)
            stats[("rows", as_sequences)] = rows
    reuse_tps, reencode_tps = (statistics.median(generation[flag]) for flag in (True, False))
    sequence_sps, rows_sps = (statistics.median(learning[flag]) for flag in (True, False))
    result = {
        "bench": "agents",
        "episodes": args.episodes,
        "turns": args.turns,
        "repeats": args.repeats,
        "threads": threads,
        "reuse_tokens_per_s": round(reuse_tps, 1),
        "reencode_tokens_per_s": round(reencode_tps, 1),
        "reuse_speedup": round(reuse_tps / reencode_tps, 2),
        "reuse_cpu_seconds": round(stats[True].cpu_seconds, 1),
        "reencode_cpu_seconds": round(stats[False].cpu_seconds, 1),
        "reuse_prompt_tokens_encoded": stats[True].encoded_tokens,
        "reencode_prompt_tokens_encoded": stats[False].encoded_tokens,
        "sequence_samples_per_s": round(sequence_sps, 2),
        "rows_samples_per_s": round(rows_sps, 2),
        "sequence_speedup": round(sequence_sps / rows_sps, 2),
        "sequence_rows": stats[("rows", True)],
        "per_turn_rows": stats[("rows", False)],
    }
    result["targets_met"] = result["reuse_speedup"] >= 2.0 and result["sequence_speedup"] >= 2.0
    print(f"{'':28}{'reuse / sequence':>18}{'re-encode / rows':>18}{'speed-up':>10}")
    print(f"{'generation tokens/s':28}{reuse_tps:18.1f}{reencode_tps:18.1f}{result['reuse_speedup']:10.2f}")
    print(f"{'learner samples/s':28}{sequence_sps:18.2f}{rows_sps:18.2f}{result['sequence_speedup']:10.2f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()

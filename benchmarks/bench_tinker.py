"""Benchmark: what the Tinker API costs a training loop. `make bench-tinker`.

**Training.** The official `tinker` client trains a LoRA on Flywheel's tiny base through the API
(a live web server, the model's learner process on a learner worker, the embedded Redis and
SQLite): each step a `forward_backward` (cross-entropy on BATCH sequences of SEQ tokens) and an
`optim_step`. The baseline is the same loop in one process on the same model, LoRA and data, with
the same code computing the loss (workers/learners/tinker.py `forward_backward`) and the same
AdamW: what the API adds is HTTP, queuing, the learner's polling and the protobuf answers. Both
sides use one torch thread; rounds alternate which side goes first; each side's figure is the
median step of its timed rounds (the first WARMUP steps of a round untimed), in trained tokens per
second. A side's speed counts only where it learned: its loss at the end against its start.

**Sampling.** One sampling session on the trained weights samples SAMPLES completions of
MAX_TOKENS tokens for a prompt, against the rollout workers' own decoder run in this process on the
same published policy version (inference.decoding.decode, the same settings): generated tokens per
second, medians over rounds.

**Episodes.** An RL loop sends one sample request per episode, all at once (the cookbook's does):
EPISODES single-sample requests submitted together through the API, which a rollout worker decodes
as one batch (FLYWHEEL_TINKER_SAMPLE_BATCH), against the same EPISODES completions as one decode in
this process: generated tokens per second, medians over rounds. Every API sample is also recorded
as a trace (FLYWHEEL_TINKER_RECORD_SAMPLES), inside the timed span.

Ends with one line of JSON. BENCH_TINKER_STEPS, _BATCH, _SEQ, _ROUNDS, _SAMPLES, _EPISODES,
_MAX_TOKENS change it.
"""

import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_agent_lift import base_model, django_setup, web_start  # noqa: E402

STEPS = int(os.environ.get("BENCH_TINKER_STEPS", "8"))
WARMUP = 2
BATCH = int(os.environ.get("BENCH_TINKER_BATCH", "8"))
SEQ = int(os.environ.get("BENCH_TINKER_SEQ", "64"))
ROUNDS = int(os.environ.get("BENCH_TINKER_ROUNDS", "3"))
SAMPLES = int(os.environ.get("BENCH_TINKER_SAMPLES", "8"))
MAX_TOKENS = int(os.environ.get("BENCH_TINKER_MAX_TOKENS", "32"))
EPISODES = int(os.environ.get("BENCH_TINKER_EPISODES", "32"))
RANK = 8
LEARNING_RATE = 1e-3
WORKERS = (("learner", "learner"), ("control", "control"), ("rollout", "rollout"))


def environment() -> dict[str, str]:
    import tempfile

    env = dict(os.environ)
    env.setdefault("FLYWHEEL_HOME", tempfile.mkdtemp(prefix="flywheel-bench-tinker-"))
    env["FLYWHEEL_REDIS_PORT"] = env.get("FLYWHEEL_REDIS_PORT", "6473")
    env["FLYWHEEL_TORCH_THREADS"] = "1"
    env["FLYWHEEL_SANDBOX_WORKER_CHECK"] = "false"
    os.environ.update(env)
    return env


def batches(tokenizer, count: int) -> list[list[list[int]]]:
    """`count` batches of BATCH token sequences of SEQ+1 tokens, from the base's own vocabulary."""
    import random

    rng = random.Random(0)
    words = [word for word in tokenizer.get_vocab() if word.isalpha()][:2000] or ["a"]
    out = []
    for _ in range(count):
        rows = []
        for _ in range(BATCH):
            ids: list[int] = []
            while len(ids) < SEQ + 1:
                ids += tokenizer.encode(
                    " ".join(rng.choice(words) for _ in range(16)), add_special_tokens=False
                )
            rows.append(ids[: SEQ + 1])
        out.append(rows)
    return out


def data_of(rows: list[list[int]]):
    from tinker import types

    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(row[:-1]),
            loss_fn_inputs={"target_tokens": row[1:], "weights": [1.0] * SEQ},
        )
        for row in rows
    ]


def api_round(training, rows_per_step) -> tuple[list[float], float, float]:
    from tinker import types

    seconds, losses = [], []
    for step, rows in enumerate(rows_per_step):
        started = time.perf_counter()
        backward = training.forward_backward(data_of(rows), "cross_entropy")
        update = training.optim_step(types.AdamParams(learning_rate=LEARNING_RATE))
        result = backward.result()
        update.result()
        if step >= WARMUP:
            seconds.append(time.perf_counter() - started)
        losses.append(result.metrics["loss:sum"] / (BATCH * SEQ))
    return seconds, losses[0], losses[-1]


class Local:
    """The same loop in this process: the learner's own forward_backward and an AdamW step."""

    def __init__(self, model: Path, home: Path) -> None:
        from types import SimpleNamespace

        from workers.learners.common import LearnerConfig, learner_create
        from workers.learners.tinker import Served

        config = LearnerConfig(
            model=str(model),
            output_dir=str(home / "bench-local"),
            adapter="lora",
            lora_rank=RANK,
            lora_alpha=32.0,
            lora_target_modules="attention,mlp,unembed",
        )
        learner, _ = learner_create(config)
        learner.model.train()
        self.served = Served(run=SimpleNamespace(pk=0), row=SimpleNamespace(), learner=learner, config=config)

    def round(self, rows_per_step) -> tuple[list[float], float, float]:
        from tinker import types
        from tinker.proto.request_conv import forward_backward_request_to_proto
        from tinker.proto.response_conv import deserialize_forward_backward_output

        from tinker_api import wire
        from workers.learners.tinker import forward_backward

        seconds, losses = [], []
        optimizer = self.served.learner.optimizer
        for step, rows in enumerate(rows_per_step):
            started = time.perf_counter()
            request = types.ForwardBackwardRequest(
                forward_backward_input=types.ForwardBackwardInput(
                    data=data_of(rows), loss_fn="cross_entropy"
                ),
                model_id="local",
                seq_id=step + 1,
            )
            parsed = wire.forward_backward_read(
                forward_backward_request_to_proto(request).SerializeToString()
            )
            result = deserialize_forward_backward_output(forward_backward(self.served, parsed))
            for group in optimizer.param_groups:
                group["lr"], group["betas"], group["eps"] = LEARNING_RATE, (0.9, 0.95), 1e-12
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step >= WARMUP:
                seconds.append(time.perf_counter() - started)
            losses.append(result.metrics["loss:sum"] / (BATCH * SEQ))
        return seconds, losses[0], losses[-1]


def local_samples(run, version: int, prompt: list[int], count: int = SAMPLES) -> float:
    """The rollout workers' decoder on the same published version: generated tokens per second."""
    from dataclasses import replace

    from inference.decoding import decode
    from inference.settings import TierSettings
    from workers.run_rollout import policy_version_load

    settings = TierSettings.from_config(run.tier_config)
    tier = policy_version_load(run, version, settings)
    settings = replace(settings, temperature=1.0, max_new_tokens=MAX_TOKENS, stop=())
    started = time.perf_counter()
    completions = decode(tier, [tuple(prompt)] * count, settings)
    return sum(len(c.token_ids) for c in completions) / (time.perf_counter() - started)


def api_samples(sampler, prompt: list[int]) -> float:
    from tinker import types

    started = time.perf_counter()
    answer = sampler.sample(
        prompt=types.ModelInput.from_ints(prompt),
        num_samples=SAMPLES,
        sampling_params=types.SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0),
    ).result()
    return sum(len(s.tokens) for s in answer.sequences) / (time.perf_counter() - started)


def api_episodes(sampler, prompt: list[int]) -> float:
    """EPISODES one-sample requests sent together, as an RL loop's episodes are."""
    from tinker import types

    params = types.SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0)
    started = time.perf_counter()
    futures = [
        sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=1, sampling_params=params)
        for _ in range(EPISODES)
    ]
    tokens = sum(len(future.result().sequences[0].tokens) for future in futures)
    return tokens / (time.perf_counter() - started)


def main() -> None:
    env = environment()
    django_setup()
    import tinker
    import torch
    from django.core.management import call_command
    from transformers import AutoTokenizer

    from benchmarks.worker_processes import start_workers, stop_all
    from projects import services as project_services
    from tiers import services as tier_services
    from tinker_api.models import TinkerModel

    torch.set_num_threads(1)
    call_command("migrate", verbosity=0)
    home = Path(env["FLYWHEEL_HOME"])
    model = base_model(home)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    data = batches(tokenizer, ROUNDS * STEPS)
    prompt = data[0][0][:16]
    owner = project_services.User.objects.create_user(username=f"tinker-{time.time_ns()}")
    project = project_services.project_create(name=f"tinker-{time.time_ns()}", by=owner)
    tier_services.tier_create(
        project=project, by=owner, name="tiny", base_model=str(model), max_new_tokens=MAX_TOKENS
    )
    _, token = project_services.api_token_create(user=owner, name="bench", default_project=project)
    load_before = os.getloadavg()
    started = time.monotonic()
    figures: dict[str, list] = {"api": [], "local": []}
    learned: dict[str, list] = {"api": [], "local": []}
    samples: dict[str, list] = {"api": [], "local": []}
    episodes: dict[str, list] = {"api": [], "local": []}
    workers, web, service = [], None, None
    try:  # whatever fails, the processes started here are stopped
        workers = start_workers(env, WORKERS, f"bench-tinker-{os.getpid()}")
        web, url = web_start(env, health="/tinker/api/v1/healthz")  # no eval worker: /healthz would say so
        service = tinker.ServiceClient(base_url=f"{url}/tinker", api_key=f"tml-{token}")
        training = service.create_lora_training_client(base_model="tiny", rank=RANK).result()
        local = Local(model, home)
        for number in range(ROUNDS):
            rows = data[number * STEPS : (number + 1) * STEPS]
            order = ("api", "local") if number % 2 == 0 else ("local", "api")
            for side in order:
                seconds, first, last = api_round(training, rows) if side == "api" else local.round(rows)
                figures[side] += seconds
                learned[side].append((first, last))
        sampler = training.save_weights_and_get_sampling_client().result()
        run = TinkerModel.objects.select_related("run").get(model_id=training.model_id).run
        run.refresh_from_db()
        for number in range(ROUNDS):
            for side in ("api", "local") if number % 2 == 0 else ("local", "api"):
                rate = (
                    api_samples(sampler, prompt)
                    if side == "api"
                    else local_samples(run, run.policy_version, prompt)
                )
                samples[side].append(rate)
        for number in range(ROUNDS):
            for side in ("api", "local") if number % 2 == 0 else ("local", "api"):
                rate = (
                    api_episodes(sampler, prompt)
                    if side == "api"
                    else local_samples(run, run.policy_version, prompt, EPISODES)
                )
                episodes[side].append(rate)
    finally:
        if service is not None:
            service.close("success").result()  # the session ends, and the model's run with it
        stop_all(([web] if web is not None else []) + workers)
    tokens = BATCH * SEQ
    rate = {side: tokens / statistics.median(seconds) for side, seconds in figures.items()}
    sample_rate = {side: statistics.median(values) for side, values in samples.items()}
    episode_rate = {side: statistics.median(values) for side, values in episodes.items()}
    print(
        json.dumps(
            {
                "benchmark": "tinker",
                "model": "Flywheel's tiny base (python manage.py build_base_model)",
                "lora_rank": RANK,
                "batch": BATCH,
                "sequence_tokens": SEQ,
                "steps_per_round": STEPS,
                "rounds": ROUNDS,
                "train_tokens_per_second": {side: round(value, 1) for side, value in rate.items()},
                "api_over_local_train": round(rate["api"] / rate["local"], 3),
                "median_step_seconds": {side: round(statistics.median(s), 4) for side, s in figures.items()},
                "loss_first_last_per_round": {
                    side: [[round(a, 4), round(b, 4)] for a, b in pairs] for side, pairs in learned.items()
                },
                "learned": all(pairs[-1][1] < pairs[0][0] for pairs in learned.values()),
                "sample_tokens_per_second": {side: round(value, 1) for side, value in sample_rate.items()},
                "api_over_local_sample": round(sample_rate["api"] / sample_rate["local"], 3),
                "samples": SAMPLES,
                "episode_tokens_per_second": {side: round(value, 1) for side, value in episode_rate.items()},
                "api_over_local_episodes": round(episode_rate["api"] / episode_rate["local"], 3),
                "episodes": EPISODES,
                "max_tokens": MAX_TOKENS,
                "torch_threads": 1,
                "seconds": round(time.monotonic() - started, 1),
                "load_average": {
                    "before": [round(x, 2) for x in load_before],
                    "after": list(os.getloadavg()),
                },
                "cores": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()

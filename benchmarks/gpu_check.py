"""`make gpu-check`: what Flywheel's model paths do on a CUDA GPU, in under eight minutes.

Builds a random-initialised Qwen2 of about 0.5B parameters (Qwen2-0.5B's widths: hidden 896, MLP
4864, 14 query and 2 key/value heads; 32 layers, with the suite's small local tokenizer, so nothing
is downloaded), saves it with `save_pretrained`, then measures, in bf16:

- decoder: `inference.decoding.decode` on a TierModel (what rollout workers call) against Hugging
  Face's `generate` (eager, the same model object, the same sampling and max_new_tokens; both make
  every row run to the end: the decoder's stop ids are put out of the model's reach and `generate`
  gets min_new_tokens), at batch 1, 32 and 128, the order alternated over 3 repeats, medians:
  tokens/s each and the ratio; batch 1 also as a share of the weight-bandwidth bound (the device's
  memory bandwidth over the bytes of weights each token reads);
- speed tier: draft-model speculation (a draft made of the model's first layers, its own weights)
  against the capability tier (no speculation) at equal batch, alternated, medians, with the
  draft's acceptance rate;
- learner: GRPO optimiser steps with all weights and with LoRA (rank 16, the family's
  projections) at equal batch, bf16 autocast: samples/s, MFU and the step's peak GPU memory
  (workers/learners/device_figures.py, as each run step records them);
- a short GRPO run through the real workers: the embedded Redis and SQLite under a fresh
  FLYWHEEL_HOME, a learner/control and a rollout/eval Celery worker, the run's learner process,
  the demo tasks with an in-process text-similarity reward (no sandbox needed), the tier on the
  GPU: whether it succeeded and its learner steps/s;
- precision rules: fp16 and bf16 generate finite greedy text (and how much of it matches fp32);
  an int8 tier on CUDA is refused with its reason.

Prints one JSON line. Without a CUDA device it refuses (exit status 2) unless `--dry-run`, which
runs every part on a tiny model on the CPU (what the test suite checks; its figures mean nothing).

Run: .venv/bin/python benchmarks/gpu_check.py [--dry-run]   (a GPU host: python3.12 ...)
"""

import argparse
import copy
import dataclasses
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def embedded_home() -> dict[str, str]:
    """A fresh FLYWHEEL_HOME on the embedded default (SQLite, Redis on a free port), set before
    Django reads its settings, so the check's workers and records touch nothing of the machine's."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for name in ("DATABASE_URL", "REDIS_URL"):
        os.environ.pop(name, None)
    os.environ["FLYWHEEL_HOME"] = tempfile.mkdtemp(prefix="gpu-check-home-")
    os.environ["FLYWHEEL_REDIS_PORT"] = str(port)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    return dict(os.environ)


ENV = embedded_home()

import django  # noqa: E402

django.setup()

import torch  # noqa: E402
from django.conf import settings as django_settings  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from inference.cuda_graphs import step_runner  # noqa: E402
from inference.decoding import GenerationStats, TierError, TierModel, decode, resolve_device, tier_load  # noqa: E402
from inference.settings import TierSettings  # noqa: E402
from tests.model_families import FAMILIES, tokenizer_build  # noqa: E402
from workers.learners.common import learner_create, sequence_batch  # noqa: E402
from workers.learners.device_figures import (  # noqa: E402
    device_spec,
    step_figures,
    step_memory_reset,
    synchronise,
)
from workers.learners.grpo import GRPOBatch, GRPOConfig, learn_on_batch  # noqa: E402

FULL_SIZE = {"hidden": 896, "intermediate": 4864, "layers": 32, "heads": 14, "kv_heads": 2}
DRY_SIZE = {"hidden": 64, "intermediate": 128, "layers": 2, "heads": 2, "kv_heads": 1}
REPEATS = 3
DRAFT_LAYERS = 4  # the speed tier's draft: the model's first layers (its embeddings, norm and head)
SPECULATIVE_TOKENS = 4
WARM_UP_TOKENS = 16
NEVER = "<|gpu-check-never|>"  # an end-of-sequence token past the model's vocabulary


@dataclasses.dataclass(frozen=True)
class Sizes:
    decode_batches: tuple[int, ...]
    decode_tokens: int
    prompt_tokens: int
    speed_batches: tuple[int, ...]
    speed_tokens: int
    learner_rows: int
    learner_prompt: int
    learner_completion: int
    run_steps: int
    run_tokens: int


FULL = Sizes((1, 32, 128), 128, 64, (1, 8), 64, 32, 128, 256, 3, 32)
DRY = Sizes((1, 4, 8), 8, 8, (1, 4), 8, 8, 16, 16, 2, 8)


def model_build(path: Path, size: dict, layers: int | None = None) -> int:
    """A random-init Qwen2 and its tokenizer, saved; returns the parameter count."""
    tokenizer = tokenizer_build(FAMILIES["qwen2"])
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(qwen2_config(size, len(tokenizer), tokenizer, layers))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return sum(parameter.numel() for parameter in model.parameters())


def qwen2_config(size: dict, vocab: int, tokenizer, layers: int | None = None) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=size["hidden"],
        intermediate_size=size["intermediate"],
        num_hidden_layers=layers or size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["kv_heads"],
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def draft_build(source: Path, path: Path, size: dict, layers: int) -> None:
    """The speed tier's draft: the model's first `layers` layers with its embeddings, final norm
    and head (a layer-skip draft: random weights agree with nothing else, this shares the model's)."""
    model = Qwen2ForCausalLM.from_pretrained(source)
    tokenizer = tokenizer_build(FAMILIES["qwen2"])
    draft = Qwen2ForCausalLM(qwen2_config(size, len(tokenizer), tokenizer, layers))
    missing, _ = draft.load_state_dict(model.state_dict(), strict=False)
    assert not missing, missing  # every weight of the draft comes from the model
    draft.save_pretrained(path)
    tokenizer.save_pretrained(path)


def median(values: list[float]) -> float:
    return statistics.median(values)


# -- (a) the decoder against Hugging Face's generate ------------------------------------------------


def without_stops(tier: TierModel) -> TierModel:
    """The tier with its stop ids out of the model's reach (an end-of-sequence id past its
    vocabulary, no chat template's end of turn), so every row decodes max_new_tokens tokens, as
    min_new_tokens makes `generate` do: both decoders then produce the same number of tokens."""
    tokenizer = copy.deepcopy(tier.tokenizer)
    tokenizer.add_special_tokens({"eos_token": NEVER})
    tokenizer.chat_template = None
    tier.model.generation_config.eos_token_id = tokenizer.eos_token_id
    return dataclasses.replace(tier, tokenizer=tokenizer)


def random_prompts(tier: TierModel, rows: int, length: int, seed: int = 0) -> list[tuple[int, ...]]:
    """Token-id prompts of one length (no padding on either side), ordinary tokens only."""
    generator = torch.Generator().manual_seed(seed)
    vocab = tier.model.config.vocab_size
    ids = torch.randint(16, vocab, (rows, length), generator=generator)
    return [tuple(row) for row in ids.tolist()]


def timed(device: str, work: Callable[[], int]) -> tuple[float, int]:
    """(seconds, tokens) of one call, the device's queued work included."""
    synchronise(torch.device(device))
    started = time.perf_counter()
    tokens = work()
    synchronise(torch.device(device))
    return time.perf_counter() - started, tokens


def flywheel_decode(
    tier: TierModel, prompts: list, settings: TierSettings, seed: int, tokens: int | None = None
) -> int:
    """The decoder rollout workers call: tokens made."""
    return speed_decode(tier, prompts, settings, seed, tokens)


def hf_generate(
    tier: TierModel, prompts: list, settings: TierSettings, seed: int, tokens: int | None = None
) -> int:
    """Hugging Face's `generate`, eager (no compile, its default cache), the tier's sampling."""
    settings = settings.with_(max_new_tokens=min(tokens, settings.max_new_tokens)) if tokens else settings
    torch.manual_seed(seed)
    input_ids = torch.tensor(prompts, device=tier.device)
    with torch.no_grad():
        out = tier.model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=settings.temperature > 0,
            temperature=settings.temperature or None,
            top_p=settings.top_p,
            top_k=settings.top_k,  # 0: off, as in the tier (None would take generate's default, 50)
            max_new_tokens=settings.max_new_tokens,
            min_new_tokens=settings.max_new_tokens,
            eos_token_id=tier.tokenizer.eos_token_id,
            pad_token_id=tier.tokenizer.pad_token_id,
        )
    return int(out[:, input_ids.size(1) :].numel())


def alternated(device: str, sides: dict[str, Callable[..., int]]) -> dict[str, dict]:
    """Each side (a call from a seed, and a shorter length to warm up with, to the tokens it made)
    warmed up once, then run REPEATS times in alternating order (so neither always runs first);
    median seconds (a first run that still pays a warm-up cost is the slowest, not the median) and
    tokens/s per side."""
    for run in sides.values():  # warm-up: kernels, a CUDA graph bucket, the allocator
        run(0, WARM_UP_TOKENS)
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    tokens: dict[str, int] = {}
    for repeat in range(REPEATS):
        for name in list(sides) if repeat % 2 == 0 else list(reversed(sides)):
            took, tokens[name] = timed(device, partial(sides[name], repeat + 1))
            seconds[name].append(took)
    return {
        name: {
            "tokens": tokens[name],
            "median_seconds": round(median(seconds[name]), 3),
            "tokens_per_second": round(tokens[name] / median(seconds[name]), 1),
        }
        for name in sides
    }


def decoder_against_hf(tier: TierModel, settings: TierSettings, batch: int, prompt_tokens: int) -> dict:
    """One batch size, the decoder and `generate` alternated. `settings` is the tier's as the
    caller wants it measured. On CUDA the decoder also runs with its CUDA graphs off, in the same
    alternation (`flywheel_eager`), so what the graphs bring is measured beside the same runs."""
    settings = settings.with_(batch_size=batch)
    prompts = random_prompts(tier, batch, prompt_tokens)
    sides = {
        "flywheel": partial(flywheel_decode, tier, prompts, settings),
        "hf_generate": partial(hf_generate, tier, prompts, settings),
    }
    if tier.device.type == "cuda" and settings.cuda_graphs:
        eager = dataclasses.replace(settings, cuda_graphs=False)
        sides["flywheel_eager"] = partial(flywheel_decode, tier, prompts, eager)
    measured = alternated(tier.device.type, sides)
    ratio = measured["flywheel"]["tokens_per_second"] / measured["hf_generate"]["tokens_per_second"]
    row = {"batch": batch, **measured, "ratio": round(ratio, 2)}
    if "flywheel_eager" in measured:
        graphs = measured["flywheel"]["tokens_per_second"] / measured["flywheel_eager"]["tokens_per_second"]
        row["graphs_ratio"] = round(graphs, 2)
    return row


def bandwidth_bound(tier: TierModel) -> dict:
    """Batch 1's ceiling: every decoded token reads every weight once, so tokens/s is at most the
    memory bandwidth over the weights' bytes (KV-cache reads, small at batch 1, left out)."""
    weight_bytes = sum(p.numel() * p.element_size() for p in tier.model.parameters())
    spec = device_spec(torch.cuda.get_device_name(tier.device)) if tier.device.type == "cuda" else None
    bound = spec.memory_tbps * 1e12 / weight_bytes if spec is not None else None
    return {
        "weight_bytes": weight_bytes,
        "memory_tbps": spec.memory_tbps if spec is not None else None,
        "tokens_per_second_bound": round(bound, 1) if bound is not None else None,
    }


def decoder_check(
    path: Path,
    device: str,
    precision: str,
    sizes: Sizes,
    settings_of: Callable[[TierSettings], TierSettings] | None = None,
) -> dict:
    """The decoder against HF `generate` at each batch size (on CUDA with and without its CUDA
    graphs). `settings_of(settings)` changes the tier's settings for every row."""
    settings = TierSettings(
        base_model=str(path),
        device=device,
        precision=precision,
        temperature=1.0,
        max_new_tokens=sizes.decode_tokens,
        chat=False,
    )
    if settings_of is not None:
        settings = settings_of(settings)
    tier = without_stops(tier_load(settings))
    rows = [decoder_against_hf(tier, settings, batch, sizes.prompt_tokens) for batch in sizes.decode_batches]
    bound = bandwidth_bound(tier)
    first = rows[0]["flywheel"]["tokens_per_second"]
    if bound["tokens_per_second_bound"]:
        bound["batch_1_share"] = round(first / bound["tokens_per_second_bound"], 4)
    else:
        bound["batch_1_share"] = None
    attention = tier.model.config._attn_implementation
    del tier
    empty_cache(device)
    return {
        "attention": attention,
        "max_new_tokens": sizes.decode_tokens,
        "prompt_tokens": sizes.prompt_tokens,
        "batches": rows,
        "bandwidth": bound,
    }


def graphs_check(path: Path, device: str, precision: str) -> dict:
    """The CUDA-graph decode against the same decode without graphs: greedy, so both should make
    the same tokens but where bf16 rounding tips a near-tie; and the captures of a second call
    reused (none made again). On a CPU there are no graphs: the part says so."""
    if device != "cuda":
        return {"skipped": "no CUDA: the decoder runs without graphs"}
    settings = TierSettings(
        base_model=str(path),
        device=device,
        precision=precision,
        temperature=0.0,
        max_new_tokens=64,
        chat=False,
    )
    tier = without_stops(tier_load(settings))
    prompts = random_prompts(tier, 8, 32, seed=7)
    graphed = [c.token_ids for c in decode(tier, prompts, settings)]
    runner = step_runner(tier.model)
    first_captures = runner.captures if runner is not None else 0
    again = [c.token_ids for c in decode(tier, prompts, settings)]
    eager = [c.token_ids for c in decode(tier, prompts, dataclasses.replace(settings, cuda_graphs=False))]
    agree = [
        next((i for i, (a, b) in enumerate(zip(g, e, strict=False)) if a != b), len(g))
        for g, e in zip(graphed, eager, strict=True)
    ]
    result = {
        "captures": first_captures,
        "captures_after_second_call": runner.captures if runner is not None else 0,
        "capture_failed": runner.failed if runner is not None else "the lean path does not apply",
        "second_call_same_tokens": graphed == again,
        "rows_identical_to_eager": sum(g == e for g, e in zip(graphed, eager, strict=True)),
        "rows": len(prompts),
        "tokens_agreeing_before_first_difference": agree,
    }
    del tier
    empty_cache(device)
    return result


# -- (b) the speed tier against the capability tier -------------------------------------------------


def speed_decode(
    tier: TierModel,
    prompts: list,
    settings: TierSettings,
    seed: int,
    tokens: int | None = None,
    *,
    stats: GenerationStats | None = None,
) -> int:
    """A tier's decode, `tokens` new tokens at most when given (its drafts' acceptance counted in
    `stats` on the timed runs only)."""
    settings = settings.with_(max_new_tokens=min(tokens, settings.max_new_tokens)) if tokens else settings
    stats = stats if not tokens else None  # a warm-up's proposals are not counted
    completions = decode(tier, prompts, settings, generator=torch.Generator().manual_seed(seed), stats=stats)
    return sum(len(c.token_ids) for c in completions)


def speed_against_capability(
    path: Path, draft: Path, device: str, precision: str, sizes: Sizes
) -> list[dict]:
    """Draft-model speculation against none, the same model, sampling and batch; alternated, medians."""
    capability = TierSettings(
        base_model=str(path),
        device=device,
        precision=precision,
        temperature=1.0,
        max_new_tokens=sizes.speed_tokens,
        chat=False,
    )
    speed = capability.with_(
        speculation="draft_model", draft_model=str(draft), speculative_tokens=SPECULATIVE_TOKENS
    )
    tiers = {"capability": without_stops(tier_load(capability)), "speed": without_stops(tier_load(speed))}
    rows = []
    for batch in sizes.speed_batches:
        prompts = random_prompts(tiers["capability"], batch, sizes.prompt_tokens, seed=1)
        stats = GenerationStats()
        sides = {
            "capability": partial(
                speed_decode, tiers["capability"], prompts, capability.with_(batch_size=batch)
            ),
            "speed": partial(
                speed_decode, tiers["speed"], prompts, speed.with_(batch_size=batch), stats=stats
            ),
        }
        measured = alternated(device, sides)
        ratio = measured["speed"]["tokens_per_second"] / measured["capability"]["tokens_per_second"]
        rows.append(
            {"batch": batch, **measured, "speedup": round(ratio, 2), "acceptance_rate": stats.acceptance_rate}
        )
    del tiers
    empty_cache(device)
    return rows


# -- (c) the learner, full weights and LoRA ---------------------------------------------------------


def learner_steps(path: Path, work: Path, adapter: str, sizes: Sizes, steps: int = 2) -> dict:
    """GRPO optimiser steps on `learner_rows` sequences (bf16 autocast where the device has it):
    a warm-up, then `steps` timed ones, each with the figures a run step records."""
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
    rows, prompt, completion = sizes.learner_rows, sizes.learner_prompt, sizes.learner_completion
    generator = torch.Generator().manual_seed(0)
    vocab = len(learner.tokenizer)
    prompts = torch.randint(10, vocab, (rows // 4, prompt), generator=generator).repeat_interleave(4, 0)
    completions = torch.randint(10, vocab, (rows, completion), generator=generator)
    sequences = sequence_batch(prompts.tolist(), completions.tolist(), learner.tokenizer.pad_token_id)
    old = torch.full((rows, prompt + completion - 1), -5.0)
    batch = GRPOBatch(sequences, old, torch.randn(rows, generator=generator))
    learn_on_batch(learner, batch, config, reference=None)  # warm-up step
    model = learner.accelerator.unwrap_model(learner.model)
    measured = []
    for _ in range(steps):
        batch.proximal_logprobs = None
        step_memory_reset(device)
        synchronise(device)
        started = time.perf_counter()
        metrics = learn_on_batch(learner, batch, config, reference=None)
        synchronise(device)
        seconds = time.perf_counter() - started
        measured.append(
            step_figures(
                model, device, metrics["tokens"], seconds, django_settings.FLYWHEEL_DEVICE_PEAK_TFLOPS
            )
        )
    seconds = median([figures["step_seconds"] for figures in measured])
    last = measured[-1]
    result = {
        "rows": rows,
        "tokens_per_row": prompt + completion,
        "step_seconds": round(seconds, 3),
        "samples_per_second": round(rows / seconds, 2),
        "mfu": round(median([f["mfu"] for f in measured]), 4) if "mfu" in last else None,
        "peak_memory_mb": round(last["peak_memory_mb"], 1) if "peak_memory_mb" in last else None,
        "trainable_parameters": sum(p.numel() for p in learner.model.parameters() if p.requires_grad),
        "mixed_precision": learner.accelerator.mixed_precision,
    }
    del learner, model
    empty_cache(device.type)
    return result


def empty_cache(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()


# -- (d) a short GRPO run through the real workers --------------------------------------------------

SIMILARITY_RULE = {
    "type": "text_similarity",
    "name": "similar",
    "input": "{{sample.output_text}}",
    "reference": "{{item.reference_solution}}",
    "evaluation_metric": "fuzzy_match",
}
RUN_WORKERS = (("learner,control", "learner"), ("rollout,eval", "rollout"))
RUN_TIMEOUT_SECONDS = 240


def run_through_workers(path: Path, device: str, precision: str, sizes: Sizes) -> dict:
    """A GRPO run on the demo tasks through Celery workers, the run's learner process and a rollout
    worker on `device`; an in-process reward (text similarity to the reference solution), so no
    sandbox is needed on a bare GPU host. Steps/s from the run's start to its last step's metrics."""
    from django.core.management import call_command

    from benchmarks.worker_processes import start_workers, stop_all

    call_command("migrate", verbosity=0)
    env = ENV | {"FLYWHEEL_SANDBOX_WORKER_CHECK": "false", "FLYWHEEL_LEARNER_SPARE": "false"}
    started = time.monotonic()
    workers = start_workers(env, RUN_WORKERS, "gpu-check")
    workers_seconds = time.monotonic() - started
    try:
        run = run_launch(path, device, precision, sizes)
        deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
        while not run.is_terminal and time.monotonic() < deadline:
            time.sleep(0.5)  # following the run's record to its end
            run.refresh_from_db()
    finally:
        stop_all(workers)
    return run_figures(run) | {"workers_start_seconds": round(workers_seconds, 1)}


def run_launch(path: Path, device: str, precision: str, sizes: Sizes):
    from projects import services as project_services
    from projects.demo_tasks import demo_task_sets
    from rewards import services as reward_services
    from runs import services
    from runs.lifecycle import RunRequest, run_create
    from tiers import services as tier_services

    owner = services.User.objects.create_user(username="gpu-check")
    project = project_services.project_create(name="gpu-check", by=owner)
    sets = demo_task_sets(seed=0, train_size=16, heldout_size=4)
    task_set = project_services.task_set_create(project=project, name="demo", by=owner)
    lines = [(json.dumps(item) + "\n").encode() for item in sets["train"] + sets["heldout"]]
    version = project_services.task_set_import(
        task_set=task_set, stream=lines, file_format="jsonl", by=owner
    ).version
    rule = reward_services.reward_rule_create(project=project, name="similar", spec=SIMILARITY_RULE, by=owner)
    tier = tier_services.tier_create(
        project=project,
        by=owner,
        name="rollout",
        base_model=str(path),
        device=device,
        precision=precision,
        temperature=1.0,
        max_new_tokens=sizes.run_tokens,
    )
    request = RunRequest(
        project=project,
        name="gpu-check",
        task_set_version=version,
        reward_rule_version=rule.versions.get(),
        tier=tier,
        max_steps=sizes.run_steps,
        hyperparameters={
            "group_size": 4,
            "batch_size": 4,
            "staleness": 1,
            "learning_rate": 1e-5,
            "mixed_precision": "auto",
            "checkpoint_every": sizes.run_steps,
            "eval_every": sizes.run_steps,
            "eval_items": 4,
        },
        monitor_actions={"nothing_to_learn": "alert"},
    )
    return run_create(request=request, by=owner)


def run_figures(run) -> dict:
    from runs.models import MetricPoint

    points = MetricPoint.objects.filter(run=run)
    last = points.filter(name="learner/loss").order_by("-step").first()
    span = (last.created_at - run.started_at).total_seconds() if last and run.started_at else None
    figures = {
        name.split("/")[1]: median(list(points.filter(name=name).values_list("value", flat=True)) or [0.0])
        for name in ("learner/step_seconds", "learner/peak_memory_mb", "learner/mfu")
        if points.filter(name=name).exists()
    }
    return {
        "status": run.status,
        "succeeded": run.status == "succeeded",
        "error": run.error or None,
        "steps": run.learner_step,
        "steps_per_second": round(run.learner_step / span, 3) if span else None,
        "learner_median": {name: round(value, 4) for name, value in figures.items()},
    }


# -- precision rules -------------------------------------------------------------------------------


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


def part(report: dict, name: str, measure: Callable[[], object]) -> None:
    """One part's figures and its seconds; a part that fails is reported, and the others still run."""
    started = time.monotonic()
    try:
        report[name] = measure()
    except Exception as failed:  # noqa: BLE001 - the JSON line says which part failed and why
        report[name] = {"failed": f"{type(failed).__name__}: {failed}"}
    report["part_seconds"][name] = round(time.monotonic() - started, 1)
    # Each part's figures as it ends, on stderr: a check cut off by a time limit still leaves them.
    print(f"gpu-check {name} ({report['part_seconds'][name]} s): {json.dumps(report[name])}", file=sys.stderr)


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
    size, sizes = (DRY_SIZE, DRY) if args.dry_run else (FULL_SIZE, FULL)
    precision = "bf16" if device == "cuda" else "fp32"
    started = time.monotonic()
    report: dict = {
        "gpu_check": "dry-run" if args.dry_run else "cuda",
        "device": device,
        "dtype": precision,
    }
    if device == "cuda":
        report["gpu"] = torch.cuda.get_device_name(0)
        report["bf16_supported"] = torch.cuda.is_bf16_supported()
    report["part_seconds"] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:
        work = Path(folder)
        path, draft = work / "qwen2-random", work / "qwen2-draft"
        report["parameters"] = model_build(path, size)
        report["model"] = f"Qwen2 (random init) {size}"
        draft_build(path, draft, size, min(DRAFT_LAYERS, size["layers"] - 1))
        part(report, "cuda_graphs", lambda: graphs_check(path, device, precision))
        part(report, "decoder", lambda: decoder_check(path, device, precision, sizes))
        part(report, "speed_tier", lambda: speed_against_capability(path, draft, device, precision, sizes))
        part(
            report,
            "learner",
            lambda: {adapter: learner_steps(path, work, adapter, sizes) for adapter in ("none", "lora")},
        )
        part(report, "grpo_run", lambda: run_through_workers(path, device, precision, sizes))
        part(report, "precision", lambda: precision_checks(path, device))
    shutil.rmtree(ENV["FLYWHEEL_HOME"], ignore_errors=True)
    report["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(report))
    return 0 if not any("failed" in report[name] for name in report["part_seconds"]) else 1


if __name__ == "__main__":
    sys.exit(main())

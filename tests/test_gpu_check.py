"""`make gpu-check` refuses without a GPU, and its dry run walks every step on a tiny CPU model."""

import json
import os
import subprocess
import sys

import pytest
import torch
from django.conf import settings

SCRIPT = str(settings.BASE_DIR / "benchmarks" / "gpu_check.py")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, SCRIPT, *args],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=settings.BASE_DIR,
        env=os.environ | (env or {}),
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the check runs for real")
def test_without_a_gpu_the_check_refuses_with_its_reason():
    done = run()
    assert done.returncode == 2
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "gpu_check": "refused",
        "reason": "no CUDA device on this machine; "
        "run it on a GPU machine, or with --dry-run for a tiny CPU rehearsal",
    }


# The check runs on its own home (SQLite, its own Redis), whatever the suite's backend: once in CI.
@pytest.mark.ci_embedded_only
@pytest.mark.timeout(400)
def test_the_dry_run_walks_every_part_decoder_speed_tier_learner_grpo_run_and_precision():
    done = run("--dry-run", env={"FLYWHEEL_DEVICE_PEAK_TFLOPS": "0.001"})  # a CPU has no known peak
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report["gpu_check"], report["device"], report["dtype"]) == ("dry-run", "cpu", "fp32")
    parts = ["cuda_graphs", "decoder", "speed_tier", "learner", "grpo_run", "precision"]
    assert list(report["part_seconds"]) == parts
    assert set(report) == {
        "gpu_check",
        "device",
        "dtype",
        "part_seconds",
        "parameters",
        "model",
        "seconds",
        *parts,
    }

    assert report["cuda_graphs"] == {"skipped": "no CUDA: the decoder runs without graphs"}
    decoder = report["decoder"]
    assert [row["batch"] for row in decoder["batches"]] == [1, 4, 8]
    for row in decoder["batches"]:
        # Both decoders made every row's max_new_tokens: the same tokens, so the rates compare.
        made = row["batch"] * decoder["max_new_tokens"]
        assert row["flywheel"]["tokens"] == row["hf_generate"]["tokens"] == made
        assert row["ratio"] == round(
            row["flywheel"]["tokens_per_second"] / row["hf_generate"]["tokens_per_second"], 2
        )
    # A CPU's memory bandwidth is not in the table: no bound, no share made up.
    assert decoder["bandwidth"]["weight_bytes"] == 4 * report["parameters"]
    assert (decoder["bandwidth"]["tokens_per_second_bound"], decoder["bandwidth"]["batch_1_share"]) == (
        None,
        None,
    )

    assert [row["batch"] for row in report["speed_tier"]] == [1, 4]
    for row in report["speed_tier"]:
        assert row["speed"]["tokens"] == row["capability"]["tokens"] == row["batch"] * 8
        assert 0 < row["acceptance_rate"] <= 1  # the draft was consulted

    full, lora = report["learner"]["none"], report["learner"]["lora"]
    assert full["trainable_parameters"] == report["parameters"]
    assert 0 < lora["trainable_parameters"] < report["parameters"]
    assert full["rows"] == lora["rows"] == 8
    for learner in (full, lora):
        assert learner["samples_per_second"] > 0 and learner["mfu"] > 0 and learner["peak_memory_mb"] > 0

    run_figures = report["grpo_run"]
    assert (run_figures["status"], run_figures["succeeded"], run_figures["steps"]) == ("succeeded", True, 2)
    assert run_figures["steps_per_second"] > 0 and run_figures["learner_median"]["mfu"] > 0

    precision = report["precision"]
    assert precision["bf16"]["finite_logprobs"] is True
    assert precision["fp16"] == {"refused": "fp16 generation needs a GPU; on the CPU use bf16 or fp32"}
    assert precision["int8_on_cuda"] == {
        "refused": True,
        "reason": "int8 dynamic quantisation runs on the CPU; choose device cpu or auto",
    }

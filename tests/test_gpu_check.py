"""`make gpu-check` refuses without a GPU, and its dry run walks every step on a tiny CPU model."""

import json
import subprocess
import sys

import pytest
import torch
from django.conf import settings

SCRIPT = str(settings.BASE_DIR / "benchmarks" / "gpu_check.py")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=300, cwd=settings.BASE_DIR
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


@pytest.mark.timeout(300)
def test_the_dry_run_measures_generation_grpo_full_and_lora_and_the_precision_rules():
    done = run("--dry-run")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report["gpu_check"], report["device"]) == ("dry-run", "cpu")
    assert [row["batch"] for row in report["generation"]] == [1, 32]
    assert all(row["tokens"] > 0 and row["tokens_per_second"] > 0 for row in report["generation"])
    full, lora = report["grpo_step"]["none"], report["grpo_step"]["lora"]
    assert full["trainable_parameters"] == report["parameters"]
    assert 0 < lora["trainable_parameters"] < report["parameters"]
    assert report["precision"]["bf16"]["finite_logprobs"] is True
    assert report["precision"]["fp16"] == {
        "refused": "fp16 generation needs a GPU; on the CPU use bf16 or fp32"
    }
    assert report["precision"]["int8_on_cuda"] == {
        "refused": True,
        "reason": "int8 dynamic quantisation runs on the CPU; choose device cpu or auto",
    }

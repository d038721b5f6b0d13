"""Exact resume: a training process killed (SIGKILL) right after a checkpoint completes, then resumed
in a new process, ends with weights bit-identical to a run that was never interrupted.

Each run is a real `python manage.py train_learner` process. The checkpoint holds the model, the
optimiser, the scheduler, the RNG states and the data position; batches and sampling are pure
functions of (seed, step). Every process runs on one thread, as CPU determinism requires.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from django.conf import settings
from safetensors.torch import load_file

from projects.demo_tasks import demo_task_sets
from tests.tiny_base import TINY
from workers.base_model import base_model_build
from workers.learners.common import COMPLETE_MARKER

pytestmark = pytest.mark.backend_independent

PROCESS_TIMEOUT = 120
# Graded in the sandbox like any code item, but on the length of whatever the model wrote, so even
# an untrained model's group rewards vary and every GRPO step learns.
LENGTH_TESTS = (
    'assert len(open("solution.py").read()) % 2 == 0\nassert len(open("solution.py").read()) % 3 == 0\n'
)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny-base")
    base_model_build(path, TINY, log=lambda line: None)
    return path


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def train_process(method: str, data: Path, config: dict) -> subprocess.Popen:
    argv = [
        sys.executable,
        str(Path(settings.BASE_DIR) / "manage.py"),
        "train_learner",
        method,
        "--data",
        str(data),
        "--config",
        json.dumps(config),
    ]
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(process: subprocess.Popen) -> str:
    output, _ = process.communicate(timeout=PROCESS_TIMEOUT)
    assert process.returncode == 0, output
    return output


def kill_after_checkpoint(process: subprocess.Popen, output_dir: Path, step: int) -> None:
    """SIGKILL the process the moment checkpoint `step` is complete (its marker is written last)."""
    marker = output_dir / f"checkpoint-{step}" / COMPLETE_MARKER
    deadline = time.monotonic() + PROCESS_TIMEOUT
    while not marker.exists():
        assert process.poll() is None, f"the run ended before checkpoint {step}: {process.stdout.read()}"
        assert time.monotonic() < deadline, f"no checkpoint {step} after {PROCESS_TIMEOUT} s"
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=PROCESS_TIMEOUT)
    assert process.returncode == -signal.SIGKILL
    assert not (output_dir / "final").exists(), "the run finished before the kill: nothing was interrupted"


def final_weights(output_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(output_dir / "final" / "model.safetensors")


def assert_resume_is_exact(method: str, data: Path, config: dict, tmp_path: Path, kill_at: int) -> str:
    """Train uninterrupted and killed-then-resumed (both at once: two processes), compare the weights."""
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    first = train_process(method, data, config | {"output_dir": str(straight)})
    second = train_process(method, data, config | {"output_dir": str(interrupted)})
    kill_after_checkpoint(second, interrupted, kill_at)
    resumed_output = finish(train_process(method, data, config | {"output_dir": str(interrupted)}))
    finish(first)
    expected, actual = final_weights(straight), final_weights(interrupted)
    assert expected.keys() == actual.keys()
    different = [name for name in expected if not torch.equal(expected[name], actual[name])]
    assert different == []
    return resumed_output


def test_sft_killed_after_a_checkpoint_resumes_to_identical_weights(tiny_model: Path, tmp_path: Path):
    data = write_jsonl(
        tmp_path / "items.jsonl", demo_task_sets(seed=0, train_size=12, heldout_size=2)["train"]
    )
    config = {
        "model": str(tiny_model),
        "steps": 8,
        "batch_size": 5,  # 12 items: batches cross epoch boundaries
        "gradient_accumulation_steps": 2,
        "learning_rate": 3e-3,
        "lr_scheduler": "linear",
        "warmup_steps": 2,
        "weight_decay": 0.01,
        "checkpoint_every": 2,
        "log_every": 1,
    }
    output = assert_resume_is_exact("sft", data, config, tmp_path, kill_at=2)
    resumed_at = json.loads(output.strip().splitlines()[-1])
    assert resumed_at["steps"] == 8
    assert "resumed at step" in output


def test_grpo_killed_after_a_checkpoint_resumes_to_identical_weights(tiny_model: Path, tmp_path: Path):
    items = [
        item | {"tests": LENGTH_TESTS}
        for item in demo_task_sets(seed=0, train_size=6, heldout_size=2)["train"]
    ]
    data = write_jsonl(tmp_path / "items.jsonl", items)
    config = {
        "model": str(tiny_model),
        "steps": 6,
        "group_size": 4,
        "prompts_per_step": 2,
        "max_new_tokens": 8,
        "num_iterations": 2,  # the second pass is off-policy: the clipped ratio is exercised
        "beta": 0.04,  # a frozen reference is loaded and the KL term is in the loss
        # Every group is learned, even one whose rewards all tie (its KL term still moves the
        # weights): the resumed steps must learn, whatever the tiny model happens to sample.
        "skip_zero_variance_groups": False,
        "gradient_accumulation_steps": 2,
        "learning_rate": 3e-3,
        "lr_scheduler": "linear",
        "checkpoint_every": 2,
        "log_every": 1,
    }
    output = assert_resume_is_exact("grpo", data, config, tmp_path, kill_at=2)
    learned = [line for line in output.splitlines() if line.startswith("step") and "learned" in line]
    assert learned and all(" learned 0.0000" not in line for line in learned), output

"""End to end: a `verifiers` environment of our own (examples/verifiers_envs/function_writer.py, a
SingleTurnEnv with a rubric) trains a run of `external_rollouts` through `flywheel env run`, run
from the verifiers virtualenv (`make verifiers-venv`), against a live web server and real learner
and rollout workers. Each episode is reported with the rubric's reward and its functions as
components, and `flywheel env eval` scores the held-out items with the rubric on the base tier and
on the run's last checkpoint. (The rise itself is not asserted yet: 16 steps at these settings moved
the held-out reward from 0.14 to 0.16, within noise; issue #30 asks for it.)"""

import json
import os
import random
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from episodes.models import Episode
from flywheel import Client
from projects import demo_tasks
from projects import services as project_services
from runs.models import Run, Trajectory
from tests.run_harness import demo_project
from tests.test_workers_learners import WEAK as WEAK_BASE
from tests.web_server import served_with_workers
from workers.base_model import base_model_build

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]

ROOT = Path(__file__).resolve().parent.parent
FLYWHEEL = ROOT / ".venv-verifiers" / "bin" / "flywheel"
ENVIRONMENT = ROOT / "examples" / "verifiers_envs" / "function_writer.py"
# The weak base of the Tinker cookbook's RL test: often off by one on the scalar items with the
# constant 3, so a group's rewards differ and GRPO has something to learn.
WEAK = replace(WEAK_BASE, steps=600)
TRAIN, HELDOUT, BATCH, GROUP, STEPS = 32, 16, 4, 8, 16
MAX_TOKENS = "24"

if not FLYWHEEL.exists():
    pytest.skip(
        "the verifiers virtualenv is not built (make verifiers-venv): verifiers pins openai and mcp "
        "apart from the server, so `flywheel env` runs from .venv-verifiers",
        allow_module_level=True,
    )


def scalar_items() -> dict[str, list[dict]]:
    """The demo's scalar items with the constant 3, shuffled, split into train and held-out."""
    chosen = [spec for spec in demo_tasks.all_specs() if spec.kind == "scalar" and spec.constant == 3]
    random.Random(0).shuffle(chosen)
    splits = {"heldout": chosen[:HELDOUT], "train": chosen[HELDOUT : HELDOUT + TRAIN]}
    return {
        split: [demo_tasks.item_from_spec(spec) | {"split": split} for spec in specs]
        for split, specs in splits.items()
    }


def flywheel_env(*argv: str, url: str, token: str, timeout: float) -> dict:
    """The command from the verifiers virtualenv; its --json result."""
    environment = os.environ | {"FLYWHEEL_URL": url, "FLYWHEEL_TOKEN": token}
    done = subprocess.run(
        [str(FLYWHEEL), "env", *argv, "--json"],
        env=environment,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.timeout(900)
def test_a_verifiers_environment_trains_a_run_with_its_rubric_as_the_reward(tmp_path):
    weak = tmp_path / "weak"
    base_model_build(weak, WEAK, log=lambda line: None)
    setup = demo_project(weak)
    owner, project = setup["owner"], setup["project"]
    items = scalar_items()
    task_set = project_services.task_set_create(project=project, name="scalar-3", by=owner)
    lines = [(json.dumps(item) + "\n").encode() for split in items.values() for item in split]
    version = project_services.task_set_import(
        task_set=task_set, stream=lines, file_format="jsonl", by=owner
    ).version
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps(item) + "\n" for item in items["heldout"]))
    _, token = project_services.api_token_create(user=owner, name="verifiers")
    scoring = ["--max-tokens", MAX_TOKENS, "--concurrency", "8"]
    with served_with_workers(tmp_path / "web.log", rollout_queues="rollout,eval") as server:
        evaluate = ["eval", str(ENVIRONMENT), "--items", str(heldout), "--repeats", "4", *scoring]
        before = flywheel_env(
            *evaluate, "--model", f"tier-{setup['tier'].pk}", url=server.url, token=token, timeout=300
        )
        run_id = Client(url=server.url, token=token).runs.launch(
            project=project.pk,
            name="verifiers",
            task_set_version=version.pk,
            reward_rule_version=setup["rule"].versions.get().pk,
            tier=setup["tier"].pk,
            method="external_rollouts",
            hyperparameters={
                "group_size": GROUP,
                "batch_size": BATCH,
                "staleness": 0,
                "adapter": "lora",
                "lora_rank": 8,
                "learning_rate": 2e-3,
                "lr_scheduler": "constant",
                "eval_items": 0,
                "eval_every": STEPS,
                "checkpoint_every": STEPS,
                "episode_deadline_seconds": 60,
            },
            max_steps=STEPS,
            monitor_actions={"nothing_to_learn": "alert"},
        )["id"]
        played = flywheel_env(
            "run", str(ENVIRONMENT), str(run_id), *scoring, url=server.url, token=token, timeout=600
        )
        finished = Run.objects.get(pk=run_id)
        assert finished.status == Run.Status.SUCCEEDED, finished.error
        after = flywheel_env(
            *evaluate, "--model", f"run-{run_id}-step-{STEPS}", url=server.url, token=token, timeout=300
        )
    # Every episode the command reported carries the rubric's reward and each function's value.
    assert played["status"] == "succeeded" and played["played"] >= STEPS * BATCH * GROUP
    reported = Episode.objects.filter(run_id=run_id, status="reported").select_related("trajectory")
    assert reported.count() == played["played"]
    for episode in reported:
        components = episode.trajectory.components
        # the rubric's functions, and the turn count verifiers' own monitor rubric adds
        assert set(components) == {"passes_tests", "defines_function", "num_turns"}, components
        assert episode.reward == components["passes_tests"]  # the rubric's weights: 1 and 0
    assert Trajectory.objects.filter(run_id=run_id, learned_in_step__isnull=False).exists()
    # The rubric scored every held-out rollout of the base tier and of the run's last checkpoint.
    assert before["failed"] == after["failed"] == 0
    assert before["played"] == after["played"] == HELDOUT * 4
    for scored in (before, after):
        assert 0 <= scored["reward"] <= 1 and scored["reward"] == scored["components"]["passes_tests"]

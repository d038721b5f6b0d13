"""End to end: a run submitted over REST goes queued → running → succeeded through real Celery
workers (a learner host and a rollout/eval host, as separate machines would be), a real learner
process, real sandboxes and the tiny model; metrics, trajectories and checkpoints are recorded."""

import json
import os
from pathlib import Path

import psutil
import pytest
from transformers import AutoModelForCausalLM

from projects import services as project_services
from runs.models import Checkpoint, HeldOutResult, MetricPoint, Run, Trajectory
from runs.outcomes import METRIC, heldout_scores, paired_compare
from tests.conftest import api_client_for
from tests.run_harness import (
    Host,
    demo_project,
    hosts_killed,
    run_body,
    tiny_model,
    wait_for_terminal,
    wait_until,
    worker_env,
)
from workers.learners.device_figures import model_flops_per_token

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["tiny_model"]


PEAK_TFLOPS = 0.001  # a made-up device peak, so the CPU learner records its MFU against it


@pytest.fixture
def hosts():
    learner_host, rollout_host = Host(worker_env()), Host(worker_env())
    with hosts_killed(learner_host, rollout_host):
        learner_host.worker("learner,control")
        rollout_host.worker("rollout,eval")
        yield learner_host, rollout_host


@pytest.fixture
def hosts_with_a_peak():
    env = worker_env(FLYWHEEL_DEVICE_PEAK_TFLOPS=str(PEAK_TFLOPS))
    learner_host, rollout_host = Host(env), Host(env)
    with hosts_killed(learner_host, rollout_host):
        learner_host.worker("learner,control")
        rollout_host.worker("rollout,eval")
        yield learner_host, rollout_host


def step_points(run: Run, name: str) -> dict[int, float]:
    return dict(MetricPoint.objects.filter(run=run, name=name).values_list("step", "value"))


def test_a_run_submitted_over_rest_trains_through_real_workers_and_succeeds(tiny_model, hosts):
    setup = demo_project(tiny_model)
    steps, batch, group = 3, 4, 4
    body = run_body(setup, steps=steps, checkpoint_every=2, eval_every=3)
    response = api_client_for(setup["owner"]).post("/api/v1/runs", body, format="json")
    assert response.status_code == 201, response.json()
    run = wait_for_terminal(response.json()["id"])
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert (run.learner_step, run.policy_version, run.restarts) == (steps, steps, 0)
    statuses = [e.data["status"] for e in run.events.filter(kind="status").order_by("pk")]
    assert statuses == ["queued", "starting", "running", "succeeded"]
    trajectories = Trajectory.objects.filter(run=run)
    assert trajectories.count() == steps * batch * group
    for trajectory in trajectories.exclude(learned_in_step=None).select_related("batch"):
        assert trajectory.batch.step == trajectory.learned_in_step
        assert trajectory.policy_version >= trajectory.learned_in_step - 1  # the staleness bound, k = 1
    assert sorted(Checkpoint.objects.filter(run=run).values_list("step", flat=True)) == [2, 3]
    assert sorted(MetricPoint.objects.filter(run=run, name="reward/mean").values_list("step", flat=True)) == [
        1,
        2,
        3,
    ]
    assert_finished_with_its_outcome(run, steps, heldout=4)
    # No device peak on a CPU and none set: no MFU made up; each step's time and memory still.
    assert not MetricPoint.objects.filter(run=run, name="learner/mfu").exists()
    assert set(step_points(run, "learner/step_seconds")) == {1, 2, 3}
    if os.access("/proc/self/clear_refs", os.W_OK):  # Linux, where a step's peak can be reset
        assert set(step_points(run, "learner/peak_memory_mb")) == {1, 2, 3}


def assert_device_figures(run: Run, model: Path, steps: int) -> None:
    """Each step's MFU is the formula's, from the tokens it trained on and the time it took."""
    tokens, seconds, mfu = (step_points(run, f"learner/{name}") for name in ("tokens", "step_seconds", "mfu"))
    assert set(tokens) == set(seconds) == set(range(1, steps + 1)) and all(tokens.values())
    per_token = model_flops_per_token(AutoModelForCausalLM.from_pretrained(model))
    assert mfu == {
        step: pytest.approx(per_token * tokens[step] / seconds[step] / (PEAK_TFLOPS * 1e12))
        for step in tokens
    }


def assert_finished_with_its_outcome(run: Run, steps: int, *, heldout: int) -> None:
    """A run is finished only once its final version is evaluated, item by item, and its
    outcome against its start recorded from those items."""
    for version in (0, steps):
        assert MetricPoint.objects.filter(run=run, name="heldout/pass_rate", step=version).exists()
        assert HeldOutResult.objects.filter(run=run, step=version).count() == heldout
    comparison = paired_compare(heldout_scores(run.pk, 0), heldout_scores(run.pk, steps))
    assert run.outcome == comparison.verdict
    assert run.outcome_detail == comparison.as_dict() | {"metric": METRIC, "from_step": 0, "to_step": steps}
    final = MetricPoint.objects.get(run=run, name="heldout/pass_rate", step=steps).value
    assert comparison.items == 0 or abs(final - comparison.after) < 1e-9


def with_preference_pairs(setup: dict) -> dict:
    """The demo items as DPO wants them: the reference solution chosen over an off-by-one one."""

    items = []
    for item in setup["version"].items.order_by("position"):
        data = item.data | {"id": item.external_id, "kind": item.kind, "split": item.split}
        wrong = data["reference_solution"].replace("return ", "return 1 + ", 1)
        data["metadata"] = data.get("metadata", {}) | {
            "chosen": data["reference_solution"],
            "rejected": wrong,
        }
        items.append(data)
    lines = [(json.dumps(item) + "\n").encode() for item in items]
    task_set = setup["version"].task_set
    result = project_services.task_set_import(
        task_set=task_set, stream=lines, file_format="jsonl", by=setup["owner"]
    )
    return setup | {"version": result.version}


@pytest.mark.backend_independent
@pytest.mark.parametrize("method", ["sft", "dpo"])
def test_sft_and_dpo_runs_train_on_the_task_set_through_the_learner_and_succeed(
    tiny_model, hosts_with_a_peak, method
):
    setup = demo_project(tiny_model)
    if method == "dpo":
        setup = with_preference_pairs(setup)
    steps = 3
    body = run_body(setup, steps=steps) | {
        "method": method,
        "hyperparameters": {
            "batch_size": 4,
            "epochs": 10,
            "checkpoint_every": 2,
            "eval_every": 3,
            "eval_items": 4,
        },
    }
    response = api_client_for(setup["owner"]).post("/api/v1/runs", body, format="json")
    assert response.status_code == 201, response.json()
    run = wait_for_terminal(response.json()["id"])
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert (run.learner_step, run.policy_version) == (steps, steps)
    assert not Trajectory.objects.filter(run=run).exists()  # offline: nothing was rolled out
    assert sorted(Checkpoint.objects.filter(run=run).values_list("step", flat=True)) == [2, 3]
    losses = MetricPoint.objects.filter(run=run, name="learner/loss").order_by("step")
    assert list(losses.values_list("step", flat=True)) == [1, 2, 3]
    assert_device_figures(run, tiny_model, steps)
    assert_finished_with_its_outcome(run, steps, heldout=4)


def sft_body(setup: dict) -> dict:
    return run_body(setup, steps=2) | {
        "method": "sft",
        "hyperparameters": {
            "batch_size": 4,
            "epochs": 1,
            "checkpoint_every": 2,
            "eval_every": 2,
            "eval_items": 4,
        },
    }


def spare_learners(worker) -> list[psutil.Process]:
    spares = []
    for child in psutil.Process(worker.pid).children():
        try:
            argv = child.cmdline()
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            continue  # a learner that has just exited, not reaped yet
        if "run_learner" in argv and "--wait" in argv:
            spares.append(child)
    return spares


@pytest.mark.backend_independent
def test_runs_start_on_the_spare_learner_their_worker_keeps_loaded(tiny_model):
    """A learner worker loads a spare learner when it starts, and another after each learner: each
    run's learner is that process, which skips the seconds of loading Python, Django and torch."""
    host, rollout_host = Host(worker_env()), Host(worker_env())
    with hosts_killed(host, rollout_host):
        worker = host.worker("learner,control")
        rollout_host.worker("rollout,eval")
        wait_until(lambda: len(spare_learners(worker)) == 1, "a spare learner loaded at start", timeout=60)
        (at_start,) = spare_learners(worker)
        setup = demo_project(tiny_model)
        client = api_client_for(setup["owner"])
        first = wait_for_terminal(client.post("/api/v1/runs", sft_body(setup), format="json").json()["id"])
        assert (first.status, first.learner_pid) == (Run.Status.SUCCEEDED, at_start.pid), first.error
        wait_until(
            lambda: [spare.pid for spare in spare_learners(worker)] not in ([], [at_start.pid]),
            "another spare learner once the first run's learner exited",
            timeout=60,
        )
        (after_first,) = spare_learners(worker)
        second = wait_for_terminal(client.post("/api/v1/runs", sft_body(setup), format="json").json()["id"])
        assert (second.status, second.learner_pid) == (Run.Status.SUCCEEDED, after_first.pid), second.error


def mapped_files(process) -> set[str]:
    return {Path(mapping.path).name for mapping in psutil.Process(process.pid).memory_maps()}


@pytest.mark.backend_independent
def test_workers_that_sample_import_transformers_before_their_first_batch():
    """A rollout or eval worker has imported transformers (and so mapped the tokenizers library) by
    the time it says it is ready; a worker that only supervises learners has not."""
    host = Host(worker_env(FLYWHEEL_LEARNER_SPARE="false"))
    try:
        rollout, evaluation, learner = (
            host.worker("rollout"),
            host.worker("eval"),
            host.worker("learner,control"),
        )
        assert "tokenizers.abi3.so" in mapped_files(rollout)
        assert "tokenizers.abi3.so" in mapped_files(evaluation)
        assert "tokenizers.abi3.so" not in mapped_files(learner)
    finally:
        host.kill()

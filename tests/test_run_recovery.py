"""Recovery: kill -9 of the learner, of a rollout worker and of a whole worker host, and a Redis
restart, in the middle of real runs. Each run must finish with every step learned exactly once,
no episode lost or duplicated, and the restarts counted."""

import signal
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from projects.models import TaskSetVersion
from projects.services import DRAFT_MAX_AGE
from runs import lifecycle
from runs.models import MetricPoint, RolloutBatch, Run, Trajectory
from tests.conftest import api_client_for
from tests.cost_checks import assert_billed_once
from tests.run_harness import (
    Host,
    demo_project,
    learner_kill,
    run_body,
    tiny_model,
    wait_for_terminal,
    wait_until,
    worker_env,
)
from webapp.embedded_redis import redis_binary, redis_ping

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.ci_embedded_only]
__all__ = ["tiny_model"]
STEPS, BATCH, GROUP = 5, 4, 4


def submit(setup: dict, **hyperparameters) -> Run:
    body = run_body(setup, steps=STEPS, checkpoint_every=2, eval_every=100, **hyperparameters)
    response = api_client_for(setup["owner"]).post("/api/v1/runs", body, format="json")
    assert response.status_code == 201, response.json()
    return Run.objects.get(pk=response.json()["id"])


def assert_learned_exactly_once(run: Run) -> None:
    """Every step has its own batch, learned in that step only; no episode was stored twice;
    every episode of a step reached its learner step (learned, or dropped for a stated reason:
    a step that closed on half its groups fails here); only episodes of rolled-back policy
    versions were cancelled; one metric point per step."""
    assert run.status == Run.Status.SUCCEEDED, run.error
    live = Trajectory.objects.filter(run=run).exclude(outcome=Trajectory.Outcome.CANCELLED)
    for step in range(STEPS):
        episodes = live.filter(batch__step=step)
        batches = list(
            RolloutBatch.objects.filter(run=run, step=step).values_list("index", "policy_version", "status")
        )
        assert episodes.count() == BATCH * GROUP, f"step {step}: batches {batches}"
        assert set(episodes.exclude(learned_in_step=None).values_list("learned_in_step", flat=True)) <= {step}
    cancelled = Trajectory.objects.filter(run=run, outcome=Trajectory.Outcome.CANCELLED)
    assert not cancelled.exclude(learned_in_step=None).exists()
    assert not RolloutBatch.objects.filter(run=run, status=RolloutBatch.Status.RUNNING).exists()
    steps = list(MetricPoint.objects.filter(run=run, name="reward/mean").values_list("step", flat=True))
    assert sorted(steps) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        counted = MetricPoint.objects.filter(run=run, step=step, name__in=CONSUMED_METRICS)
        assert sum(counted.values_list("value", flat=True)) == BATCH * GROUP, f"step {step}"
    assert not run.events.filter(kind="straggler").exists()
    assert_billed_once(run)  # a step or batch run again after a kill is billed once


# What the learner did with each episode of a step: learned it, or dropped it with the reason.
CONSUMED_METRICS = ("episodes/learned", "dropped/errored", "dropped/zero_variance", "dropped/stale")


@pytest.fixture
def hosts():
    made: list[Host] = []

    def make(**env: str) -> Host:
        host = Host(worker_env(**env))
        made.append(host)
        return host

    yield make
    for host in made:
        host.kill()


def frozen_holding_a_batch(host: Host, run: Run) -> bool:
    """Freeze the host, then look: a batch it holds cannot finish between the look and the kill,
    however quick batches are. Thaws it again when it holds none."""
    host.send(signal.SIGSTOP)
    if RolloutBatch.objects.filter(run=run, step__gte=1, status=RolloutBatch.Status.RUNNING).exists():
        return True
    host.send(signal.SIGCONT)
    status = Run.objects.filter(pk=run.pk).values_list("status", flat=True).get()
    assert status not in Run.TERMINAL, f"the run ended ({status}) before a batch was caught in progress"
    return False


def at_step(run: Run, step: int) -> bool:
    return Run.objects.get(pk=run.pk).learner_step >= step


def test_a_learner_killed_mid_run_resumes_from_its_last_checkpoint(tiny_model, hosts):
    learner_host, rollout_host = hosts(), hosts()
    learner_host.worker("learner,control")
    rollout_host.worker("rollout,eval")
    run = submit(demo_project(tiny_model))
    wait_until(lambda: at_step(run, 3), "step 3, past the checkpoint at step 2")
    learner_kill(Run.objects.get(pk=run.pk))
    run = wait_for_terminal(run.pk)
    assert run.restarts == 1
    assert run.events.filter(kind="restart", level="warning").count() == 1
    assert_learned_exactly_once(run)


def test_a_rollout_worker_killed_mid_batch_is_reclaimed_within_the_deadline_and_nothing_is_lost(
    tiny_model, hosts
):
    """The production lease (30 s, renewed every 10 s by the worker) against the default episode
    deadline (120 s): the orphan batch is claimed again one lease after the kill, its step waits
    for it, and every episode of every step is generated and learned exactly once."""
    lease = 30
    learner_host, first_rollout_host = hosts(FLYWHEEL_ROLLOUT_LEASE_SECONDS=str(lease)), hosts()
    learner_host.worker("learner,control")
    first_rollout_host.worker("rollout,eval")
    # Longer completions than the other tests': a batch in progress is there to be caught for a
    # while, however loaded the machine (with 12 tokens a run once ended between two looks).
    run = submit(demo_project(tiny_model, max_new_tokens=48))
    assert run.resolved["episode_deadline_seconds"] == 120.0
    wait_until(lambda: frozen_holding_a_batch(first_rollout_host, run), "a batch of step 1+ in progress")
    orphans = list(RolloutBatch.objects.filter(run=run, step__gte=1, status=RolloutBatch.Status.RUNNING))
    first_rollout_host.kill()
    killed_at = timezone.now()
    hosts(FLYWHEEL_ROLLOUT_LEASE_SECONDS=str(lease)).worker("rollout,eval")
    run = wait_for_terminal(run.pk)
    assert run.restarts == 0
    for orphan in orphans:
        again = RolloutBatch.objects.get(pk=orphan.pk)
        assert again.attempts == orphan.attempts + 1 and again.status == RolloutBatch.Status.DONE
        reclaimed_after = (again.claimed_at - killed_at).total_seconds()
        # One lease after its last renewal, found within half a lease by the learner's check.
        assert reclaimed_after < lease * 1.5 + 5 < run.resolved["episode_deadline_seconds"], reclaimed_after
    assert_learned_exactly_once(run)


def test_a_whole_worker_host_killed_mid_run_is_restarted_by_the_watchdog(tiny_model, hosts, tmp_path):
    scheduler = hosts()
    scheduler.beat(tmp_path)
    doomed = hosts()
    doomed.worker("learner,control")
    doomed.worker("rollout,eval")
    run = submit(demo_project(tiny_model))
    wait_until(lambda: at_step(run, 3), "step 3")
    learner_kill(Run.objects.get(pk=run.pk))  # the learner lives on the doomed host too
    doomed.kill()
    replacement = hosts()
    replacement.worker("learner,control")
    replacement.worker("rollout,eval")
    run = wait_for_terminal(run.pk)
    assert run.restarts == 1
    assert run.events.filter(kind="restart", message__contains="heartbeats").exists()
    assert_learned_exactly_once(run)


def test_the_schedulers_pass_runs_on_its_own_worker_while_the_learner_worker_supervises_a_run(
    tiny_model, hosts, tmp_path
):
    """make up's layout: one solo learner worker, busy for as long as the run it supervises, and a
    control worker beside beat. The periodic pass (here: deleting a dead import's draft) runs
    while the run trains; on the learner queue it waited for the run's end."""
    host = hosts()
    host.beat(tmp_path)
    host.worker("learner")
    host.worker("control")
    host.worker("rollout,eval")
    setup = demo_project(tiny_model)
    body = run_body(setup, steps=200, checkpoint_every=100, eval_every=100)
    run = Run.objects.get(
        pk=api_client_for(setup["owner"]).post("/api/v1/runs", body, format="json").json()["id"]
    )
    wait_until(lambda: at_step(run, 1), "the run's first step: its learner worker is busy")
    dead_draft = TaskSetVersion.all_objects.create(
        task_set=setup["version"].task_set,
        published=False,
        draft_owner="another-host:1:0",
        content_hash="",
        item_count=0,
        created_at=timezone.now() - DRAFT_MAX_AGE - timedelta(minutes=1),
    )
    wait_until(
        lambda: not TaskSetVersion.all_objects.filter(pk=dead_draft.pk).exists(),
        "the pass deleting the draft",
    )
    training = Run.objects.get(pk=run.pk)
    assert (training.status, training.learner_step < 200) == (Run.Status.RUNNING, True)
    lifecycle.run_cancel(run=training)
    assert wait_for_terminal(run.pk).status == Run.Status.CANCELLED


def test_a_redis_restart_mid_run_loses_nothing(tiny_model, hosts, tmp_path):
    port = 6461
    url = f"redis://127.0.0.1:{port}/0"
    redis = start_redis(port, tmp_path)
    try:
        host = hosts(REDIS_URL=url)
        host.beat(tmp_path)
        host.worker("learner,control")
        host.worker("rollout,eval")
        run = submit_without_broker(demo_project(tiny_model))
        wait_until(lambda: at_step(run, 2), "step 2")
        redis.send_signal(signal.SIGTERM)  # a clean shutdown: Redis writes its append-only file
        redis.wait(timeout=20)
        redis = start_redis(port, tmp_path)
        run = wait_for_terminal(run.pk)
        assert run.restarts == 0
        assert_learned_exactly_once(run)
    finally:
        redis.send_signal(signal.SIGTERM)
        redis.wait(timeout=20)


def start_redis(port: int, folder: Path) -> subprocess.Popen:
    """A private Redis that persists to disk, as the embedded default's does."""
    process = subprocess.Popen(
        [
            redis_binary(),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(folder),
            "--appendonly",
            "yes",
            "--save",
            "",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    wait_until(lambda: redis_ping(port), "the private Redis", timeout=20)
    return process


def submit_without_broker(setup: dict) -> Run:
    """Create the run directly: this test's workers listen on their own Redis, which the
    scheduler's periodic tick (the beat on that Redis) picks the queued run up from."""
    from runs.lifecycle import RunRequest

    request = RunRequest(
        project=setup["project"],
        name="redis restart",
        task_set_version=setup["version"],
        reward_rule_version=setup["rule"].versions.get(),
        tier=setup["tier"],
        hyperparameters={
            "group_size": GROUP,
            "batch_size": BATCH,
            "staleness": 1,
            "checkpoint_every": 2,
            "eval_every": 100,
            "eval_items": 4,
            "episode_deadline_seconds": 3600,
        },
        max_steps=STEPS,
        monitor_actions={"nothing_to_learn": "alert"},  # machinery, not learning (run_body says why)
    )
    return lifecycle.run_create(request=request, by=setup["owner"])

"""The asynchronous pipeline: a step's items in small rollout batches that workers take as they
free up, rollouts running up to k versions ahead of the learner, and every episode learned at
most once, in its own step, within the staleness bound."""

import pytest
from django.db.models import Count

from runs.models import MetricPoint, RolloutBatch, Run, Trajectory
from tests.conftest import api_client_for
from tests.run_harness import (
    Host,
    demo_project,
    hosts_killed,
    run_body,
    tiny_model,
    wait_for_terminal,
    worker_env,
)
from workers.run_learner import batch_parts

__all__ = ["tiny_model"]


def test_rollout_batches_of_at_most_the_configured_items_split_each_kind_apart(settings):
    settings.FLYWHEEL_ROLLOUT_BATCH_ITEMS = 3
    items = [{"pk": n, "kind": "code"} for n in range(8)] + [{"pk": 9, "kind": "agent"}]
    assert batch_parts(items) == [[0, 3, 6], [1, 4, 7], [2, 5], [9]]


def test_without_a_batch_size_a_step_makes_one_batch_per_rollout_process(settings):
    settings.FLYWHEEL_ROLLOUT_BATCH_ITEMS = 0
    settings.FLYWHEEL_ROLLOUT_CONCURRENCY = 2
    assert batch_parts([{"pk": n, "kind": "code"} for n in range(5)]) == [[0, 2, 4], [1, 3]]


@pytest.fixture
def hosts():
    env = worker_env(FLYWHEEL_ROLLOUT_BATCH_ITEMS="1")
    learner_host, rollout_host = Host(env), Host(env)
    with hosts_killed(learner_host, rollout_host):
        learner_host.worker("learner,control")
        rollout_host.worker("rollout,eval")
        yield learner_host, rollout_host


def metric_by_step(run: Run, name: str) -> dict[int, float]:
    return dict(MetricPoint.objects.filter(run=run, name=name).values_list("step", "value"))


@pytest.mark.backend_independent
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(600)
def test_an_async_run_in_one_item_batches_learns_each_episode_once_within_the_staleness_bound(
    tiny_model, hosts
):
    setup = demo_project(tiny_model)
    steps, items, group, k = 4, 4, 4, 1
    body = run_body(setup, steps=steps, staleness=k, eval_every=steps, checkpoint_every=steps)
    response = api_client_for(setup["owner"]).post("/api/v1/runs", body, format="json")
    assert response.status_code == 201, response.json()
    run = wait_for_terminal(response.json()["id"])
    assert run.status == Run.Status.SUCCEEDED, run.error

    batches = RolloutBatch.objects.filter(run=run).exclude(status=RolloutBatch.Status.CANCELLED)
    per_step = dict(batches.values_list("step").annotate(n=Count("pk")))
    assert per_step == {step: items for step in range(steps)}  # one item each
    for step, version in batches.values_list("step", "policy_version"):
        assert step - k <= version <= step  # sampled at most k versions ahead of its step

    trajectories = Trajectory.objects.filter(run=run, batch__in=batches)
    assert trajectories.count() == steps * items * group  # each (batch, item, sample) once
    learned = trajectories.exclude(learned_in_step=None).select_related("batch")
    for trajectory in learned:
        assert trajectory.learned_in_step == trajectory.batch.step
        assert trajectory.policy_version >= trajectory.learned_in_step - k
    # Every episode of a step is either learned or dropped for a reason, exactly once.
    counted = metric_by_step(run, "episodes/learned")
    dropped = [metric_by_step(run, f"dropped/{why}") for why in ("errored", "zero_variance", "stale")]
    for step in range(steps):
        in_step = learned.filter(learned_in_step=step).count()
        assert counted[step + 1] == in_step
        assert in_step + sum(d[step + 1] for d in dropped) == items * group
    assert sum(counted.values()) == learned.count()

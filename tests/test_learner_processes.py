"""A run's learner on two processes (`accelerate launch`, DDP over gloo on the CPU) through the
real workers: the same weights as one process with the same global batch, and a rank killed with
kill -9 takes the group down and the supervisor resumes it from the last checkpoint."""

import signal

import psutil
import pytest
import torch

from inference.policy import policy_load
from rewards import services as reward_services
from runs.models import Run, Trajectory
from runs.run_store import policy_dir
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

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(900),
    pytest.mark.backend_independent,
]
__all__ = ["tiny_model"]


@pytest.fixture
def hosts():
    learner_host, rollout_host = Host(worker_env()), Host(worker_env())
    with hosts_killed(learner_host, rollout_host):
        learner_host.worker("learner,control")
        rollout_host.worker("rollout,eval")
        yield learner_host, rollout_host


# A graded reward (the tiny model rarely passes unit tests): every group has some variance to learn from.
SIMILARITY = {
    "type": "text_similarity",
    "name": "similar",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.reference_solution }}",
    "evaluation_metric": "fuzzy_match",
}


def submit(model, *, steps: int, **hyperparameters) -> Run:
    setup = demo_project(model)
    setup["rule"] = reward_services.reward_rule_create(
        project=setup["project"], name="similar", spec=SIMILARITY, by=setup["owner"]
    )
    body = run_body(setup, steps=steps, eval_every=100, learning_rate=0.01, **hyperparameters)
    response = api_client_for(setup["owner"]).post("/api/v1/runs", body, format="json")
    assert response.status_code == 201, response.json()
    return Run.objects.get(pk=response.json()["id"])


def episodes(run: Run) -> list[tuple]:
    rows = Trajectory.objects.filter(run=run)
    fields = ("batch__step", "item__position", "sample_index", "reward", "learned_in_step")
    return sorted(rows.values_list(*fields))


def weights(run: Run, version: int) -> dict[str, torch.Tensor]:
    return policy_load(policy_dir(run.pk, version)).model.state_dict()


def test_two_learner_processes_reach_the_weights_of_one_with_the_same_global_batch(tiny_model, hosts):
    # Two steps, both sampled by v0 (staleness 1): the two runs learn from the same episodes.
    # One process accumulates 2 micro-batches; two processes take one each (the same global batch).
    one = submit(tiny_model, steps=2, checkpoint_every=1, learner_processes=1, gradient_accumulation=2)
    # The two processes also split their rows into token-budget parts (one all-reduce per micro-batch).
    two = submit(
        tiny_model,
        steps=2,
        checkpoint_every=1,
        learner_processes=2,
        gradient_accumulation=1,
        micro_batch_tokens=64,
    )
    one, two = wait_for_terminal(one.pk), wait_for_terminal(two.pk)
    assert (one.status, two.status) == (Run.Status.SUCCEEDED, Run.Status.SUCCEEDED), (one.error, two.error)
    for run in (one, two):
        assert run.restarts == 0
        learned = Trajectory.objects.filter(run=run).exclude(learned_in_step=None)
        assert learned.exists(), "nothing was learned"
    assert episodes(one) == episodes(two)  # the same episodes: any difference is the learner's
    base, after_one, after_two = weights(one, 0), weights(one, 2), weights(two, 2)
    assert any(not torch.equal(base[name], after_one[name]) for name in base)
    for name in base:
        torch.testing.assert_close(after_two[name], after_one[name], rtol=1e-4, atol=1e-5, msg=name)


def test_a_rank_killed_with_kill_9_takes_the_group_down_and_it_resumes_from_the_checkpoint(tiny_model, hosts):
    run = submit(tiny_model, steps=4, checkpoint_every=1, learner_processes=2)
    wait_until(lambda: Run.objects.get(pk=run.pk).learner_step >= 2, "step 2, past a checkpoint")
    leader = psutil.Process(Run.objects.get(pk=run.pk).learner_pid)
    (follower,) = [rank for rank in leader.parent().children() if rank.pid != leader.pid]
    follower.send_signal(signal.SIGKILL)
    run = wait_for_terminal(run.pk)
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert run.restarts == 1 and run.learner_step == 4
    learned = Trajectory.objects.filter(run=run).exclude(learned_in_step=None)
    assert sorted(set(learned.values_list("learned_in_step", flat=True))) <= [0, 1, 2, 3]
    for trajectory in learned.select_related("batch"):
        assert trajectory.batch.step == trajectory.learned_in_step  # each step's episodes, once

"""The learner registry: a method is what is registered (runs/learners.py), and an algorithm a
team adds in one module of its own (tests/toy_reinforce.py) launches over REST, trains through
the real workers and a real learner process, and succeeds."""

import importlib

import pytest

from runs.learners import algorithm_get, algorithm_names, algorithm_register, algorithm_unregister, params_of
from runs.models import Checkpoint, MetricPoint, Run, Trajectory
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

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["tiny_model"]


def test_the_built_in_methods_are_registered_with_their_own_hyperparameters():
    assert algorithm_names()[:4] == ["grpo", "external_rollouts", "sft", "dpo"]
    assert {"group_size", "tis_cap", "learning_rate"} <= set(params_of("grpo"))
    assert "group_size" not in params_of("sft") and "beta" in params_of("dpo")
    assert algorithm_get("grpo").distributed and not algorithm_get("sft").online


@pytest.fixture
def toy():
    module = importlib.import_module("tests.toy_reinforce")
    algorithm_register(module.TOY)  # again, if an earlier test unregistered it
    yield module.TOY
    algorithm_unregister(module.TOY.name)


@pytest.fixture
def hosts():
    env = worker_env(FLYWHEEL_LEARNERS_EXTRA="tests.toy_reinforce")
    learner_host, rollout_host = Host(env), Host(env)
    with hosts_killed(learner_host, rollout_host):
        learner_host.worker("learner,control")
        rollout_host.worker("rollout,eval")
        yield


def fields_of(body: dict) -> dict[str, str]:
    """{field: message} of an error answer's details."""
    return {detail["param"]: detail["message"] for detail in body["error"]["details"]}


def toy_body(setup: dict, steps: int) -> dict:
    body = run_body(setup, steps=steps, checkpoint_every=steps, eval_every=steps)
    hyper = {name: value for name, value in body["hyperparameters"].items() if name != "kl_coef"}
    return body | {"method": "toy_reinforce", "hyperparameters": hyper | {"baseline": 0.25}}


@pytest.mark.backend_independent
def test_an_algorithm_registered_in_its_own_module_trains_through_the_real_workers(tiny_model, toy, hosts):
    setup = demo_project(tiny_model)
    steps = 2
    response = api_client_for(setup["owner"]).post("/api/v1/runs", toy_body(setup, steps), format="json")
    assert response.status_code == 201, response.json()
    run = wait_for_terminal(response.json()["id"])
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert run.method == "toy_reinforce" and run.resolved["baseline"] == 0.25
    assert (run.learner_step, run.policy_version) == (steps, steps)
    learned = {
        step: Trajectory.objects.filter(run=run, learned_in_step=step).count() for step in range(steps)
    }
    rows = dict(MetricPoint.objects.filter(run=run, name="learner/toy_rows").values_list("step", "value"))
    # The toy's own figure, from its own learn_batch: every episode it kept, step by step.
    assert rows == {step + 1: float(count) for step, count in learned.items()} and all(learned.values())
    assert Checkpoint.objects.filter(run=run, step=steps).exists()


def test_an_unknown_method_and_a_foreign_hyperparameter_are_refused_by_name(tiny_model, toy):
    setup = demo_project(tiny_model)
    client = api_client_for(setup["owner"])
    unknown = client.post("/api/v1/runs", toy_body(setup, 1) | {"method": "ppo"}, format="json")
    assert unknown.status_code == 400
    assert fields_of(unknown.json()) == {"method": '"ppo" is not a valid choice.'}
    body = toy_body(setup, 1)
    body["hyperparameters"] |= {"kl_coef": 0.1, "baseline": 99}
    refused = client.post("/api/v1/runs", body, format="json")
    assert refused.status_code == 400
    assert fields_of(refused.json()) == {
        "hyperparameters.kl_coef": "not a hyperparameter of toy_reinforce",
        "hyperparameters.baseline": "must be at most 10",
    }
    assert not Run.objects.filter(project=setup["project"]).exists()

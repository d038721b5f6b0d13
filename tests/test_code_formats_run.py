"""Per-test results from real rollouts: a GRPO run through real Celery workers, a real learner and
real sandboxes, on a task set holding one item of each test format, stores each test's outcome on
its trajectories, and the trajectory page, the replay's data and the steps API show them."""

import json
import uuid

import pytest
from django.test import Client

from projects import services as project_services
from rewards import services as reward_services
from runs.models import Run, Trajectory
from tests.conftest import api_client_for, make_project, make_user
from tests.run_harness import Host, hosts_killed, run_body, tiny_model, wait_for_terminal, worker_env
from tests.test_code_formats import FIRST_TEST, LINES
from tiers import services as tier_services

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["tiny_model"]
TEST_NAMES = {
    "flywheel": ["line 3", "line 4"],
    "candidate": ["check line 5", "check line 6"],
    "namespace": ["line 1", "line 2"],
    "io": ["case 1", "case 2"],
    "pytest": ["test_add.py::test_small", "test_add.py::test_equal"],
}


def formats_project(model) -> dict:
    owner = make_user(f"owner-{uuid.uuid4().hex[:6]}")
    project = make_project(owner, name=f"formats-{uuid.uuid4().hex[:6]}")
    task_set = project_services.task_set_create(project=project, name="formats", by=owner)
    items = [
        {"id": f"{name}-{split}", "kind": "code", "prompt": "Write add(a, b).", "split": split, **LINES[name]}
        for split in ("train", "heldout")
        for name in LINES
    ]
    lines = [(json.dumps(item) + "\n").encode() for item in items]
    version = project_services.task_set_import(
        task_set=task_set, stream=lines, file_format="jsonl", by=owner
    ).version
    rule = reward_services.reward_rule_create(
        project=project,
        name="tests",
        spec={"type": "unit_tests", "name": "tests", "score": "pass_rate"},
        by=owner,
    )
    tier = tier_services.tier_create(
        project=project, by=owner, name="rollout", base_model=str(model), temperature=1.0, max_new_tokens=8
    )
    return {"owner": owner, "project": project, "version": version, "rule": rule, "tier": tier}


@pytest.fixture
def host():
    host = Host(worker_env())
    with hosts_killed(host):
        host.worker("learner,control")
        host.worker("rollout,eval")
        yield host


@pytest.mark.backend_independent
def test_a_grpo_run_stores_and_shows_each_tests_outcome_in_every_format(tiny_model, host):
    setup = formats_project(tiny_model)
    body = run_body(setup, steps=1, group_size=2, batch_size=5, eval_items=2, eval_every=100)
    client = api_client_for(setup["owner"])
    response = client.post("/api/v1/runs", body, format="json")
    assert response.status_code == 201, response.json()
    run = wait_for_terminal(response.json()["id"])
    assert run.status == Run.Status.SUCCEEDED, run.error
    trajectories = Trajectory.objects.filter(run=run, outcome="scored").select_related("item")
    web = Client()
    web.force_login(setup["owner"])
    seen = set()
    for trajectory in trajectories:
        test_format = trajectory.item.external_id.rsplit("-", 1)[0]
        [step] = trajectory.steps.all()
        result = step.data()["tool_result"]
        assert [test["name"] for test in result["tests"]] == TEST_NAMES[test_format]
        assert result["stop_reason"] in ("exited", "timeout", "out_of_memory", "output_cap", "killed")
        assert all(set(test) >= {"name", "passed", "outcome", "message"} for test in result["tests"])
        passed = sum(test["passed"] for test in result["tests"])
        assert trajectory.reward == passed / 2 or trajectory.flags  # floored by a high-confidence flag
        api = client.get(f"/api/v1/trajectories/{trajectory.pk}/steps").json()
        assert api["results"][0]["data"]["tool_result"]["tests"] == result["tests"]
        page = web.get(f"/trajectories/{trajectory.pk}/").content.decode()
        assert 'id="tests"' in page and FIRST_TEST[test_format] in page
        seen.add(test_format)
    assert seen == set(LINES)

"""Reviews to the next run, end to end through real workers: a GRPO run's trajectories are
reviewed; the reviews' DPO and SFT exports, imported as task sets, train DPO and SFT runs; and
Train on reviews launches a DPO run from the GRPO run's final checkpoint beside its control (GRPO
from the same checkpoint, no reviews), and reports the lift over the control. Each run goes through
the real learner process, which would crash on a pair field that is not a text."""

import json
import math
from collections import defaultdict

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from rewards import services as reward_services
from runs import tasks
from runs.models import MetricPoint, Run, Trajectory
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
        yield


def review(client, run: Run) -> int:
    """Per prompt: the best completion good, a worse different one bad, and that as a preference
    too for every other prompt. Returns how many prompts got a pair."""
    by_item = defaultdict(list)
    for trajectory in Trajectory.objects.filter(run=run, outcome="scored").order_by("pk"):
        by_item[trajectory.item_id].append(trajectory)
    paired = 0
    for index, samples in enumerate(by_item.values()):
        samples.sort(key=lambda t: (-t.reward, t.pk))
        best = samples[0]
        worse = [
            t for t in samples[1:] if t.completion_text.strip() and t.completion_text != best.completion_text
        ]
        if not best.completion_text.strip() or not worse:
            continue
        paired += 1
        for trajectory, label in ((best, "good"), (worse[-1], "bad")):
            answer = client.post(
                "/api/v1/reviews", {"trajectory": trajectory.pk, "label": label}, format="json"
            )
            assert answer.status_code == 201
        if index % 2:
            body = {"chosen": best.pk, "rejected": worse[0].pk}
            assert client.post("/api/v1/preferences", body, format="json").status_code == 201
    return paired


def exported_task_set(client, run: Run, kind: str, project) -> tuple[int, int]:
    """(version id, lines) of the run's export imported as a task set, as a user would do it."""
    response = client.get("/api/v1/reviews/export", {"run": run.pk, "kind": kind})
    content = b"".join(response.streaming_content)
    lines = [json.loads(line) for line in content.decode().splitlines()]
    assert len(lines) == int(response["Flywheel-Export-Lines"]) > 0
    created = client.post(
        "/api/v1/task-sets", {"project": project.pk, "name": f"reviewed {kind}"}, format="json"
    )
    imported = client.post(
        f"/api/v1/task-sets/{created.json()['id']}/import",
        {"file": SimpleUploadedFile(f"{kind}.jsonl", content)},
        format="multipart",
    )
    assert imported.status_code == 201, imported.json()
    return imported.json()["id"], len(lines)


def offline_body(setup: dict, version_id: int, rule_version_id: int, method: str) -> dict:
    return run_body(setup, steps=2) | {
        "name": f"{method} on the export",
        "method": method,
        "task_set_version": version_id,
        "reward_rule_version": rule_version_id,
        "eval_split": "train",  # an export holds reviewed training data only
        "hyperparameters": {
            "batch_size": 4,
            "epochs": 4,
            "checkpoint_every": 2,
            "eval_every": 2,
            "eval_items": 4,
        },
    }


def assert_trained(run_id: int, steps: int) -> Run:
    run = wait_for_terminal(run_id)
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert (run.learner_step, run.policy_version) == (steps, steps)
    losses = list(
        MetricPoint.objects.filter(run=run, name="learner/loss")
        .order_by("step")
        .values_list("value", flat=True)
    )
    assert len(losses) == steps and all(math.isfinite(loss) for loss in losses)
    return run


def test_reviews_train_dpo_and_sft_runs_through_the_real_workers(tiny_model, hosts):
    setup = demo_project(tiny_model, train_size=8, heldout_size=4)
    owner = api_client_for(setup["owner"])
    grpo = owner.post(
        "/api/v1/runs", run_body(setup, steps=2, checkpoint_every=2, eval_every=2), format="json"
    )
    assert grpo.status_code == 201, grpo.json()
    parent = assert_parent(grpo.json()["id"])
    assert review(owner, parent) >= 2

    answer_rule = reward_services.reward_rule_create(
        project=setup["project"],
        name="matches the reviewed answer",
        spec={
            "type": "string_check",
            "name": "exact",
            "input": "{{sample.output_text}}",
            "reference": "{{item.reference}}",
            "operation": "eq",
        },
        by=setup["owner"],
    ).versions.get()
    # One after the other: a project runs one run at a time, and no scheduler tick runs here.
    for kind, method in (("dpo-task-set", "dpo"), ("sft", "sft")):
        version_id, _ = exported_task_set(owner, parent, kind, setup["project"])
        body = offline_body(setup, version_id, answer_rule.pk, method)
        response = owner.post("/api/v1/runs", body, format="json")
        assert response.status_code == 201, response.json()
        assert_trained(response.json()["id"], steps=2)

    trained = owner.post(
        f"/api/v1/runs/{parent.pk}/train-on-reviews", {"method": "dpo", "max_steps": 2}, format="json"
    )
    assert trained.status_code == 201, trained.json()
    body = trained.json()
    assert body["counts"]["pairs"] >= 2 and body["counts"]["heldout_items"] == 4
    child = assert_trained(body["run"]["id"], steps=2)
    final = parent.checkpoints.order_by("-step").first()
    assert (child.parent_id, child.parent_checkpoint_id) == (parent.pk, final.pk)
    assert child.learner_step == 2 and child.task_set_version.split_counts["heldout"] == 4
    # Evaluated on the parent's held-out items, so the two pass rates compare like for like.
    wait_until(
        lambda: MetricPoint.objects.filter(run=child, name="heldout/pass_rate", step=2).exists(),
        "the child's held-out evaluation",
        timeout=120,
    )
    # The control waits for the project's one active run; the scheduler's tick (beat's, in a
    # deployment) admits it once the reviews run has finished.
    tasks.runs_schedule.delay()
    control = assert_parent(body["control"]["id"])
    assert (control.method, control.parent_id, control.parent_checkpoint_id) == ("grpo", parent.pk, final.pk)
    assert (control.learner_step, control.max_steps) == (2, 2)
    assert control.task_set_version_id == parent.task_set_version_id
    # Greedy evaluation of the same checkpoint on the same items: both start from the same figure.
    assert control.outcome_detail["before"] == child.outcome_detail["before"]
    result = owner.get(body["result_url"]).json()
    lift = result["lift_over_control"]
    assert (result["status"], lift["items"], lift["run_step"], lift["control_step"]) == ("complete", 4, 2, 2)
    assert (lift["before"], lift["after"]) == (control.outcome_detail["after"], child.outcome_detail["after"])
    assert result["regressed"] == (child.outcome == "regressed")


def assert_parent(run_id: int) -> Run:
    run = wait_for_terminal(run_id)
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert run.checkpoints.exists()
    return run

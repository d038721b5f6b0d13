"""Reward models through the product: REST (roles per project, refusals naming the field), a version
trained by a real learner process on the learner queue with its held-out pair accuracy on the page
and in REST, and a GRPO run through real workers whose reward is the reward model's score."""

import json
from pathlib import Path

import pytest
from django.test import Client

from projects import services as project_services
from reward_models.models import RewardModel, RewardModelVersion, RunRewardModel
from reward_models.store import model_local
from rewards import services as reward_services
from runs.models import MetricPoint, Run
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
from workers.learners.common import epoch_rows
from workers.learners.reward_model import RewardModelConfig, pair_accuracy, reward_learner_create, reward_step

__all__ = ["tiny_model"]


def cut(solution: str) -> str:
    words = solution.split()
    return " ".join(words[: max(1, len(words) // 2)])


def with_pairs(setup: dict) -> dict:
    """The demo items, each with its reference solution chosen over the same solution cut short."""
    items = []
    for item in setup["version"].items.order_by("position"):
        data = item.data | {"id": item.external_id, "kind": item.kind, "split": item.split}
        solution = data["reference_solution"]
        data["metadata"] = data.get("metadata", {}) | {"chosen": solution, "rejected": cut(solution)}
        items.append(data)
    lines = [(json.dumps(item) + "\n").encode() for item in items]
    task_set = setup["version"].task_set
    result = project_services.task_set_import(
        task_set=task_set, stream=lines, file_format="jsonl", by=setup["owner"]
    )
    return setup | {"version": result.version}


# --- REST and roles (no workers) ---------------------------------------------------------------


@pytest.mark.django_db
def test_reward_models_over_rest_check_the_callers_role_and_name_bad_fields(team, tmp_path):
    project = team["project"]
    owner, viewer, outsider = team["owner"], team["viewer"], team["outsider"]
    task_set = project_services.task_set_create(project=project, name="plain", by=owner)
    line = json.dumps({"id": "a", "kind": "answer", "prompt": "2+2?", "reference": "4"}) + "\n"
    plain = project_services.task_set_import(
        task_set=task_set, stream=[line.encode()], file_format="jsonl", by=owner
    )

    refused = api_client_for(viewer).post(
        "/api/v1/reward-models", {"project": project.pk, "name": "rm"}, format="json"
    )
    assert refused.status_code == 403
    assert not RewardModel.objects.exists()
    created = api_client_for(owner).post(
        "/api/v1/reward-models", {"project": project.pk, "name": "rm"}, format="json"
    )
    assert created.status_code == 201, created.json()
    reward_model_id = created.json()["id"]
    assert created.json()["latest_version"] is None
    again = api_client_for(owner).post(
        "/api/v1/reward-models", {"project": project.pk, "name": "rm"}, format="json"
    )
    assert again.status_code == 400 and again.json()["error"]["param"] == "name"

    assert api_client_for(viewer).get(f"/api/v1/reward-models/{reward_model_id}").status_code == 200
    assert api_client_for(outsider).get(f"/api/v1/reward-models/{reward_model_id}").status_code == 404
    assert api_client_for(outsider).get("/api/v1/reward-models").json()["results"] == []

    train = f"/api/v1/reward-models/{reward_model_id}/train"
    body = {"task_set_version": plain.version.pk, "base_model": str(tmp_path)}
    assert api_client_for(viewer).post(train, body, format="json").status_code == 403
    no_pairs = api_client_for(owner).post(train, body, format="json")
    assert no_pairs.status_code == 400
    assert no_pairs.json()["error"]["param"] == "task_set_version"
    assert "preference pairs" in no_pairs.json()["error"]["message"]
    bad_hyper = api_client_for(owner).post(train, body | {"hyperparameters": {"beta": 1}}, format="json")
    assert "hyperparameters.beta" in json.dumps(bad_hyper.json())
    other = project_services.task_set_create(project=team["other_project"], name="theirs", by=outsider)
    theirs = project_services.task_set_import(
        task_set=other, stream=[line.encode()], file_format="jsonl", by=outsider
    )
    foreign = api_client_for(owner).post(train, body | {"task_set_version": theirs.version.pk}, format="json")
    assert foreign.status_code == 400 and foreign.json()["error"]["param"] == "task_set_version"
    assert not RewardModelVersion.objects.exists()

    paths = api_client_for(viewer).get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()["paths"]
    for path in (
        "/api/v1/reward-models",
        "/api/v1/reward-models/{id}",
        "/api/v1/reward-models/{id}/train",
        "/api/v1/reward-models/{id}/versions",
        "/api/v1/reward-model-versions/{id}",
        "/api/v1/reward-model-versions/{id}/cancel",
        "/api/v1/runs/{id}/reward-models",
    ):
        assert path in paths


# --- through the workers ---------------------------------------------------------------------


@pytest.mark.backend_independent
@pytest.mark.django_db(transaction=True)
def test_a_version_trains_in_a_learner_process_and_reports_held_out_pair_accuracy(tiny_model):
    setup = with_pairs(demo_project(tiny_model, train_size=32, heldout_size=16))
    owner = setup["owner"]
    client = api_client_for(owner)
    created = client.post(
        "/api/v1/reward-models", {"project": setup["project"].pk, "name": "prefs"}, format="json"
    )
    host = Host(worker_env())
    with hosts_killed(host):
        host.worker("learner,control")
        response = client.post(
            f"/api/v1/reward-models/{created.json()['id']}/train",
            {
                "task_set_version": setup["version"].pk,
                "tier": setup["tier"].pk,
                "hyperparameters": {"learning_rate": 0.003, "epochs": 6, "batch_size": 8},
            },
            format="json",
        )
        assert response.status_code == 201, response.json()
        assert response.json()["status"] == "queued" and response.json()["number"] == 1
        version_id = response.json()["id"]
        wait_until(
            lambda: RewardModelVersion.objects.get(pk=version_id).is_terminal, "the reward model's training"
        )
    version = RewardModelVersion.objects.get(pk=version_id)
    assert version.status == "succeeded", version.error
    assert (version.train_pairs, version.heldout_pairs, version.step, version.steps) == (32, 16, 24, 24)
    assert version.heldout_accuracy >= 0.8 > 0.5
    assert version.path == f"reward_models/{version.pk}-{version.key}/model"  # in the artifact storage
    assert Path(model_local(version.path), "config.json").exists()
    body = client.get(f"/api/v1/reward-model-versions/{version_id}").json()
    assert body["heldout_accuracy"] == version.heldout_accuracy
    assert body["chance_accuracy"] == 0.5
    assert [point["step"] for point in body["history"]] == list(range(1, 25))
    browser = Client()
    browser.force_login(owner)
    page = browser.get(f"/reward-model-versions/{version_id}/").content.decode()
    assert f"{version.heldout_accuracy:.3f}" in page


def trained_version(setup: dict, tiny_model: Path, folder: Path) -> RewardModelVersion:
    """A reward-model version trained in this process (the learner test above covers the queue)."""
    pairs = [
        {
            "prompt": item.data["prompt"],
            "chosen": item.data["metadata"]["chosen"],
            "rejected": item.data["metadata"]["rejected"],
        }
        for item in setup["version"].items.filter(split="train")
    ]
    config = RewardModelConfig(
        model=str(tiny_model), output_dir=str(folder / "learner"), steps=16, learning_rate=3e-3
    )
    learner = reward_learner_create(config)
    for step in range(config.steps):
        reward_step(learner, pairs, epoch_rows(len(pairs), config.batch_size, config.seed, step), config)
    learner.model.save_pretrained(folder / "model")
    learner.tokenizer.save_pretrained(folder / "model")
    reward_model = RewardModel.objects.create(project=setup["project"], name="prefs")
    return RewardModelVersion.objects.create(
        reward_model=reward_model,
        number=1,
        status="succeeded",
        task_set_version=setup["version"],
        base_model=str(tiny_model),
        path=str(folder / "model"),
        heldout_accuracy=pair_accuracy(learner.model, learner.tokenizer, pairs),
    )


@pytest.mark.backend_independent
@pytest.mark.django_db(transaction=True)
def test_grpo_against_a_reward_model_raises_its_score_and_the_run_links_the_version(tiny_model, tmp_path):
    setup = with_pairs(demo_project(tiny_model, train_size=16, heldout_size=4))
    version = trained_version(setup, tiny_model, tmp_path)
    # The reward model's score is the reward; the unit tests run beside it with no weight, so the
    # held-out evaluation reports each grader's mean (the real pass rate beside the learned score).
    spec = {
        "type": "multi",
        "name": "learned",
        "graders": {
            "rm": {"type": "reward_model", "name": "rm", "model": "prefs"},
            "tests": {"type": "unit_tests", "name": "tests", "score": "all_pass"},
        },
        "calculate_output": "rm",
    }
    rule = reward_services.reward_rule_create(
        project=setup["project"], name="learned", spec=spec, by=setup["owner"]
    )
    steps = 10
    body = run_body(setup, steps=steps, learning_rate=0.01, eval_every=steps, checkpoint_every=steps)
    body["reward_rule_version"] = rule.versions.get().pk
    hosts = [Host(worker_env()), Host(worker_env())]
    with hosts_killed(*hosts):
        hosts[0].worker("learner,control")
        hosts[1].worker("rollout,eval")
        response = api_client_for(setup["owner"]).post("/api/v1/runs", body, format="json")
        assert response.status_code == 201, response.json()
        run = wait_for_terminal(response.json()["id"])
        evaluated = MetricPoint.objects.filter(run=run, name="heldout/reward/tests", step__in=(0, steps))
        wait_until(lambda: evaluated.count() == 2, "the held-out evaluations before and after")
    assert run.status == Run.Status.SUCCEEDED, run.error
    rewards = list(
        MetricPoint.objects.filter(run=run, name="reward/mean")
        .order_by("step")
        .values_list("value", flat=True)
    )
    assert len(rewards) == steps
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first, rewards
    for step in (0, steps):
        held = dict(
            MetricPoint.objects.filter(run=run, step=step, name__startswith="heldout/reward").values_list(
                "name", "value"
            )
        )
        assert set(held) == {"heldout/reward", "heldout/reward/rm", "heldout/reward/tests"}, held
        assert held["heldout/reward"] == pytest.approx(held["heldout/reward/rm"])
        assert 0.0 <= held["heldout/reward/tests"] <= 1.0
    assert list(RunRewardModel.objects.filter(run=run).values_list("version", flat=True)) == [version.pk]
    uses = api_client_for(setup["owner"]).get(f"/api/v1/runs/{run.pk}/reward-models").json()["results"]
    assert [(use["reward_model_name"], use["number"]) for use in uses] == [("prefs", 1)]
    browser = Client()
    browser.force_login(setup["owner"])
    page = browser.get(f"/runs/{run.pk}/").content.decode()
    assert f'href="/reward-model-versions/{version.pk}/"' in page


@pytest.mark.django_db
def test_reward_model_pages_check_the_role_and_create_from_the_form(team):
    project, owner, viewer, outsider = team["project"], team["owner"], team["viewer"], team["outsider"]
    browser = Client()
    browser.force_login(viewer)
    assert browser.get(f"/projects/{project.pk}/reward-models/").status_code == 200
    refused = browser.post(f"/projects/{project.pk}/reward-models/new/", {"name": "rm"})
    assert refused.status_code == 403 and not RewardModel.objects.exists()
    browser.force_login(owner)
    created = browser.post(f"/projects/{project.pk}/reward-models/new/", {"name": "rm"})
    reward_model = RewardModel.objects.get()
    assert created.status_code == 302 and created["Location"] == f"/reward-models/{reward_model.pk}/"
    page = browser.get(f"/reward-models/{reward_model.pk}/").content.decode()
    assert "No versions yet" in page and "Train a new version" in page
    browser.force_login(outsider)
    assert browser.get(f"/reward-models/{reward_model.pk}/").status_code == 404
    assert browser.get(f"/projects/{project.pk}/reward-models/").status_code == 404


@pytest.mark.django_db
def test_rewards_scores_reward_model_graders_through_the_scorer_reward_models_registers(team):
    """rewards imports nothing of reward_models: a dry-run reaches the project's reward models through
    the scorer registered at startup, whose answer for a name with no trained version is its own."""
    rule = reward_services.reward_rule_create(
        project=team["project"],
        name="learned",
        spec={"type": "reward_model", "name": "rm", "model": "absent"},
        by=team["owner"],
    )
    body = (
        api_client_for(team["owner"])
        .post(
            f"/api/v1/reward-rules/{rule.pk}/dry-run",
            {"items": [{"id": "q1", "kind": "answer", "prompt": "1+1=", "reference": "2"}], "samples": ["2"]},
            format="json",
        )
        .json()
    )
    result = body["results"][0]["result"]
    assert body["summary"]["errored"] == 1
    assert [error["message"] for error in result["errors"]] == [
        "the project has no trained version of reward model 'absent'"
    ]

"""Reward-model training users can trust: a learner killed with -9 mid-training resumes at its last
epoch checkpoint (not at step 0), a whole host lost is re-queued by the watchdog and resumes from the
checkpoint in the artifact storage, the version's page follows the training live (its progress
JSON), and REST scores texts and pairs with a trained version (bounded, role-checked, in the schema,
with a client method)."""

import json
import os
import shutil
import signal

import pytest
from django.test import Client

from core.artifacts import ArtifactMissingError, artifact_manifest, artifact_put
from projects import services as project_services
from projects.models import Membership
from reward_models.models import RewardModel, RewardModelVersion
from reward_models.services import reward_model_version_cancel
from reward_models.store import checkpoint_prefix, log_path, version_dir
from tests.conftest import api_client_for, make_user
from tests.run_harness import Host, demo_project, tiny_model, wait_until, worker_env
from tests.test_reward_models import trained_version, with_pairs
from workers.supervisor import reward_models_watchdog

pytestmark = pytest.mark.backend_independent

__all__ = ["tiny_model"]
TRAIN, HELDOUT, BATCH, EPOCHS = 32, 16, 8, 30
STEPS_PER_EPOCH = TRAIN // BATCH
STEPS = EPOCHS * STEPS_PER_EPOCH


def train(setup: dict) -> int:
    client = api_client_for(setup["owner"])
    created = client.post(
        "/api/v1/reward-models", {"project": setup["project"].pk, "name": "prefs"}, format="json"
    )
    response = client.post(
        f"/api/v1/reward-models/{created.json()['id']}/train",
        {
            "task_set_version": setup["version"].pk,
            "tier": setup["tier"].pk,
            "hyperparameters": {"learning_rate": 0.003, "epochs": EPOCHS, "batch_size": BATCH},
        },
        format="json",
    )
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def frozen_past_a_checkpoint(version_id: int) -> bool:
    """Freeze the learner, then look: it cannot move on between the look and the kill, however
    quick its steps are. Thaws it again while it has no checkpoint behind it yet."""
    version = RewardModelVersion.objects.get(pk=version_id)
    if version.learner_pid is None or version.status != "running":
        return False
    os.kill(version.learner_pid, signal.SIGSTOP)
    version.refresh_from_db()
    if 0 < version.checkpoint_step < version.step < STEPS:
        return True
    os.kill(version.learner_pid, signal.SIGCONT)
    return False


def assert_resumed_once(version: RewardModelVersion, killed: RewardModelVersion) -> int:
    """Trained to the end, every step once in the history; the steps up to the checkpoint the kill
    left were trained by the first learner and kept, the rest by the restarted one. Returns the
    step it resumed at."""
    assert version.status == "succeeded", version.error
    assert version.restarts == 1
    assert [entry["step"] for entry in version.history] == list(range(1, STEPS + 1))
    first = sum(entry["restart"] == 0 for entry in version.history)
    assert [entry["restart"] for entry in version.history] == [0] * first + [1] * (STEPS - first)
    # It resumed at the checkpoint the dead learner had recorded, an epoch's end, not at step 0.
    assert first == killed.checkpoint_step and first % STEPS_PER_EPOCH == 0 and first > 0
    log = log_path(version.pk, version.key).read_text()
    assert f"resumed at step {first} (restart 1)" in log
    assert version.heldout_accuracy is not None and version.checkpoint_path == ""
    epochs = [entry for entry in version.history if "heldout_accuracy" in entry]
    assert [entry["step"] for entry in epochs] == list(range(STEPS_PER_EPOCH, STEPS + 1, STEPS_PER_EPOCH))
    return first


@pytest.mark.django_db(transaction=True)
def test_a_learner_killed_mid_training_resumes_at_its_last_checkpoint(tiny_model):
    setup = with_pairs(demo_project(tiny_model, train_size=TRAIN, heldout_size=HELDOUT))
    host = Host(worker_env())
    host.worker("learner,control")
    try:
        version_id = train(setup)
        wait_until(lambda: frozen_past_a_checkpoint(version_id), "the learner past its first checkpoint")
        killed = RewardModelVersion.objects.get(pk=version_id)
        os.kill(killed.learner_pid, signal.SIGKILL)  # kill -9 of the learner, and only it
        wait_until(lambda: RewardModelVersion.objects.get(pk=version_id).is_terminal, "the training")
    finally:
        host.kill()
    version = RewardModelVersion.objects.get(pk=version_id)
    assert_resumed_once(version, killed)
    assert (
        "the learner exited with code -9; restarting from step"
        in log_path(version.pk, version.key).read_text()
    )

    # The page's live progress: epoch, loss, held-out accuracy per epoch, restarts; `since` trims.
    browser = Client()
    browser.force_login(setup["owner"])
    progress = browser.get(f"/reward-model-versions/{version_id}/progress?since={STEPS - 2}").json()
    assert (progress["status"], progress["terminal"], progress["step"], progress["steps"]) == (
        "succeeded",
        True,
        STEPS,
        STEPS,
    )
    assert progress["epoch"] == EPOCHS and progress["epochs"] == EPOCHS and progress["restarts"] == 1
    assert [entry["step"] for entry in progress["history"]] == [STEPS - 1, STEPS]
    assert progress["loss"] == version.history[-1]["loss"]
    assert len(progress["heldout_accuracy_by_epoch"]) == EPOCHS
    assert browser.get(f"/reward-model-versions/{version_id}/progress?since=x").status_code == 400
    page = browser.get(f"/reward-model-versions/{version_id}/").content.decode()
    assert 'id="rm-chart"' in page and "reward_model_live.js" in page
    assert f'"/reward-model-versions/{version_id}/progress"' in page


@pytest.mark.django_db(transaction=True)
def test_a_host_lost_mid_training_is_requeued_by_the_watchdog_and_resumes(tiny_model, tmp_path):
    setup = with_pairs(demo_project(tiny_model, train_size=TRAIN, heldout_size=HELDOUT))
    doomed = Host(worker_env())
    doomed.worker("learner,control")
    replacement = Host(worker_env())
    try:
        version_id = train(setup)
        wait_until(lambda: frozen_past_a_checkpoint(version_id), "the learner past its first checkpoint")
        killed = RewardModelVersion.objects.get(pk=version_id)
        os.kill(killed.learner_pid, signal.SIGKILL)  # the learner lives on the doomed host too
        doomed.kill()
        # The local checkpoints go with the host's disk: the next learner fetches from the storage.
        shutil.rmtree(version_dir(killed.pk, killed.key) / "learner")
        replacement.beat(tmp_path)
        replacement.worker("learner,control")
        wait_until(lambda: RewardModelVersion.objects.get(pk=version_id).is_terminal, "the training")
    finally:
        doomed.kill()
        replacement.kill()
    version = RewardModelVersion.objects.get(pk=version_id)
    assert_resumed_once(version, killed)


def one_pair_reward_model(team) -> tuple:
    """A task-set version of one preference pair, and a reward model of the team's project."""
    owner, project = team["owner"], team["project"]
    task_set = project_services.task_set_create(project=project, name="pairs", by=owner)
    item = {"id": "a", "kind": "answer", "prompt": "p", "reference": "r"}
    line = (json.dumps(item | {"metadata": {"chosen": "c", "rejected": "d"}}) + "\n").encode()
    version = project_services.task_set_import(
        task_set=task_set, stream=[line], file_format="jsonl", by=owner
    ).version
    return version, RewardModel.objects.create(project=project, name="rm")


@pytest.mark.django_db
def test_the_watchdog_settles_what_it_cannot_resume(team, settings):
    version, reward_model = one_pair_reward_model(team)
    long_ago = "2020-01-01T00:00:00Z"
    cancelling = RewardModelVersion.objects.create(
        reward_model=reward_model,
        number=1,
        task_set_version=version,
        status="cancelling",
        heartbeat_at=long_ago,
    )
    exhausted = RewardModelVersion.objects.create(
        reward_model=reward_model,
        number=2,
        task_set_version=version,
        status="running",
        heartbeat_at=long_ago,
        restarts=settings.FLYWHEEL_LEARNER_MAX_RESTARTS,
    )
    stored = stored_checkpoint(exhausted)
    log_path(exhausted.pk, exhausted.key).write_text("epoch 1\nRuntimeError: CUDA out of memory\n")
    assert reward_models_watchdog() == []
    cancelling.refresh_from_db()
    exhausted.refresh_from_db()
    assert cancelling.status == "cancelled" and cancelling.finished_at is not None
    assert cancelling.error == "cancelled (its learner was gone)"
    # Given up the way a run is, with the learner's last words (workers/supervisor.py).
    limit = settings.FLYWHEEL_LEARNER_MAX_RESTARTS
    assert exhausted.status == "failed" and exhausted.error == (
        f"the learner stopped sending heartbeats; gave up after {limit} restarts\n"
        "epoch 1\nRuntimeError: CUDA out of memory"
    )
    # A settled version is never resumed: its checkpoint leaves the storage and the host.
    assert exhausted.checkpoint_path == ""
    with pytest.raises(ArtifactMissingError):
        artifact_manifest(stored)
    assert not (version_dir(exhausted.pk, exhausted.key) / "learner").exists()


def stored_checkpoint(version: RewardModelVersion) -> str:
    """A checkpoint as a learner leaves one: in the artifact storage (recorded) and in its folder."""
    local = version_dir(version.pk, version.key) / "learner" / "checkpoint-4"
    local.mkdir(parents=True)
    (local / "optimizer.pt").write_bytes(b"state" * 100)
    prefix = checkpoint_prefix(version.pk, version.key, 4)
    artifact_put(local, prefix)
    RewardModelVersion.objects.filter(pk=version.pk).update(checkpoint_step=4, checkpoint_path=prefix)
    assert artifact_manifest(prefix)["files"]
    return prefix


@pytest.mark.django_db
def test_cancelling_a_version_queued_again_removes_its_checkpoint(team):
    """The watchdog queues a version whose host died with its checkpoint; cancelled before a
    learner takes it, nothing will resume it."""
    version, reward_model = one_pair_reward_model(team)
    queued = RewardModelVersion.objects.create(
        reward_model=reward_model, number=1, task_set_version=version, status="queued", restarts=1
    )
    stored = stored_checkpoint(queued)
    cancelled = reward_model_version_cancel(version=queued)
    assert cancelled.status == "cancelled" and cancelled.checkpoint_path == ""
    with pytest.raises(ArtifactMissingError):
        artifact_manifest(stored)
    assert not (version_dir(queued.pk, queued.key) / "learner").exists()


# --- scoring over REST ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_rest_scores_texts_and_pairs_with_a_trained_version(tiny_model, tmp_path):
    setup = with_pairs(demo_project(tiny_model, train_size=16, heldout_size=4))
    version = trained_version(setup, tiny_model, tmp_path)
    owner = setup["owner"]
    url = f"/api/v1/reward-models/{version.reward_model_id}/versions/1/score"
    items = list(setup["version"].items.filter(split="train").order_by("position"))
    pairs = [
        {
            "prompt": i.data["prompt"],
            "chosen": i.data["metadata"]["chosen"],
            "rejected": i.data["metadata"]["rejected"],
        }
        for i in items
    ]
    client = api_client_for(owner)
    ranked = client.post(url, {"pairs": pairs}, format="json")
    assert ranked.status_code == 200, ranked.json()
    body = ranked.json()
    assert (body["reward_model"], body["version"], body["number"]) == (version.reward_model_id, version.pk, 1)
    assert len(body["pairs"]) == len(pairs)
    for pair in body["pairs"]:
        assert pair["margin"] == pytest.approx(pair["chosen"] - pair["rejected"])
        assert pair["prefers_chosen"] == (pair["chosen"] > pair["rejected"])
    assert body["accuracy"] == pytest.approx(version.heldout_accuracy)  # the same pairs, measured in training

    texts = [{"prompt": pairs[0]["prompt"], "completion": pairs[0]["chosen"]}]
    texts.append(
        {"prompt": [{"role": "user", "content": pairs[0]["prompt"]}], "completion": pairs[0]["rejected"]}
    )
    scored = client.post(url, {"texts": texts}, format="json")
    assert scored.status_code == 200, scored.json()
    # A string prompt and the same prompt as a conversation render alike: the pair's own scores.
    assert scored.json()["scores"] == pytest.approx(
        [body["pairs"][0]["chosen"], body["pairs"][0]["rejected"]], abs=1e-5
    )

    # Bounded and checked, naming the field.
    too_many = client.post(url, {"texts": texts * 33}, format="json")
    assert too_many.status_code == 400 and too_many.json()["error"]["param"].startswith("texts")
    neither = client.post(url, {}, format="json")
    assert neither.status_code == 400 and neither.json()["error"]["param"] == "texts"
    both = client.post(url, {"texts": texts, "pairs": pairs}, format="json")
    assert both.status_code == 400
    bad = client.post(url, {"texts": [{"prompt": 3, "completion": "x"}]}, format="json")
    assert bad.status_code == 400 and "prompt" in bad.json()["error"]["param"]
    long = client.post(url, {"texts": [{"prompt": "p", "completion": "x" * 20_001}]}, format="json")
    assert long.status_code == 400 and "completion" in long.json()["error"]["param"]
    assert (
        client.post(url.replace("/1/score", "/9/score"), {"texts": texts}, format="json").status_code == 404
    )

    # Roles: scoring runs the model, so it needs the edit permission; outsiders see nothing.
    viewer, outsider = make_user("rm-viewer"), make_user("rm-outsider")
    Membership.objects.create(project=setup["project"], user=viewer, role="viewer")
    assert api_client_for(viewer).post(url, {"texts": texts}, format="json").status_code == 403
    assert api_client_for(outsider).post(url, {"texts": texts}, format="json").status_code == 404

    # A version not trained yet answers 409.
    RewardModelVersion.objects.create(
        reward_model=version.reward_model, number=2, task_set_version=setup["version"], status="running"
    )
    busy = client.post(url.replace("/1/score", "/2/score"), {"texts": texts}, format="json")
    assert busy.status_code == 409

    paths = client.get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()["paths"]
    assert "/api/v1/reward-models/{id}/versions/{number}/score" in paths

"""Alerts that act: a monitor set to pause pauses its run, every alert carries its evidence, and
each is sent to the project's webhooks as a signed `run.alert` delivery; through the real workers,
a run whose monitor fires pauses itself after the step it fired on."""

# The fixtures imported from other test modules are test parameters here, not redefinitions:
# ruff: noqa: F811
import json

import pytest

from runs import monitors
from runs.models import MetricPoint, Run
from tests.conftest import api_client_for
from tests.run_fixtures import lab, make_run, make_trajectory, set_status  # noqa: F401
from tests.run_harness import tiny_model  # noqa: F401
from tests.test_webhooks import private_receivers_allowed, receiver  # noqa: F401
from webhooks import services as webhook_services
from webhooks.models import WebhookDelivery
from webhooks.signing import signature_verify

pytestmark = pytest.mark.django_db


def write(run, step: int, values: dict[str, float]) -> None:
    MetricPoint.objects.bulk_create(
        [MetricPoint(run=run, name=k, step=step, value=v) for k, v in values.items()]
    )


def test_a_monitor_set_to_pause_pauses_the_run_with_its_evidence(lab):
    run = set_status(make_run(lab), Run.Status.RUNNING, monitor_actions={"errored_rate": "pause"})
    write(run, 1, {"episodes/errored_rate": 0.0})
    write(run, 2, {"episodes/errored_rate": 0.5})
    (alert,) = monitors.run_monitor(run_id=run.pk, step=2)
    assert alert.data["action"] == "pause"
    assert alert.data["evidence"] == {"episodes/errored_rate": [[1, 0.0], [2, 0.5]]}
    assert alert.message.endswith("The run pauses itself.")
    run.refresh_from_db()
    assert run.status == Run.Status.PAUSING  # the learner stops after this step, with a checkpoint
    assert run.events.filter(kind="status").last().message == "pausing at the next step"


def test_a_monitor_left_to_alert_only_leaves_the_run_running(lab):
    run = set_status(make_run(lab), Run.Status.RUNNING)
    write(run, 1, {"episodes/errored_rate": 0.5})
    (alert,) = monitors.run_monitor(run_id=run.pk, step=1)
    assert alert.data["action"] == "alert" and not alert.message.endswith("pauses itself.")
    assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING


def test_a_reward_hacking_alert_shows_the_flagged_trajectories(lab):
    run = set_status(make_run(lab), Run.Status.RUNNING, monitor_actions={"reward_hacking": "pause"})
    flag = {"detector": "many_answers", "evidence": "12 candidate answers"}
    flagged = make_trajectory(run, index=2, flags=[flag], completion_text="4 5 6 7 8", reward=1.0)
    (alert,) = monitors.run_monitor(run_id=run.pk, step=3)
    (shown,) = alert.data["evidence"]["flagged"]
    assert (shown["trajectory"], shown["flags"], shown["completion"], shown["reward"]) == (
        flagged.pk,
        [flag],
        "4 5 6 7 8",
        1.0,
    )
    assert Run.objects.get(pk=run.pk).status == Run.Status.PAUSING


def test_each_alert_is_a_signed_run_alert_delivery_to_webhooks_that_want_it(lab, receiver, settings):
    alerts = webhook_services.webhook_create(
        project=lab["project"], by=lab["owner"], url=receiver.url, events=["run.alert"]
    )
    statuses_only = webhook_services.webhook_create(
        project=lab["project"], by=lab["owner"], url=receiver.url, events=["run.status"]
    )
    run = set_status(make_run(lab), Run.Status.RUNNING, monitor_actions={"errored_rate": "pause"})
    write(run, 1, {"episodes/errored_rate": 0.9})
    (event,) = monitors.run_monitor(run_id=run.pk, step=1)
    delivery = WebhookDelivery.objects.get(webhook=alerts, type="run.alert")
    assert not WebhookDelivery.objects.filter(webhook=statuses_only, type="run.alert").exists()
    # the pause is a status change: the status webhook gets that, the alerts-only one does not
    assert WebhookDelivery.objects.filter(webhook=statuses_only, payload__data__status="pausing").exists()
    assert not WebhookDelivery.objects.filter(webhook=alerts, type="run.status").exists()
    sent = webhook_services.delivery_attempt(delivery_id=delivery.pk)
    assert sent.status == "delivered"
    (request,) = [r for r in receiver.requests if r["headers"]["Flywheel-Event"] == "run.alert"]
    assert signature_verify(alerts.secret, request["headers"]["Flywheel-Signature"], request["body"])
    body = json.loads(request["body"])
    assert body["type"] == "run.alert" and body["data"]["done"] == "paused"
    assert body["data"]["alert"]["monitor"] == "errored_rate" and body["data"]["alert"]["event"] == event.pk
    assert body["data"]["alert"]["evidence"] == {"episodes/errored_rate": [[1, 0.9]]}
    assert body["data"]["run"]["id"] == run.pk


def test_monitor_actions_are_set_over_rest_and_refused_by_name(lab):
    run = make_run(lab)
    client = api_client_for(lab["launcher"])
    url = f"/api/v1/runs/{run.pk}/monitors"
    response = client.patch(url, {"actions": {"reward_hacking": "pause"}}, format="json")
    assert response.status_code == 200
    assert {row["monitor"]: row["action"] for row in response.json()["actions"]}["reward_hacking"] == "pause"
    refused = client.patch(url, {"actions": {"vibes": "pause"}, "thresholds": {"window": 3}}, format="json")
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "actions.vibes"
    run.refresh_from_db()
    assert (run.monitor_actions, run.monitors) == ({"reward_hacking": "pause"}, {})
    back = client.patch(url, {"actions": {"reward_hacking": "alert"}}, format="json")
    assert back.status_code == 200 and Run.objects.get(pk=run.pk).monitor_actions == {}


def test_a_run_is_launched_with_its_monitors_and_a_clone_keeps_them(lab):
    client = api_client_for(lab["launcher"])
    body = lab["launch"] | {"monitors": {"window": 3}, "monitor_actions": {"entropy_collapse": "pause"}}
    response = client.post("/api/v1/runs", body, format="json")
    assert response.status_code == 201, response.json()
    run = Run.objects.get(pk=response.json()["id"])
    assert (run.monitors, run.monitor_actions) == ({"window": 3}, {"entropy_collapse": "pause"})
    clone = client.post(f"/api/v1/runs/{run.pk}/clone", {}, format="json").json()
    assert Run.objects.get(pk=clone["id"]).monitor_actions == {"entropy_collapse": "pause"}
    bad = client.post(
        "/api/v1/runs", lab["launch"] | {"monitor_actions": {"entropy_collapse": "explode"}}, format="json"
    )
    assert bad.status_code == 400


def test_the_run_page_sets_a_monitor_to_pause(client, lab):
    run = make_run(lab)
    client.force_login(lab["launcher"])
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'name="action-reward_hacking"' in page
    client.post(f"/runs/{run.pk}/monitors/", {"action-reward_hacking": "pause"})
    assert Run.objects.get(pk=run.pk).monitor_actions == {"reward_hacking": "pause"}


# --- through the real workers --------------------------------------------------------------


@pytest.fixture
def hosts():
    from tests.run_harness import Host, hosts_killed, worker_env

    learner_host, rollout_host = Host(worker_env()), Host(worker_env())
    with hosts_killed(learner_host, rollout_host):
        learner_host.worker("learner")
        rollout_host.worker("rollout,eval")
        yield


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(600)
def test_a_run_whose_monitor_fires_pauses_itself_after_that_step(tiny_model, hosts):
    """Every item names a Docker image the bubblewrap backend refuses to run, so every episode is
    an infrastructure error: the errored-rate monitor fires on step 1 and, set to pause, stops the
    run there with a checkpoint, long before its last step."""
    from runs import services
    from tests.run_harness import demo_project, run_body, wait_until

    setup = demo_project(tiny_model)
    lines = []
    for item in setup["version"].items.order_by("position"):
        data = item.data | {"id": item.external_id, "kind": item.kind, "split": item.split}
        lines.append((json.dumps(data | {"sandbox": {"image": "flywheel-missing:none"}}) + "\n").encode())
    task_set = setup["version"].task_set
    version = services.task_set_import(
        task_set=task_set, stream=lines, file_format="jsonl", by=setup["owner"]
    ).version
    body = run_body(setup | {"version": version}, steps=6) | {"monitor_actions": {"errored_rate": "pause"}}
    response = api_client_for(setup["owner"]).post("/api/v1/runs", body, format="json")
    assert response.status_code == 201, response.json()
    run_id = response.json()["id"]
    wait_until(
        lambda: Run.objects.get(pk=run_id).status in ("paused", "failed", "succeeded"), "the run to stop"
    )
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.learner_step) == ("paused", 1), run.error
    alert = run.events.get(kind="alert")
    assert (alert.data["monitor"], alert.data["step"], alert.data["action"]) == ("errored_rate", 1, "pause")
    assert alert.data["evidence"] == {"episodes/errored_rate": [[1, 1.0]]}
    assert run.checkpoints.filter(step=1).exists()
    assert run.events.filter(kind="status").last().message == "paused at step 1"

"""Alerts that act: a monitor set to pause pauses its run, every alert carries its evidence, and
each is sent to the project's webhooks as a signed `run.alert` delivery; through the real workers,
a run whose monitor fires pauses itself after the step it fired on."""

# The fixtures imported from other test modules are test parameters here, not redefinitions:
# ruff: noqa: F811
import json

import pytest

from projects import services as project_services
from runs import monitors
from runs.models import MetricPoint, Run, Trajectory
from tests.conftest import api_client_for
from tests.run_fixtures import lab, make_run, set_status  # noqa: F401
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


LISTED = {"detector": "answers_listed", "evidence": "f returns 3 answers in a row", "confidence": "low"}
EXIT = {"detector": "early_exit", "evidence": "solution.py line 2: sys.exit(0)", "confidence": "high"}
NOTE = EXIT | {"note": "reward 0, at the floor (0): nothing to gain"}


def flagged(run, count: int, *, step: int, flags: list[dict], start: int = 0, reward: float = 1.0) -> list:
    """`count` scored episodes of policy version `step`, each with `flags`, as the rollouts store them."""
    items = list(run.task_set_version.items.order_by("position"))
    return [
        Trajectory.objects.create(
            run=run,
            item=items[(start + n) % len(items)],
            sample_index=start + n,
            policy_version=step,
            outcome="scored",
            reward=reward,
            flags=flags,
            completion_text=f"completion {start + n}",
        )
        for n in range(count)
    ]


def test_a_reward_hacking_alert_groups_the_windows_flagged_trajectories_and_links_each(client, lab):
    run = set_status(make_run(lab), Run.Status.RUNNING, monitor_actions={"reward_hacking": "pause"})
    flagged(run, 10, step=2, flags=[])
    flagged(run, 2, step=3, flags=[NOTE], start=10, reward=0.0)  # failures that also exit: notes
    hacks = flagged(run, 2, step=3, flags=[LISTED], start=20) + flagged(
        run, 1, step=5, flags=[EXIT], start=30
    )
    (alert,) = monitors.run_monitor(run_id=run.pk, step=5)
    assert alert.data["monitor"] == "reward_hacking"
    assert alert.message == (
        "3 trajectories in steps 3–5 were flagged by the reward-hacking detectors, 20% of the 15 "
        "episodes of those steps (answers_listed 2, early_exit 1; 2 more flagged only as notes, with no "
        "reward to gain): review them. The run pauses itself."
    )
    assert (alert.data["value"], alert.data["threshold"]) == (0.2, 0.05)
    evidence = alert.data["evidence"]
    assert evidence["trajectories"] == [t.pk for t in reversed(hacks)]
    assert (evidence["steps"], evidence["episodes"], evidence["notes"]) == ([3, 5], 15, 2)
    shown = evidence["flagged"][0]
    assert (shown["trajectory"], shown["flags"], shown["completion"], shown["reward"], shown["step"]) == (
        hacks[-1].pk,
        [EXIT],
        "completion 30",
        1.0,
        5,
    )
    assert Run.objects.get(pk=run.pk).status == Run.Status.PAUSING
    client.force_login(lab["launcher"])
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert all(f'<a href="/trajectories/{t.pk}/">#{t.pk}</a>' in page for t in hacks)


def test_one_or_two_flags_or_notes_alone_raise_no_hacking_alert(lab):
    run = set_status(make_run(lab), Run.Status.RUNNING)
    flagged(run, 20, step=1, flags=[])
    flagged(run, 2, step=1, flags=[EXIT], start=20)
    assert monitors.run_monitor(run_id=run.pk, step=1) == []
    flagged(run, 6, step=2, flags=[NOTE], start=30, reward=0.0)  # a healthy run's failures
    write(run, 2, {"episodes/flagged_rate": 0.0})
    assert monitors.run_monitor(run_id=run.pk, step=2) == []
    assert not run.events.filter(kind="alert").exists()


def test_a_hacking_alert_repeats_within_its_cooldown_only_when_its_rate_escalates(lab):
    run = set_status(make_run(lab), Run.Status.RUNNING)
    flagged(run, 36, step=1, flags=[])
    first = flagged(run, 4, step=1, flags=[EXIT], start=36)
    assert [a.data["value"] for a in monitors.run_monitor(run_id=run.pk, step=1)] == [0.1]
    assert monitors.run_monitor(run_id=run.pk, step=2) == []  # the same group is not news
    flagged(run, 4, step=2, flags=[EXIT], start=40)  # 4 new of 44: a steady trickle, in cooldown
    assert monitors.run_monitor(run_id=run.pk, step=2) == []
    flagged(run, 8, step=3, flags=[])
    flagged(run, 8, step=3, flags=[EXIT], start=50)  # 12 new of 60: 20%, twice the first rate
    (again,) = monitors.run_monitor(run_id=run.pk, step=3)
    assert again.data["value"] == 0.2 and again.message.startswith("12 trajectories in steps 2–3")
    assert not set(again.data["evidence"]["trajectories"]) & {t.pk for t in first}


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
        learner_host.worker("learner,control")
        rollout_host.worker("rollout,eval")
        yield


@pytest.mark.backend_independent
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(600)
def test_a_run_whose_monitor_fires_pauses_itself_after_that_step(tiny_model, hosts):
    """Every item names a Docker image the bubblewrap backend refuses to run, so every episode is
    an infrastructure error: the errored-rate monitor fires on step 1 and, set to pause, stops the
    run there with a checkpoint, long before its last step."""
    from tests.run_harness import demo_project, run_body, wait_until

    setup = demo_project(tiny_model)
    lines = []
    for item in setup["version"].items.order_by("position"):
        data = item.data | {"id": item.external_id, "kind": item.kind, "split": item.split}
        lines.append((json.dumps(data | {"sandbox": {"image": "flywheel-missing:none"}}) + "\n").encode())
    task_set = setup["version"].task_set
    version = project_services.task_set_import(
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

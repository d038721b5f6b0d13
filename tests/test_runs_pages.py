"""Run pages: the project's runs card, the launch form and its refusals, the run page with its
actions by status and role, clone and fork buttons, and trajectories shown as escaped text."""

# The fixture imported from run_fixtures is a test parameter here, not a redefinition:
# ruff: noqa: F811
import pytest
from django.urls import reverse

from runs import lifecycle
from runs.models import Checkpoint, MetricPoint, Run, RunEvent, TrajectoryStep
from tests.run_fixtures import lab, make_run, make_trajectory, set_status  # noqa: F401
from tiers import services as tier_services

S = Run.Status


def page(client, user, url, **kwargs):
    client.force_login(user)
    return client.get(url, **kwargs)


def text(response) -> str:
    return response.content.decode()


def launch_form(lab, **changes) -> dict:
    return {
        "name": "from the form",
        "task_set_version": lab["version"].pk,
        "train_split": "train",
        "eval_split": "heldout",
        "reward_rule_version": lab["rule"].versions.get().pk,
        "tier": lab["tier"].pk,
        "method": "grpo",
        "max_steps": "3",
        "max_wall_seconds": "",
        "max_sandbox_cpu_seconds": "",
        "priority": "0",
        "hp_group_size": "4",
        "hp_learning_rate": "auto",
    } | changes


# --- the project page ----------------------------------------------------------------------


def test_the_project_page_lists_runs_with_status_step_and_queue_position(client, lab):
    low = make_run(lab, name="low")
    make_run(lab, name="high", priority=5)
    Run.objects.filter(pk=low.pk).update(learner_step=2)
    body = text(page(client, lab["viewer"], reverse("project-detail", args=[lab["project"].pk])))
    runs_table = body[body.index('id="runs"') :]
    assert runs_table.index(">high<") < runs_table.index(">low<")  # newest first
    assert "2 / 5" in runs_table and "#1" in runs_table and "#2" in runs_table
    assert '<span class="badge status-queued">queued</span>' in runs_table
    assert "Launch run" not in body  # a viewer cannot launch


def test_a_launcher_sees_the_launch_button(client, lab):
    body = text(page(client, lab["launcher"], reverse("project-detail", args=[lab["project"].pk])))
    assert reverse("run-create", args=[lab["project"].pk]) in body


# --- the launch form -----------------------------------------------------------------------


def test_the_launch_form_prefills_auto_and_shows_each_default(client, lab):
    body = text(page(client, lab["launcher"], reverse("run-create", args=[lab["project"].pk])))
    assert 'name="hp_group_size" value="auto"' in body
    assert "<code>0.0003</code>" in body  # learning_rate's default
    assert "arith v1" in body and "exact v1" in body and ">cap<" in body


def test_launching_from_the_form_queues_the_run_and_opens_it(client, lab):
    client.force_login(lab["launcher"])
    response = client.post(reverse("run-create", args=[lab["project"].pk]), launch_form(lab))
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("run-detail", args=[run.pk])
    assert (run.name, run.status, run.max_steps, run.hyperparameters) == (
        "from the form",
        S.QUEUED,
        3,
        {"group_size": 4},
    )
    assert run.resolved["learning_rate"] == 0.0003 and run.created_by == lab["launcher"]


def test_refusals_are_shown_next_to_their_fields_and_nothing_is_created(client, lab, tmp_path):
    lab["tier"].base_model = str(tmp_path / "missing")
    lab["tier"].save()
    client.force_login(lab["owner"])
    form = launch_form(lab, max_steps="0", hp_group_size="1", hp_beta="0.5", hp_epochs="x")
    response = client.post(reverse("run-create", args=[lab["project"].pk]), form)
    body = text(response)
    assert response.status_code == 200
    assert '<p class="field-error" data-field="hp_epochs">must be an integer or auto</p>' in body
    assert Run.objects.count() == 0
    response = client.post(
        reverse("run-create", args=[lab["project"].pk]), launch_form(lab, hp_group_size="1", hp_beta="0.5")
    )
    body = text(response)
    assert '<p class="field-error" data-field="hp_group_size">must be at least 2</p>' in body
    assert '<p class="field-error" data-field="hp_beta">not a hyperparameter of grpo</p>' in body
    response = client.post(reverse("run-create", args=[lab["project"].pk]), launch_form(lab, max_steps="0"))
    body = text(response)
    assert '<p class="field-error" data-field="max_steps">must be at least 1</p>' in body
    assert '<p class="field-error" data-field="tier">base_model: tier cap: no folder ' in body
    assert Run.objects.count() == 0


def test_a_viewer_may_not_open_or_post_the_launch_form(client, lab):
    assert page(client, lab["viewer"], reverse("run-create", args=[lab["project"].pk])).status_code == 403
    assert client.post(reverse("run-create", args=[lab["project"].pk]), launch_form(lab)).status_code == 403
    assert page(client, lab["outsider"], reverse("run-create", args=[lab["project"].pk])).status_code == 404
    assert Run.objects.count() == 0


# --- the run page --------------------------------------------------------------------------


def actions_on(body: str) -> list[str]:
    return [part.split('"')[0] for part in body.split('data-action="')[1:]]


@pytest.mark.parametrize(
    ("status", "actions"),
    [
        (S.QUEUED, ["pause", "cancel", "clone"]),
        (S.RUNNING, ["pause", "cancel", "clone"]),
        (S.PAUSED, ["resume", "cancel", "clone"]),
        (S.FAILED, ["retry", "clone"]),
        (S.SUCCEEDED, ["clone"]),
    ],
)
def test_the_run_page_offers_the_actions_its_status_allows(client, lab, status, actions):
    run = set_status(make_run(lab), status)
    assert actions_on(text(page(client, lab["launcher"], reverse("run-detail", args=[run.pk])))) == actions
    assert actions_on(text(page(client, lab["viewer"], reverse("run-detail", args=[run.pk])))) == []


def test_the_run_page_shows_configuration_progress_events_metrics_and_checkpoints(client, lab):
    run = make_run(lab)
    Run.objects.filter(pk=run.pk).update(learner_step=3, policy_version=3)
    lifecycle.run_event(run, "alert", "reward is flat", level="warning")
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, name="reward_mean", step=step, value=value)
        for step, value in ((1, 0.25), (2, 0.75), (3, 0.5))
    )
    Checkpoint.objects.create(run=run, step=3, policy_version=3, path="/tmp/ck")
    body = text(page(client, lab["launcher"], reverse("run-detail", args=[run.pk])))
    assert '<span class="badge status-queued" id="run-status">queued</span>' in body
    assert "#1</strong> in the project" in body
    assert "<code>group_size</code></td><td>4</td>" in body
    assert '<code>learning_rate</code></td><td>0.0003 <span class="muted small">auto</span>' in body
    assert "<dt>task set version</dt><dd>arith v1</dd>" in body
    assert f"<dt>base_model</dt><dd>{lab['tier'].base_model}</dd>" in body
    assert '<span class="badge level-warning">warning</span></td><td>reward is flat' in body
    metrics = body[body.index('id="metrics"') :]
    latest, at_step, low, high = "0.5", "3", "0.25", "0.75"
    cells = "".join(f'<td class="num">{value}</td>' for value in (latest, at_step, low, high))
    assert cells in metrics
    assert reverse("checkpoint-fork", args=[Checkpoint.objects.get().pk]) in body
    export = reverse("api-checkpoint-export", args=[run.pk, 3])
    assert f'<a class="btn btn-small" href="{export}" download' in body
    assert f'href="{export}?archive=zip" download>zip</a>' in body
    assert f'href="/playground/?models=run-{run.pk}-step-3"' in body


def test_a_failed_run_shows_its_error_and_where(client, lab):
    run = lifecycle.run_fail(run=make_run(lab), message="sandbox pool <empty>", where="rollout batch 4")
    body = text(page(client, lab["viewer"], reverse("run-detail", args=[run.pk])))
    assert '<p id="run-error-reason">sandbox pool &lt;empty&gt;</p>' in body
    assert "where: <code>rollout batch 4</code>" in body


def test_an_action_button_changes_the_status_and_a_stale_one_changes_nothing(client, lab):
    run = make_run(lab)
    client.force_login(lab["launcher"])
    response = client.post(reverse("run-cancel", args=[run.pk]), follow=True)
    assert Run.objects.get(pk=run.pk).status == S.CANCELLED
    assert "Run first is cancelled." in text(response)
    events = RunEvent.objects.count()
    response = client.post(reverse("run-pause", args=[run.pk]), follow=True)
    assert "Not paused: run first is cancelled now (the page was stale)." in text(response)
    assert Run.objects.get(pk=run.pk).status == S.CANCELLED and RunEvent.objects.count() == events
    client.post(reverse("run-retry", args=[run.pk]))
    assert Run.objects.get(pk=run.pk).status == S.QUEUED


def test_a_viewer_may_not_cancel_from_the_page(client, lab):
    run = make_run(lab)
    client.force_login(lab["viewer"])
    assert client.post(reverse("run-cancel", args=[run.pk])).status_code == 403
    client.force_login(lab["outsider"])
    assert client.post(reverse("run-cancel", args=[run.pk])).status_code == 404
    assert client.get(reverse("run-detail", args=[run.pk])).status_code == 404
    assert Run.objects.get(pk=run.pk).status == S.QUEUED


def test_clone_and_fork_buttons_create_runs_that_show_their_parent_and_diff(client, lab):
    parent = make_run(lab)
    checkpoint = Checkpoint.objects.create(run=parent, step=2, policy_version=2, path="/tmp/ck")
    client.force_login(lab["launcher"])
    response = client.post(reverse("run-clone", args=[parent.pk]))
    clone = Run.objects.get(name="first (copy)")
    assert response["Location"] == reverse("run-detail", args=[clone.pk]) and clone.parent == parent
    body = text(client.get(response["Location"]))
    assert "Cloned from" in body and "Same configuration as its parent." in body
    response = client.post(reverse("checkpoint-fork", args=[checkpoint.pk]))
    fork = Run.objects.get(name="first (fork @ 2)")
    assert (fork.parent, fork.parent_checkpoint) == (parent, checkpoint)
    body = text(client.get(response["Location"]))
    assert "Forked from" in body and "at step 2" in body


def test_a_clone_the_lifecycle_refuses_says_why_and_creates_nothing(client, lab):
    parent = make_run(lab)
    tier_services.tier_delete(tier=lab["tier"])
    client.force_login(lab["owner"])
    response = client.post(reverse("run-clone", args=[parent.pk]), follow=True)
    assert "Not cloned: tier: the parent&#x27;s tier was deleted; choose a tier" in text(response)
    assert Run.objects.count() == 1


# --- trajectories --------------------------------------------------------------------------


def test_the_run_page_lists_trajectories_and_filters_them_by_outcome(client, lab):
    run = make_run(lab)
    scored = make_trajectory(run, index=0, reward=0.75, policy_version=2, learned_in_step=3)
    errored = make_trajectory(run, index=1, reward=None, outcome="errored")
    body = text(page(client, lab["viewer"], reverse("run-detail", args=[run.pk])))
    table = body[body.index('id="trajectories"') :]
    assert reverse("trajectory-detail", args=[scored.pk]) in table
    assert (
        '<td class="num">0.75</td>\n            <td class="num">v2</td>\n            <td><code>q0</code></td>'
        in table
    )
    filtered = text(client.get(reverse("run-detail", args=[run.pk]), {"outcome": "errored"}))
    table = filtered[filtered.index('id="trajectories"') :]
    assert reverse("trajectory-detail", args=[errored.pk]) in table
    assert reverse("trajectory-detail", args=[scored.pk]) not in table


def test_model_output_on_the_trajectory_page_is_escaped_never_executed(client, lab):
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    trajectory = make_trajectory(make_run(lab), completion_text=hostile)
    payload, size = TrajectoryStep.pack({"action": hostile, "observation": "ok"})
    TrajectoryStep.objects.create(
        trajectory=trajectory, index=0, kind="completion", payload=payload, raw_size=size
    )
    body = text(page(client, lab["viewer"], reverse("trajectory-detail", args=[trajectory.pk])))
    assert "<script>alert" not in body and "<img src=x" not in body
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in body
    assert "&quot;action&quot;: &quot;&lt;script&gt;alert(\\&quot;x\\&quot;)&lt;/script&gt;" in body


def test_the_trajectory_page_shows_steps_in_order_a_page_at_a_time(client, lab):
    trajectory = make_trajectory(make_run(lab))
    for index in range(25):
        payload, size = TrajectoryStep.pack({"action": f"step-{index:02d}"})
        TrajectoryStep.objects.create(
            trajectory=trajectory, index=index, kind="command", payload=payload, raw_size=size
        )
    url = reverse("trajectory-detail", args=[trajectory.pk])
    first = text(page(client, lab["viewer"], url))
    assert "step-00" in first and "step-19" in first and "step-20" not in first
    assert first.index("step-03") < first.index("step-04")
    second = text(client.get(url, {"page": 2}))
    assert "step-24" in second and "step-19" not in second
    client.force_login(lab["outsider"])
    assert client.get(url).status_code == 404

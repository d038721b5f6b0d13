"""Outcomes you can trust: a run says whether it made the model better (its final held-out
results against its start, item by item, with a paired bootstrap interval), in its header, the
runs table and the API; a run that learns from nothing stops as failed, saying why and what to
change, through the real workers."""

# The fixtures imported from other test modules are test parameters here, not redefinitions:
# ruff: noqa: F811
import pytest

from rewards import services as reward_services
from runs import monitors
from runs.models import HeldOutResult, MetricPoint, Run, Trajectory
from runs.outcomes import bootstrap_interval, paired_compare, run_outcome_settle
from tests.conftest import api_client_for
from tests.run_fixtures import lab, make_run, set_status  # noqa: F401
from tests.run_harness import (
    Host,
    demo_project,
    hosts_killed,
    run_body,
    tiny_model,
    wait_for_terminal,
    worker_env,
)

__all__ = ["tiny_model"]


def test_a_clear_gain_on_40_items_is_improved_and_its_interval_excludes_0():
    before = {item: 0.0 for item in range(40)}
    after = {item: float(item < 20) for item in range(40)}
    comparison = paired_compare(before, after)
    assert (comparison.before, comparison.after, comparison.delta) == (0.0, 0.5, 0.5)
    assert (comparison.items, comparison.improved_items, comparison.regressed_items) == (40, 20, 0)
    assert 0.3 < comparison.low < 0.5 < comparison.high < 0.7
    assert comparison.verdict == "improved"


def test_two_points_on_80_items_is_unchanged_and_a_clear_loss_is_regressed():
    before = {item: float(item % 2) for item in range(80)}
    # Item 0 gains, item 1 and item 3 lose: one net item of 80, in both directions.
    after = before | {0: 1.0, 1: 0.0, 3: 0.0}
    small = paired_compare(before, after)
    assert (small.improved_items, small.regressed_items, small.delta) == (1, 2, -1 / 80)
    assert small.low < 0 < small.high and small.verdict == "unchanged"
    worse = paired_compare({item: 1.0 for item in range(40)}, {item: float(item >= 7) for item in range(40)})
    assert worse.delta == -7 / 40 and worse.high < 0 and worse.verdict == "regressed"


def test_items_measured_on_one_side_only_are_left_out_and_the_interval_is_seeded():
    comparison = paired_compare({1: 1.0, 2: 0.0}, {2: 1.0, 3: 1.0})
    assert (comparison.items, comparison.before, comparison.after) == (1, 0.0, 1.0)
    assert paired_compare({}, {1: 1.0}).verdict == "unchanged"
    differences = [1.0, 0.0, -1.0, 1.0, 0.0, 1.0]
    assert bootstrap_interval(differences) == bootstrap_interval(differences)


def heldout(run: Run, step: int, passed: list[bool]) -> None:
    items = list(run.task_set_version.items.order_by("position"))
    HeldOutResult.objects.bulk_create(
        [
            HeldOutResult(run=run, step=step, item=item, reward=float(ok), passed=ok)
            for item, ok in zip(items, passed, strict=False)
        ]
    )


@pytest.mark.django_db
def test_a_finished_run_that_fell_below_its_start_says_so_in_its_header_table_and_api(lab):
    run = set_status(make_run(lab), Run.Status.RUNNING)
    count = run.task_set_version.items.count()
    heldout(run, 0, [True] * count)
    heldout(run, 5, [False] * count)
    comparison = run_outcome_settle(run=run, step=5)
    assert comparison is not None and comparison.verdict == "regressed"
    run = set_status(run, Run.Status.SUCCEEDED)
    assert (run.outcome, run.outcome_detail["before"], run.outcome_detail["after"]) == ("regressed", 1.0, 0.0)

    client = api_client_for(lab["owner"])
    body = client.get(f"/api/v1/runs/{run.pk}").json()
    assert body["outcome"]["verdict"] == "regressed"
    assert (body["outcome"]["items"], body["outcome"]["delta"]) == (count, -1.0)
    listed = {
        row["id"]: row for row in client.get(f"/api/v1/runs?project={lab['project'].pk}").json()["results"]
    }
    assert listed[run.pk]["outcome"]["verdict"] == "regressed"

    client.force_login(lab["owner"])
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="run-outcome"' in page and "The run made the model worse" in page
    assert "held-out pass rate 100.0% → 0.0% (−100.0 points" in page
    table = client.get(f"/projects/{lab['project'].pk}/").content.decode()
    assert 'data-outcome="regressed"' in table


@pytest.mark.django_db
def test_no_outcome_is_recorded_until_both_ends_are_evaluated_item_by_item(lab):
    run = set_status(make_run(lab), Run.Status.RUNNING)
    heldout(run, 5, [True])
    assert run_outcome_settle(run=run, step=5) is None
    run.refresh_from_db()
    assert (run.outcome, run.outcome_detail) == ("", None)
    assert api_client_for(lab["owner"]).get(f"/api/v1/runs/{run.pk}").json()["outcome"] is None


def write(run: Run, step: int, values: dict[str, float]) -> None:
    MetricPoint.objects.bulk_create(
        [MetricPoint(run=run, name=k, step=step, value=v) for k, v in values.items()]
    )


@pytest.mark.django_db
def test_nothing_learned_five_steps_in_a_row_fires_with_why_and_stops_by_default(lab):
    run = set_status(make_run(lab), Run.Status.RUNNING)
    for step in range(1, 5):
        write(run, step, {"episodes/learned": 0.0, "dropped/zero_variance": 16.0})
        assert monitors.run_monitor(run_id=run.pk, step=step) == []
    write(run, 5, {"episodes/learned": 0.0, "dropped/zero_variance": 16.0})
    (alert,) = monitors.run_monitor(run_id=run.pk, step=5)
    assert alert.data["monitor"] == "nothing_to_learn" and alert.data["action"] == "stop"
    assert alert.message.startswith(
        "nothing to learn: every group had equal rewards in steps 1–5 (80 episodes"
    )
    assert "a larger group size or a higher temperature" in alert.message
    assert alert.message.endswith("The run stops as failed.")


@pytest.mark.django_db
def test_a_step_that_learned_resets_the_count_and_errored_steps_say_so(lab):
    run = set_status(make_run(lab), Run.Status.RUNNING)
    for step, learned in enumerate([0, 0, 4, 0, 0, 0, 0], start=1):
        write(run, step, {"episodes/learned": float(learned), "dropped/errored": 16.0})
        assert monitors.run_monitor(run_id=run.pk, step=step) == []
    write(run, 8, {"episodes/learned": 0.0, "dropped/errored": 16.0})
    (alert,) = monitors.run_monitor(run_id=run.pk, step=8)
    assert alert.message.startswith("nothing to learn: every episode errored in steps 4–8 (80)")


@pytest.mark.django_db
def test_the_stop_default_can_be_turned_into_an_alert_over_rest_and_back(lab):
    run = make_run(lab)
    client = api_client_for(lab["owner"])
    assert monitors.actions_of(run)["nothing_to_learn"] == "stop"
    answer = client.patch(
        f"/api/v1/runs/{run.pk}/monitors", {"actions": {"nothing_to_learn": "alert"}}, format="json"
    )
    assert answer.status_code == 200, answer.json()
    run.refresh_from_db()
    assert run.monitor_actions == {"nothing_to_learn": "alert"}
    assert monitors.actions_of(run)["nothing_to_learn"] == "alert"
    client.patch(f"/api/v1/runs/{run.pk}/monitors", {"actions": {"nothing_to_learn": "stop"}}, format="json")
    run.refresh_from_db()
    assert run.monitor_actions == {}


@pytest.mark.backend_independent
@pytest.mark.django_db(transaction=True)
def test_a_run_whose_groups_never_vary_stops_as_failed_with_its_reason(tiny_model):
    """Through the real workers: the rule pays only a text the tiny model never writes, so every
    group's rewards are equal (all 0) and no episode can be learned from."""
    setup = demo_project(tiny_model)
    never = {
        "type": "string_check",
        "operation": "eq",
        "input": "{{ sample.output_text }}",
        "reference": "a text no policy writes: 7f3a9c",
    }
    setup["rule"] = reward_services.reward_rule_create(
        project=setup["project"], name="never", spec=never, by=setup["owner"]
    )
    body = run_body(setup, steps=6, eval_every=10) | {"monitors": {"nothing_learned_steps": 2}}
    body["monitor_actions"] = {}  # the default: nothing_to_learn stops the run
    learner_host, rollout_host = Host(worker_env()), Host(worker_env())
    with hosts_killed(learner_host, rollout_host):
        learner_host.worker("learner,control")
        rollout_host.worker("rollout,eval")
        response = api_client_for(setup["owner"]).post("/api/v1/runs", body, format="json")
        assert response.status_code == 201, response.json()
        run = wait_for_terminal(response.json()["id"])
    assert run.status == Run.Status.FAILED
    assert run.error["message"].startswith(
        "nothing to learn: every group had equal rewards in steps 1–2 (32 episodes"
    )
    assert run.error["where"] == "monitor nothing_to_learn after step 2"
    assert run.learner_step == 2  # it stopped at once, not after the 6 steps it asked for
    shares = MetricPoint.objects.filter(run=run, name="episodes/zero_variance_share").order_by("step")
    assert list(shares.values_list("step", "value")) == [(1, 1.0), (2, 1.0)]
    assert not Trajectory.objects.filter(run=run).exclude(learned_in_step=None).exists()
    assert run.checkpoints.filter(step=2).exists()  # something to fork from with other settings


@pytest.mark.django_db
def test_two_runs_compare_item_by_item_over_rest_sorted_by_change_and_filtered(lab):
    control, treated = make_run(lab, name="control"), make_run(lab, name="treated")
    items = list(lab["version"].items.order_by("position"))
    heldout(control, 4, [True, False, True, False][: len(items)])
    heldout(treated, 4, [True, True, False, False][: len(items)])
    client = api_client_for(lab["viewer"])
    url = f"/api/v1/runs/{treated.pk}/heldout-compare?against={control.pk}"
    body = client.get(url).json()
    assert (body["run"], body["step"], body["against"], body["against_step"]) == (
        treated.pk,
        4,
        control.pk,
        4,
    )
    shared = min(len(items), 4)
    assert body["summary"]["items"] == shared
    changes = [row["change"] for row in body["items"]]
    assert changes[0] == "improved" and changes[-1] == "regressed"  # gains first
    assert [row["external_id"] for row in body["items"] if row["change"] == "improved"] == [
        items[1].external_id
    ]
    only = client.get(url + "&change=regressed").json()["items"]
    assert [row["external_id"] for row in only] == [items[2].external_id]
    assert client.get(url + "&kind=nothing-of-this-kind").json()["items"] == []
    assert (
        client.get(f"/api/v1/runs/{treated.pk}/heldout-compare?against={control.pk}&step=9").json()["items"]
        == []
    )
    assert api_client_for(lab["outsider"]).get(url).status_code == 404
    unevaluated = make_run(lab, name="fresh")
    refused = client.get(f"/api/v1/runs/{unevaluated.pk}/heldout-compare")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "not_evaluated"

    client.force_login(lab["viewer"])
    page = client.get(f"/runs/compare/?runs={control.pk},{treated.pk}").content.decode()
    assert f'id="heldout-compare-{treated.pk}"' in page
    assert page.count('data-change="improved"') == 1 and page.count('data-change="regressed"') == 1


@pytest.mark.django_db
def test_a_failed_final_evaluation_is_recorded_and_ends_the_wait_instead_of_hanging(lab):
    from workers.run_eval import policy_evaluate
    from workers.run_learner import FinalEvaluationError, final_evaluation_wait

    run = set_status(make_run(lab), Run.Status.RUNNING, policy_version=3, learner_step=3)
    assert policy_evaluate(run.pk, 3) is None  # version 3 was never published: it cannot load
    failed = run.events.get(kind="evaluation_failed")
    assert (failed.level, failed.data) == ("error", {"step": 3})
    assert failed.message.startswith("the held-out evaluation of step 3 failed: ")
    with pytest.raises(FinalEvaluationError, match="the held-out evaluation of step 3 failed"):
        final_evaluation_wait(run, 3, ask=False)
    assert policy_evaluate(run.pk, 7) is None  # past the newest version: rolled back, not a failure
    assert run.events.filter(kind="evaluation_failed").count() == 1


@pytest.mark.backend_independent
@pytest.mark.django_db(transaction=True)
def test_a_fork_is_evaluated_at_every_step_and_its_outcome_is_against_its_checkpoint(tiny_model):
    """The case a user met: a run forked from a checkpoint, eval_every 1, ended with held-out
    measured only at its start. Through the real workers, every version is evaluated, and the
    run is finished only once the last one is."""
    setup = demo_project(tiny_model)
    learner_host, rollout_host = Host(worker_env()), Host(worker_env())
    with hosts_killed(learner_host, rollout_host):
        learner_host.worker("learner,control")
        rollout_host.worker("rollout,eval")
        client = api_client_for(setup["owner"])
        parent = client.post(
            "/api/v1/runs", run_body(setup, steps=2, checkpoint_every=2), format="json"
        ).json()
        parent = wait_for_terminal(parent["id"])
        assert parent.status == Run.Status.SUCCEEDED, parent.error
        checkpoint = parent.checkpoints.get(step=2)
        body = {"max_steps": 3, "hyperparameters": {"eval_every": 1}}
        fork = client.post(f"/api/v1/checkpoints/{checkpoint.pk}/fork", body, format="json")
        assert fork.status_code == 201, fork.json()
        run = wait_for_terminal(fork.json()["id"])
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert run.resolved["eval_every"] == 1
    steps = sorted(
        MetricPoint.objects.filter(run=run, name="heldout/pass_rate").values_list("step", flat=True)
    )
    assert steps == [0, 1, 2, 3]
    assert sorted(set(HeldOutResult.objects.filter(run=run).values_list("step", flat=True))) == [0, 1, 2, 3]
    assert run.outcome in ("improved", "unchanged", "regressed")
    assert (run.outcome_detail["from_step"], run.outcome_detail["to_step"], run.outcome_detail["items"]) == (
        0,
        3,
        4,
    )


@pytest.mark.django_db
def test_a_grader_of_a_multi_rule_compares_on_its_own_over_the_items_it_graded(lab):
    control, treated = make_run(lab, name="control"), make_run(lab, name="treated")
    first, second = list(lab["version"].items.order_by("position"))[:2]
    for run, style in ((control, 0.2), (treated, 0.9)):
        HeldOutResult.objects.create(
            run=run, step=2, item=first, reward=1.0, passed=True, components={"style": style}
        )
        HeldOutResult.objects.create(run=run, step=2, item=second, reward=1.0, passed=True, components={})
    client = api_client_for(lab["viewer"])
    url = f"/api/v1/runs/{treated.pk}/heldout-compare?against={control.pk}"
    body = client.get(url + "&metric=heldout/reward/style").json()
    assert body["metric"] == "heldout/reward/style" and body["summary"]["items"] == 1
    [row] = body["items"]
    assert (row["external_id"], row["before"], row["after"], row["change"]) == (
        first.external_id,
        0.2,
        0.9,
        "improved",
    )
    assert client.get(url).json()["summary"]["items"] == 2  # pass rate: both items, unchanged
    refused = client.get(url + "&metric=heldout/style")
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "metric"

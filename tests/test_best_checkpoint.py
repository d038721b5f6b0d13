"""Checkpoints with their held-out scores, and the run's best one: the selector and its
tie-breaks, the chosen metric, the run page's table, REST, and what Export, Try and Train on
reviews start from by default."""

# The fixture imported from run_fixtures is a test parameter here, not a redefinition:
# ruff: noqa: F811
import pytest
from django.urls import reverse

from reviews.models import Review
from runs import lifecycle, selectors
from runs.lifecycle import RunRequest
from runs.models import Checkpoint, MetricPoint, Run, Trajectory
from tests.conftest import api_client_for
from tests.run_fixtures import lab  # noqa: F401
from tests.test_api_schema import assert_matches_schema, schema  # noqa: F401


def launch(lab, **hyperparameters) -> Run:
    request = RunRequest(
        project=lab["project"],
        name="scored",
        task_set_version=lab["version"],
        reward_rule_version=lab["rule"].versions.get(),
        tier=lab["tier"],
        hyperparameters={"group_size": 4} | hyperparameters,
        max_steps=6,
    )
    return lifecycle.run_create(request=request, by=lab["owner"])


def checkpoints(run: Run, *steps: int) -> dict[int, Checkpoint]:
    return {
        step: Checkpoint.objects.create(run=run, step=step, policy_version=step, path=f"ckpt-{step}")
        for step in steps
    }


def evaluated(run: Run, step: int, pass_rate: float, reward: float, **more: float) -> None:
    """What workers/run_eval.py writes for a policy version: held-out points at its step."""
    values = {"heldout/pass_rate": pass_rate, "heldout/reward": reward} | {
        name.replace("__", "/"): value for name, value in more.items()
    }
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, name=name, step=step, value=value) for name, value in values.items()
    )


def best_step(run: Run) -> int | None:
    best = selectors.checkpoint_best(run)
    return None if best is None else best.step


# --- the selector ----------------------------------------------------------------------------


def test_no_checkpoint_and_no_evaluation_name_no_best(lab):
    run = launch(lab)
    assert (selectors.checkpoint_best(run), selectors.checkpoint_default(run)) == (None, None)
    checkpoints(run, 2, 4, 6)
    MetricPoint.objects.create(run=run, name="train/pass_rate", step=4, value=1.0)  # not held-out
    assert best_step(run) is None
    assert selectors.checkpoint_default(run).step == 6  # nothing evaluated: the newest
    assert selectors.checkpoint_scores_of(run=run) == {c.pk: {} for c in run.checkpoints.all()}


def test_the_best_has_the_highest_held_out_pass_rate_among_checkpoints(lab):
    run = launch(lab)
    saved = checkpoints(run, 2, 4, 6)
    evaluated(run, 0, 0.25, 0.3)  # the start: no checkpoint there
    evaluated(run, 2, 0.5, 0.9)
    evaluated(run, 4, 0.75, 0.1)
    evaluated(run, 5, 1.0, 1.0)  # an evaluated version without a checkpoint is not a candidate
    evaluated(run, 6, 0.625, 0.8)
    assert best_step(run) == 4 and selectors.checkpoint_default(run) == saved[4]
    assert selectors.checkpoint_scores_of(run=run)[saved[6].pk] == {
        "heldout/pass_rate": 0.625,
        "heldout/reward": 0.8,
    }


def test_a_tie_on_pass_rate_goes_to_the_higher_reward_then_to_the_earlier_step(lab):
    run = launch(lab)
    checkpoints(run, 2, 4, 6)
    evaluated(run, 2, 0.75, 0.5)
    evaluated(run, 4, 0.75, 0.625)
    evaluated(run, 6, 0.75, 0.625)
    assert best_step(run) == 4  # 4 and 6 tie on both: the earlier
    MetricPoint.objects.filter(run=run, step=6, name="heldout/reward").update(value=0.7)
    assert best_step(run) == 6


def test_a_run_names_its_best_by_the_metric_it_chose(lab):
    run = launch(lab, best_metric="heldout/reward/tests")
    assert run.resolved["best_metric"] == "heldout/reward/tests"
    checkpoints(run, 2, 4, 6)
    evaluated(run, 2, 1.0, 0.9, heldout__reward__tests=0.25)
    evaluated(run, 4, 0.5, 0.5, heldout__reward__tests=0.75)
    evaluated(run, 6, 0.5, 0.5)  # no such grader figure at 6: not a candidate
    assert best_step(run) == 4
    by_reward = launch(lab, best_metric="heldout/reward")
    checkpoints(by_reward, 2, 4)
    evaluated(by_reward, 2, 1.0, 0.5)
    evaluated(by_reward, 4, 0.5, 0.75)
    assert best_step(by_reward) == 4 and best_step(launch(lab, best_metric="auto")) is None


def test_a_run_without_the_setting_is_judged_by_pass_rate(lab):
    run = launch(lab)
    Run.objects.filter(pk=run.pk).update(resolved={"group_size": 4})  # launched before the setting
    run.refresh_from_db()
    checkpoints(run, 2, 4)
    evaluated(run, 2, 0.5, 1.0)
    evaluated(run, 4, 0.75, 0.0)
    assert selectors.best_metric_of(run) == "heldout/pass_rate" and best_step(run) == 4


@pytest.mark.parametrize(
    "value",
    ["train/pass_rate", "heldout/agent/invalid_rate", "heldout/pass_rate/", "heldout/reward/a b", 3],
)
def test_a_best_metric_that_is_not_a_held_out_score_is_refused_naming_the_field(lab, value):
    body = lab["launch"] | {"hyperparameters": {"group_size": 4, "best_metric": value}}
    response = api_client_for(lab["owner"]).post("/api/v1/runs", body, format="json")
    assert response.status_code == 400
    [detail] = response.json()["error"]["details"]
    assert detail["param"] == "hyperparameters.best_metric"
    assert detail["message"] == (
        "must be a held-out metric where higher is better: heldout/pass_rate, heldout/reward, "
        "heldout/pass_rate/<family> or heldout/reward/<grader>"
    )
    assert not Run.objects.exists()


# --- the run page ----------------------------------------------------------------------------


def scored_run(lab) -> tuple[Run, dict[int, Checkpoint]]:
    run = launch(lab)
    saved = checkpoints(run, 2, 4, 6)
    evaluated(run, 2, 0.5, 0.625)
    evaluated(run, 4, 0.875, 0.9375)
    return run, saved


def test_the_run_page_shows_each_checkpoints_scores_and_marks_the_best(client, lab):
    run, _ = scored_run(lab)
    client.force_login(lab["viewer"])
    body = client.get(reverse("run-detail", args=[run.pk])).content.decode()
    table = body[body.index('id="checkpoints"') : body.index("</table>", body.index('id="checkpoints"'))]
    rows = table.split("<tr")[2:]  # after the head
    assert [row.split('data-step="')[1].split('"')[0] for row in rows] == ["6", "4", "2"]
    assert 'title="not evaluated">— <span class="small">not evaluated' in rows[0]
    assert '<td class="num" data-metric="heldout/pass_rate">0.875</td>' in rows[1]
    assert '<td class="num" data-metric="heldout/reward">0.938</td>' in rows[1]
    assert '<td class="num" data-metric="heldout/pass_rate">0.500</td>' in rows[2]
    assert [('class="checkpoint-best"' in row, ">best</span>" in row) for row in rows] == [
        (False, False),
        (True, True),
        (False, False),
    ]
    export = reverse("api-checkpoint-export", args=[run.pk, 4])
    assert "Best: <strong>step 4</strong> by <code>heldout/pass_rate</code>" in body
    assert f'<a class="btn btn-small" href="{export}" download id="export-best">' in body
    assert f'href="/playground/?models=run-{run.pk}-step-4" id="try-best"' in body
    assert f'href="/playground/?run={run.pk}"' in body


def test_the_run_page_says_when_no_checkpoint_is_evaluated(client, lab):
    run = launch(lab)
    checkpoints(run, 2)
    client.force_login(lab["viewer"])
    body = client.get(reverse("run-detail", args=[run.pk])).content.decode()
    assert "No checkpoint evaluated yet on <code>heldout/pass_rate</code>" in body
    assert "checkpoint-best" not in body and "export-best" not in body


# --- REST --------------------------------------------------------------------------------------


def test_rest_gives_each_checkpoint_its_scores_and_the_run_its_best(lab, schema):
    run, saved = scored_run(lab)
    MetricPoint.objects.create(run=run, name="heldout/pass_rate/arith", step=4, value=0.75)
    client = api_client_for(lab["viewer"])
    response = client.get(f"/api/v1/checkpoints?run={run.pk}")
    assert_matches_schema(schema, response, "get", "/api/v1/checkpoints")
    listed = {c["step"]: c for c in response.json()["results"]}
    assert [(c["heldout_pass_rate"], c["heldout_reward"], c["best"]) for c in listed.values()] == [
        (None, None, False),
        (0.875, 0.9375, True),
        (0.5, 0.625, False),
    ]
    assert listed[4]["heldout"] == {
        "heldout/pass_rate": 0.875,
        "heldout/pass_rate/arith": 0.75,
        "heldout/reward": 0.9375,
    }
    assert listed[6]["heldout"] == {}
    detail = client.get(f"/api/v1/checkpoints/{saved[2].pk}")
    assert_matches_schema(schema, detail, "get", "/api/v1/checkpoints/{id}")
    assert (detail.json()["heldout_pass_rate"], detail.json()["best"]) == (0.5, False)
    response = client.get(f"/api/v1/runs/{run.pk}")
    assert_matches_schema(schema, response, "get", "/api/v1/runs/{id}")
    assert response.json()["best_checkpoint"] == {
        "id": saved[4].pk,
        "step": 4,
        "metric": "heldout/pass_rate",
        "value": 0.875,
        "heldout_reward": 0.9375,
    }
    assert response.json()["resolved"]["best_metric"] == "heldout/pass_rate"


def test_rest_says_null_while_nothing_is_evaluated(lab, schema):
    run = launch(lab)
    checkpoints(run, 2)
    response = api_client_for(lab["viewer"]).get(f"/api/v1/runs/{run.pk}")
    assert_matches_schema(schema, response, "get", "/api/v1/runs/{id}")
    assert response.json()["best_checkpoint"] is None


# --- what Export, Try and Train on reviews start from -------------------------------------------


def test_the_playground_opened_for_a_run_picks_its_best_checkpoint_and_a_list_still_overrides(client, lab):
    run, _ = scored_run(lab)
    client.force_login(lab["viewer"])
    body = client.get(reverse("playground"), {"run": run.pk}).content.decode()
    checked = [part.split('"')[0] for part in body.split('name="model" value="')[1:] if " checked>" in part]
    assert checked == [f"run-{run.pk}-step-4"]
    body = client.get(reverse("playground"), {"models": f"run-{run.pk}-step-6"}).content.decode()
    checked = [part.split('"')[0] for part in body.split('name="model" value="')[1:] if " checked>" in part]
    assert checked == [f"run-{run.pk}-step-6"]
    client.force_login(lab["outsider"])  # a run the caller may not see picks nothing
    body = client.get(reverse("playground"), {"run": run.pk}).content.decode()
    assert f"run-{run.pk}-step" not in body


def test_train_on_reviews_starts_from_the_best_checkpoint_not_the_newest(client, lab):
    run, saved = scored_run(lab)
    item = run.task_set_version.items.filter(split="train").order_by("position").first()
    good = Trajectory.objects.create(
        run=run, item=item, sample_index=0, policy_version=4, outcome="scored", reward=1.0,
        completion_text=str(item.data["reference"]),
    )  # fmt: skip
    Review.objects.create(trajectory=good, reviewer=lab["reviewer"], label="good")
    preview = api_client_for(lab["viewer"]).get(f"/api/v1/runs/{run.pk}/train-on-reviews").json()
    assert preview["checkpoint"] == saved[4].pk
    client.force_login(lab["launcher"])
    page = client.get(reverse("run-detail", args=[run.pk])).content.decode()
    assert "a run on it that starts from checkpoint 4." in page
    response = api_client_for(lab["launcher"]).post(
        f"/api/v1/runs/{run.pk}/train-on-reviews", {"method": "sft"}, format="json"
    )
    assert response.status_code == 201, response.json()
    child = Run.objects.get(pk=response.json()["run"]["id"])
    assert (child.parent_id, child.parent_checkpoint_id) == (run.pk, saved[4].pk)

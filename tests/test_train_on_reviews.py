"""Reviews to the next run: exports a learner can read (texts where texts belong, provenance apart,
useless pairs skipped and counted), submit refusing pairs the learner could not read, and Train on
reviews over REST and from the run page, with its control and its result against that control."""

# The fixture imported from run_fixtures is a test parameter here, not a redefinition:
# ruff: noqa: F811
import json

import pytest

from projects import services as project_services
from projects.models import TaskSetVersion
from reviews.models import Preference, Review, ReviewTraining
from runs import lifecycle, outcomes
from runs.lifecycle import RunRequest
from runs.models import Checkpoint, HeldOutResult, Run, Trajectory
from tests.conftest import api_client_for
from tests.run_fixtures import lab, make_run, set_status  # noqa: F401
from tests.test_api_schema import assert_matches_schema, schema  # noqa: F401

pytestmark = pytest.mark.django_db


def sample(run, item, index, text, reward=1.0):
    return Trajectory.objects.create(
        run=run,
        item=item,
        sample_index=index,
        policy_version=2,
        outcome="scored",
        reward=reward,
        completion_text=text,
    )


@pytest.fixture
def reviewed(lab):
    """A run with a checkpoint, and reviews that make: 3 good completions (one a repeat), a pair
    from a preference and one from labels, an identical pair, empty ones and a repeated one."""
    run = make_run(lab)
    Checkpoint.objects.create(run=run, step=5, policy_version=5, path="ckpt-5")
    first, second = run.task_set_version.items.filter(split="train").order_by("position")[:2]
    right, wrong, again, empty = (
        sample(run, first, 0, str(first.data["reference"])),
        sample(run, first, 1, "banana", reward=0.0),
        sample(run, first, 2, str(first.data["reference"])),
        sample(run, first, 3, "", reward=0.0),
    )
    other_right, other_same = sample(run, second, 0, "7"), sample(run, second, 1, "7")
    other_bad = sample(run, second, 2, "8", reward=0.0)
    reviewer = lab["reviewer"]
    labels = [(right, "good"), (again, "good"), (wrong, "bad"), (empty, "bad")]
    for trajectory, label in labels + [(other_right, "good"), (other_bad, "bad")]:
        Review.objects.create(trajectory=trajectory, reviewer=reviewer, label=label)
    Preference.objects.create(run=run, chosen=right, rejected=wrong, reviewer=reviewer)
    Preference.objects.create(run=run, chosen=other_right, rejected=other_same, reviewer=reviewer)
    return {
        "run": run,
        "right": right,
        "wrong": wrong,
        "again": again,
        "first": first,
        "other_right": other_right,
        "other_bad": other_bad,
        "second": second,
    }


def export(client, run, kind):
    response = client.get("/api/v1/reviews/export", {"run": run.pk, "kind": kind})
    assert response.status_code == 200, response.content
    lines = [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]
    return lines, response


def test_the_dpo_task_set_export_puts_texts_in_chosen_and_rejected_and_provenance_apart(lab, reviewed):
    lines, response = export(api_client_for(lab["viewer"]), reviewed["run"], "dpo-task-set")
    right, wrong, first = reviewed["right"], reviewed["wrong"], reviewed["first"]
    second = reviewed["second"]
    assert [line["id"] for line in lines] == [
        f"{first.external_id}-t{right.pk}-over-t{wrong.pk}",
        f"{second.external_id}-t{reviewed['other_right'].pk}-over-t{reviewed['other_bad'].pk}",
    ]
    assert [line["metadata"]["provenance"]["source"] for line in lines] == ["preference", "labels"]
    pair = lines[0]
    assert (pair["kind"], pair["prompt"], pair["reference"], pair["split"]) == (
        "answer",
        first.text,
        right.completion_text,
        "train",
    )
    assert pair["metadata"]["chosen"] == right.completion_text
    assert pair["metadata"]["rejected"] == "banana"
    assert pair["metadata"]["provenance"] == {
        "source": "preference",
        "chosen": {
            "run": reviewed["run"].pk,
            "trajectory": right.pk,
            "item": first.external_id,
            "policy_version": 2,
            "reward": 1.0,
        },
        "rejected": {
            "run": reviewed["run"].pk,
            "trajectory": wrong.pk,
            "item": first.external_id,
            "policy_version": 2,
            "reward": 0.0,
        },
    }
    # the identical "7"/"7" preference, good over empty, and the repeated "4" over "banana" of
    # the other good completion: skipped and counted, never written
    assert response["Flywheel-Export-Lines"] == "2"
    assert response["Flywheel-Export-Skipped"] == "empty=2, identical=1, duplicate=1, multi_step=0"


def test_the_sft_export_skips_a_repeated_completion_and_keeps_provenance_under_its_key(lab, reviewed):
    lines, response = export(api_client_for(lab["viewer"]), reviewed["run"], "sft")
    assert [line["reference"] for line in lines] == ["4", "7"]
    assert lines[0]["metadata"] == {
        "provenance": {
            "run": reviewed["run"].pk,
            "trajectory": reviewed["right"].pk,
            "item": reviewed["first"].external_id,
            "policy_version": 2,
            "reward": 1.0,
            "label": "good",
        }
    }
    assert response["Flywheel-Export-Skipped"] == "empty=0, identical=0, duplicate=1, multi_step=0"


def import_lines(lab, name, lines) -> TaskSetVersion:
    task_set = project_services.task_set_create(project=lab["project"], name=name, by=lab["owner"])
    stream = [(json.dumps(line) + "\n").encode() for line in lines]
    report = project_services.task_set_import(
        task_set=task_set, stream=stream, file_format="jsonl", by=lab["owner"]
    )
    assert report.ok, report.errors
    return report.version


def dpo_request(lab, version) -> RunRequest:
    return RunRequest(
        project=lab["project"],
        name="dpo",
        task_set_version=version,
        reward_rule_version=lab["rule"].versions.get(),
        tier=lab["tier"],
        method="dpo",
        eval_split="train",
    )


def test_submit_accepts_the_exported_pairs(lab, reviewed):
    lines, _ = export(api_client_for(lab["viewer"]), reviewed["run"], "dpo-task-set")
    version = import_lines(lab, "pairs", lines)
    assert lifecycle.run_problems(dpo_request(lab, version))[1] == {}


def test_submit_refuses_pairs_whose_fields_are_not_texts_naming_each_item(lab):
    base = {"kind": "answer", "prompt": "1+1?", "reference": "2", "split": "train"}
    lines = [
        base | {"id": "ok", "metadata": {"chosen": "2", "rejected": "3"}},
        base | {"id": "provenance", "metadata": {"chosen": {"run": 1, "trajectory": 4}, "rejected": "3"}},
        base | {"id": "same", "metadata": {"chosen": "2", "rejected": "2"}},
        base | {"id": "blank", "metadata": {"chosen": "2", "rejected": "  "}},
        base
        | {
            "id": "chat",
            "metadata": {"chosen": [{"role": "assistant", "content": "2"}], "rejected": [{"role": "user"}]},
        },
    ]
    version = import_lines(lab, "bad pairs", lines)
    before = Run.objects.count()
    response = api_client_for(lab["owner"]).post(
        "/api/v1/runs",
        lab["launch"]
        | {"task_set_version": version.pk, "method": "dpo", "eval_split": "train", "hyperparameters": {}},
        format="json",
    )
    assert response.status_code == 400
    (problem,) = [d for d in response.json()["error"]["details"] if d["param"] == "task_set_version"]
    assert problem["message"] == (
        "4 of 5 preference pairs cannot be trained on: "
        "provenance: metadata.chosen must be a text (a string or a list of messages), not an object | "
        "same: metadata.chosen and metadata.rejected are the same text | "
        "blank: metadata.rejected is empty | "
        "chat: metadata.rejected message 0 must be an object with a string role and content"
    )
    assert Run.objects.count() == before


def test_submit_refuses_sft_on_a_code_item_with_an_empty_reference_solution(lab):
    code = {"kind": "code", "prompt": "p", "tests": "assert True\n", "entry_point": "f", "split": "train"}
    version = import_lines(lab, "code", [code | {"id": "c1", "reference_solution": " "}, code | {"id": "c2"}])
    request = dpo_request(lab, version)
    problems = lifecycle.run_problems(RunRequest(**(vars(request) | {"method": "sft"})))[1]
    assert problems["method"] == "SFT needs a reference solution for every code item; 2 have none (c1, c2)"


# --- train on reviews ----------------------------------------------------------------------


def test_train_on_reviews_previews_what_each_method_would_get(lab, reviewed):
    body = api_client_for(lab["viewer"]).get(f"/api/v1/runs/{reviewed['run'].pk}/train-on-reviews").json()
    skipped = {"empty": 0, "identical": 0, "duplicate": 0, "multi_step": 0}
    assert body == {
        "run": reviewed["run"].pk,
        "checkpoint": Checkpoint.objects.get(run=reviewed["run"]).pk,
        "sft": {"examples": 2, "heldout_items": 2, "skipped": skipped | {"duplicate": 1}},
        "dpo": {
            "pairs": 2,
            "from_preferences": 1,
            "from_labels": 1,
            "heldout_items": 2,
            "skipped": skipped | {"empty": 2, "identical": 1, "duplicate": 1},
        },
    }


def test_train_on_reviews_makes_a_version_and_a_dpo_run_from_the_final_checkpoint(lab, reviewed):
    parent = reviewed["run"]
    Checkpoint.objects.create(run=parent, step=2, policy_version=2, path="ckpt-2")
    response = api_client_for(lab["launcher"]).post(
        f"/api/v1/runs/{parent.pk}/train-on-reviews", {"method": "dpo", "max_steps": 4}, format="json"
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    child = Run.objects.get(pk=body["run"]["id"])
    final = Checkpoint.objects.get(run=parent, step=5)
    assert (child.method, child.parent_id, child.parent_checkpoint_id, child.max_steps) == (
        "dpo",
        parent.pk,
        final.pk,
        4,
    )
    assert (child.status, child.eval_split, child.reward_rule_version_id) == (
        "queued",
        "heldout",
        parent.reward_rule_version_id,
    )
    assert child.resolved["eval_items"] == parent.resolved["eval_items"]
    assert child.resolved["epochs"] == 16  # 4 steps of 8 pairs over 2 pairs
    assert child.resolved["learning_rate"] == 1e-5
    version = child.task_set_version
    assert version.task_set.name == "arith reviews"
    assert (version.item_count, version.split_counts) == (4, {"heldout": 2, "train": 2})
    heldout = parent.task_set_version.items.filter(split="heldout").order_by("position")
    copied = version.items.filter(split="heldout").order_by("position")
    assert [(i.external_id, i.data) for i in copied] == [(i.external_id, i.data) for i in heldout]
    pair = version.items.get(external_id=f"q2-t{reviewed['right'].pk}-over-t{reviewed['wrong'].pk}")
    assert (pair.data["metadata"]["chosen"], pair.data["metadata"]["rejected"]) == ("4", "banana")
    assert pair.data["metadata"]["provenance"]["source"] == "preference"
    assert pair.data["reference"] == "4"  # the item still grades as it did
    assert body["counts"]["pairs"] == 2 and body["task_set_version"]["created"] is True
    assert body["compare_url"] == f"/runs/compare/?runs={child.pk},{parent.pk}"
    assert body["checkpoint"] == final.pk and body["parent"] == parent.pk


def test_train_on_reviews_sft_learns_the_good_completion(lab, reviewed):
    response = api_client_for(lab["owner"]).post(
        f"/api/v1/runs/{reviewed['run'].pk}/train-on-reviews", {"method": "sft"}, format="json"
    )
    assert response.status_code == 201, response.json()
    version = Run.objects.get(pk=response.json()["run"]["id"]).task_set_version
    items = version.items.filter(split="train").order_by("position")
    assert [(item.external_id, item.data["reference"]) for item in items] == [
        (f"q2-t{reviewed['right'].pk}", "4"),
        (f"q3-t{reviewed['other_right'].pk}", "7"),
    ]
    assert items[0].data["metadata"]["provenance"]["label"] == "good"


def test_train_on_reviews_without_a_checkpoint_or_reviews_is_refused_and_makes_nothing(lab, reviewed):
    client = api_client_for(lab["owner"])
    bare = make_run(lab, name="bare")
    runs, versions = Run.objects.count(), TaskSetVersion.objects.count()
    no_checkpoint = client.post(f"/api/v1/runs/{bare.pk}/train-on-reviews", {"method": "sft"}, format="json")
    assert no_checkpoint.status_code == 409
    Checkpoint.objects.create(run=bare, step=1, policy_version=1, path="c")
    nothing = client.post(f"/api/v1/runs/{bare.pk}/train-on-reviews", {"method": "dpo"}, format="json")
    assert nothing.status_code == 400
    assert nothing.json()["error"]["message"].startswith(f"method: run {bare.pk}'s reviews hold nothing")
    viewer = api_client_for(lab["viewer"]).post(
        f"/api/v1/runs/{reviewed['run'].pk}/train-on-reviews", {"method": "sft"}, format="json"
    )
    assert viewer.status_code == 403
    assert (Run.objects.count(), TaskSetVersion.objects.count()) == (runs, versions)
    assert not ReviewTraining.objects.exists()


def test_the_run_page_shows_the_counts_and_its_button_launches_the_run(client, lab, reviewed):
    run = reviewed["run"]
    client.force_login(lab["launcher"])
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="train-on-reviews"' in page and "2 pairs (1 chosen, 1 from labels)" in page
    response = client.post(f"/runs/{run.pk}/train-on-reviews/", {"method": "sft", "max_steps": "3"})
    child = Run.objects.get(parent=run, method="sft")
    assert response.status_code == 302 and response["Location"] == f"/runs/{child.pk}/"
    assert (child.method, child.max_steps) == ("sft", 3)
    shown = client.get(response["Location"]).content.decode()
    assert "holds 2 good completions and 2 held-out items" in shown
    assert f"?runs={child.pk},{run.pk}" in shown  # the comparison with its parent, one click away
    client.force_login(lab["viewer"])
    assert "Train on reviews</button>" not in client.get(f"/runs/{run.pk}/").content.decode()
    assert client.post(f"/runs/{run.pk}/train-on-reviews/", {"method": "sft"}).status_code == 403


# --- the control and the result against it ----------------------------------------------------


def test_train_on_reviews_launches_its_control_from_the_same_checkpoint_method_settings_and_steps(
    lab, reviewed, schema
):
    parent = reviewed["run"]
    Checkpoint.objects.create(run=parent, step=2, policy_version=2, path="ckpt-2")
    response = api_client_for(lab["launcher"]).post(
        f"/api/v1/runs/{parent.pk}/train-on-reviews", {"method": "dpo", "max_steps": 4}, format="json"
    )
    assert response.status_code == 201, response.json()
    assert_matches_schema(schema, response, "post", "/api/v1/runs/{id}/train-on-reviews")
    body = response.json()
    child, control = Run.objects.get(pk=body["run"]["id"]), Run.objects.get(pk=body["control"]["id"])
    final = Checkpoint.objects.get(run=parent, step=5)
    assert (control.method, control.parent_id, control.parent_checkpoint_id, control.max_steps) == (
        "grpo",
        parent.pk,
        final.pk,
        4,
    )
    assert (control.task_set_version_id, control.reward_rule_version_id, control.tier_id) == (
        parent.task_set_version_id,
        parent.reward_rule_version_id,
        parent.tier_id,
    )
    # The parent's own settings, evaluated and checkpointed on the reviews run's schedule.
    assert control.hyperparameters == {"group_size": 4, "checkpoint_every": 10, "eval_every": 10}
    assert (control.train_split, control.eval_split, control.status) == ("train", "heldout", "queued")
    assert control.name == f"{child.name} · control"
    training = ReviewTraining.objects.get()
    assert (training.run, training.control, training.parent, training.checkpoint, training.method) == (
        child,
        control,
        parent,
        final,
        "dpo",
    )
    assert (body["training"], body["result_url"]) == (training.pk, f"/api/v1/review-trainings/{training.pk}")
    result = api_client_for(lab["viewer"]).get(body["result_url"])
    assert_matches_schema(schema, result, "get", "/api/v1/review-trainings/{id}")
    shown = result.json()
    assert (shown["status"], shown["lift_over_control"], shown["flags"], shown["regressed"]) == (
        "pending",
        None,
        [],
        False,
    )
    assert (shown["run"]["run"], shown["control"]["run"], shown["steps"]) == (child.pk, control.pk, 4)
    assert api_client_for(lab["outsider"]).get(body["result_url"]).status_code == 404


def heldout(run: Run, step: int, passed: list[bool]) -> None:
    """The run's held-out results at `step`, one per held-out item in order, as the eval worker
    writes them."""
    items = run.task_set_version.items.filter(split="heldout").order_by("position")
    assert len(items) == len(passed)
    for item, ok in zip(items, passed, strict=True):
        HeldOutResult.objects.create(run=run, step=step, item=item, reward=float(ok), passed=ok)


def finished(run: Run, start: list[bool], final: list[bool]) -> Run:
    """A run that ran its steps and settled its outcome the way the learner does."""
    heldout(run, 0, start)
    heldout(run, run.max_steps, final)
    run = set_status(run, "succeeded", learner_step=run.max_steps, policy_version=run.max_steps)
    outcomes.run_outcome_settle(run=run, step=run.max_steps)
    return run


@pytest.fixture
def trained(lab, reviewed):
    """A Train on reviews launched through the real service, its two runs' records written as the
    workers would."""
    answer = api_client_for(lab["owner"]).post(
        f"/api/v1/runs/{reviewed['run'].pk}/train-on-reviews",
        {"method": "sft", "max_steps": 3},
        format="json",
    )
    assert answer.status_code == 201, answer.json()
    return ReviewTraining.objects.get(pk=answer.json()["training"])


def test_a_train_on_reviews_that_regresses_is_flagged_with_its_controls_figure_beside_it(
    client, lab, trained, schema
):
    run = finished(trained.run, start=[True, True], final=[False, False])
    control = finished(trained.control, start=[True, True], final=[True, True])
    assert (run.outcome, control.outcome) == ("regressed", "unchanged")
    response = api_client_for(lab["viewer"]).get(f"/api/v1/review-trainings/{trained.pk}")
    assert response.status_code == 200
    assert_matches_schema(schema, response, "get", "/api/v1/review-trainings/{id}")
    body = response.json()
    assert body["status"] == "complete" and body["regressed"] is True
    assert body["lift_over_control"] == {
        "before": 1.0,
        "after": 0.0,
        "delta": -1.0,
        "low": -1.0,
        "high": -1.0,
        "confidence": 0.95,
        "items": 2,
        "improved_items": 0,
        "regressed_items": 2,
        "control_step": 3,
        "run_step": 3,
        "verdict": "loses_to_control",
    }
    figures = {
        side: (body[side]["before"], body[side]["after"], body[side]["outcome"])
        for side in ("run", "control")
    }
    assert figures == {"run": (1.0, 0.0, "regressed"), "control": (1.0, 1.0, "unchanged")}
    assert body["flags"] == [
        "Regressed against its parent: regressed: held-out pass rate 100.0% → 0.0% "
        "(−100.0 points, 95% interval −100.0 to −100.0) on 2 items.",
        "Lost to its control: 0.0% against the control's 100.0% on 2 items; the same steps without "
        "the reviews did better.",
    ]
    client.force_login(lab["viewer"])
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="regressed-flag"' in page and 'data-verdict="loses_to_control"' in page
    assert "loses to its control</strong>, held-out pass rate 0.000 against the control's 1.000" in page
    assert f'<tr data-role="control"><td>control: <a href="/runs/{control.pk}/">' in page
    assert '<td>succeeded</td><td class="num">1.000</td><td class="num">1.000</td><td>unchanged</td>' in page
    control_page = client.get(f"/runs/{control.pk}/").content.decode()
    assert f'The control of <a href="/runs/{run.pk}/">' in control_page


@pytest.mark.parametrize(
    ("run_final", "verdict", "lift"),
    [
        ([True, True], "beats_control", (0.0, 1.0, 1.0, 1.0)),
        ([True, False], "no_difference", (0.0, 0.5, 0.0, 1.0)),
    ],
)
def test_the_lift_over_the_control_is_a_verdict_only_when_its_interval_excludes_0(
    lab, trained, run_final, verdict, lift
):
    finished(trained.run, start=[False, False], final=run_final)
    finished(trained.control, start=[False, False], final=[False, False])
    body = api_client_for(lab["viewer"]).get(f"/api/v1/review-trainings/{trained.pk}").json()
    shown = body["lift_over_control"]
    assert (shown["before"], shown["after"], shown["low"], shown["high"], shown["verdict"]) == (
        *lift,
        verdict,
    )
    assert (body["flags"], body["regressed"]) == ([], False)


def test_a_control_that_failed_leaves_the_result_incomplete_and_says_why(lab, trained):
    finished(trained.run, start=[True, True], final=[True, True])
    set_status(trained.control, "failed")
    body = api_client_for(lab["viewer"]).get(f"/api/v1/review-trainings/{trained.pk}").json()
    assert (body["status"], body["lift_over_control"]) == ("incomplete", None)
    assert body["flags"] == ["The control failed: the lift over it cannot be measured."]

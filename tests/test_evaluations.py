"""Evaluation suites: the pass@k estimator, suites and versions refused with the field named, a run
naming a suite, the learner's schedule sending the suite without waiting for it, the REST shapes,
the pages (model output escaped), and one evaluation of a run's policy version and of a tier
through a real eval worker with the tiny model."""

import json
from math import comb

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from evaluations import services as suite_services
from evaluations.metrics import ItemFigures, figures, pass_at_k
from evaluations.models import Suite, SuiteEvaluation, SuiteResult, SuiteVersion
from projects import services as project_services
from runs.lifecycle import RunRequest, run_create
from runs.models import Run
from runs.run_store import policy_publish
from tests.conftest import api_client_for
from tests.run_fixtures import lab, make_run  # noqa: F401  (lab: a fixture)
from tests.run_harness import Host, demo_project, hosts_killed, tiny_model, wait_until, worker_env
from tests.test_api_schema import assert_matches_schema, schema  # noqa: F401  (a fixture)

__all__ = ["lab", "schema", "tiny_model"]


# --- the estimator -----------------------------------------------------------------------


def test_pass_at_k_is_the_unbiased_estimator_with_exact_values():
    assert pass_at_k(5, 2, 2) == 1 - comb(3, 2) / comb(5, 2) == pytest.approx(0.7)
    assert pass_at_k(10, 1, 10) == 1.0  # every draw of all ten holds the one pass
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(20, 3, 5) == pytest.approx(1 - 6188 / 15504)  # 1 - C(17,5) / C(20,5)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)


def test_figures_average_pass_at_k_over_items_and_rewards_over_samples():
    items = [
        ItemFigures(4, 1, (1.0, 0.0, 0.0, 0.0), graders={"tests": 0.25, "style": 1.0}, tokens=(2, 4, 6, 8)),
        ItemFigures(4, 4, (1.0, 1.0, 1.0, 1.0), graders={"tests": 1.0, "style": 0.5}, tokens=(4, 4, 4, 4)),
        ItemFigures(2, 0, (0.0, 0.0), invalid_actions=3, steps=6, errored=2),
    ]
    result = figures(items, [2, 4])
    assert result == {
        "items": 3,
        "samples": 10,
        "errored": 2,
        "pass@1": pytest.approx((0.25 + 1.0 + 0.0) / 3),
        "pass@2": pytest.approx((0.5 + 1.0 + 0.0) / 3),
        "pass@4": pytest.approx((1.0 + 1.0) / 2),  # the item with 2 samples cannot give pass@4
        "mean_reward": pytest.approx(5 / 10),
        "graders": {"style": pytest.approx(0.75), "tests": pytest.approx(0.625)},
        "invalid_action_rate": 0.5,
        "mean_length": pytest.approx(36 / 8),  # over the samples that carry their tokens
    }


# --- suites, versions and their refusals ----------------------------------------------------


def entry_of(lab, **changes) -> dict:
    return {
        "task_set_version": lab["version"].pk,
        "split": "heldout",
        "reward_rule_version": lab["rule"].versions.get().pk,
    } | changes


def test_a_suite_is_created_over_rest_with_its_first_version(lab):
    client = api_client_for(lab["launcher"])
    body = {"project": lab["project"].pk, "name": "core", "entries": [entry_of(lab, limit=1)]}
    response = client.post("/api/v1/eval-suites", body, format="json")
    assert response.status_code == 201, response.json()
    suite = Suite.objects.get(pk=response.json()["id"])
    version = suite.versions.get()
    assert (version.number, version.sampling) == (
        1,
        {"samples": 1, "k": [1], "temperature": 0.0, "pass_threshold": 1.0},
    )
    entry = version.entries.get()
    assert (entry.task_set_version, entry.split, entry.limit) == (lab["version"], "heldout", 1)
    again = client.post(
        f"/api/v1/eval-suites/{suite.pk}/versions",
        {"entries": [entry_of(lab)], "sampling": {"samples": 4, "k": [4, 1, 2], "temperature": 0.7}},
        format="json",
    )
    assert again.status_code == 201, again.json()
    assert (again.json()["number"], again.json()["sampling"]["k"]) == (2, [1, 2, 4])
    detail = client.get(f"/api/v1/eval-suites/{suite.pk}").json()
    assert [v["number"] for v in detail["versions"]] == [2, 1]


def test_a_bad_version_is_refused_naming_every_field_and_writes_nothing(lab, team):

    other_set = project_services.task_set_create(
        project=team["other_project"], name="theirs", by=team["outsider"]
    )
    client = api_client_for(lab["owner"])
    body = {
        "project": lab["project"].pk,
        "name": "bad",
        "entries": [
            entry_of(lab, task_set_version=other_set.pk + 1000),
            entry_of(lab, reward_rule_version=99999),
        ],
        "sampling": {"samples": 2, "k": [3], "temperature": 0.5},
    }
    response = client.post("/api/v1/eval-suites", body, format="json")
    assert response.status_code == 400
    params = sorted(detail["param"] for detail in response.json()["error"]["details"])
    assert params == ["entries[0].task_set_version", "entries[1].reward_rule_version", "sampling.k"]
    assert not Suite.objects.filter(name="bad").exists()
    greedy = client.post(
        "/api/v1/eval-suites",
        body | {"entries": [entry_of(lab)], "sampling": {"samples": 3}},
        format="json",
    )
    assert greedy.status_code == 400
    assert [d["param"] for d in greedy.json()["error"]["details"]] == ["sampling.temperature"]
    assert not Suite.objects.exists()


def make_suite(lab, **sampling) -> SuiteVersion:
    suite = suite_services.suite_create(
        project=lab["project"],
        name="core",
        by=lab["owner"],
        entries=[entry_of(lab)],
        sampling=sampling or None,
    )
    return suite.versions.get()


def test_a_run_may_name_a_suite_version_of_its_own_project_only(lab, team):
    version = make_suite(lab)
    request = dict(
        project=lab["project"],
        name="with suite",
        task_set_version=lab["version"],
        reward_rule_version=lab["rule"].versions.get(),
        tier=lab["tier"],
        hyperparameters={"group_size": 4, "eval_suite_version": version.pk},
    )
    run = run_create(request=RunRequest(**request), by=lab["owner"])
    assert run.resolved["eval_suite_version"] == version.pk
    other = Suite.objects.create(project=team["other_project"], name="theirs")
    foreign = SuiteVersion.objects.create(suite=other, number=1, sampling={})
    client = api_client_for(lab["owner"])
    body = lab["launch"] | {"hyperparameters": {"group_size": 4, "eval_suite_version": foreign.pk}}
    response = client.post("/api/v1/runs", body, format="json")
    assert response.status_code == 400
    details = {d["param"]: d["message"] for d in response.json()["error"]["details"]}
    assert details == {
        "hyperparameters.eval_suite_version": f"no evaluation suite version {foreign.pk} in project alpha"
    }
    assert Run.objects.count() == 1


# --- the schedule ---------------------------------------------------------------------------


def eval_queue(command: str, *args):
    """The eval queue's Redis list, read or emptied (no eval worker runs in these tests)."""
    from webapp.celery import app

    with app.connection_for_write() as connection:
        return getattr(connection.default_channel.client, command)("eval", *args)


def eval_queue_messages(evaluation_id: int) -> int:
    """Messages for this suite evaluation waiting on the eval queue."""
    raw = eval_queue("lrange", 0, -1)
    headers = [json.loads(message)["headers"] for message in raw]
    return sum(h["task"] == "workers.eval.suite" and h["argsrepr"] == f"({evaluation_id},)" for h in headers)


def test_the_learners_evaluation_request_sends_the_runs_suite_without_waiting(lab):
    from workers.run_learner import evaluate_later

    eval_queue("delete")  # what earlier sessions left there (ids are reused by each test database)
    version = make_suite(lab)
    plain = run_create(
        request=RunRequest(
            project=lab["project"],
            name="plain",
            task_set_version=lab["version"],
            reward_rule_version=lab["rule"].versions.get(),
            tier=lab["tier"],
            hyperparameters={"group_size": 4},
        ),
        by=lab["owner"],
    )
    evaluate_later(plain.pk, 0)
    assert not SuiteEvaluation.objects.exists()  # a run that names no suite asks for none
    run = run_create(
        request=RunRequest(
            project=lab["project"],
            name="with suite",
            task_set_version=lab["version"],
            reward_rule_version=lab["rule"].versions.get(),
            tier=lab["tier"],
            hyperparameters={"group_size": 4, "eval_suite_version": version.pk},
        ),
        by=lab["owner"],
    )
    evaluate_later(run.pk, 2)
    # It returned with the evaluation still queued: no eval worker runs, so it never waited for one.
    evaluation = SuiteEvaluation.objects.get()
    assert (evaluation.status, evaluation.scheduled, evaluation.run, evaluation.policy_version) == (
        "queued",
        True,
        run,
        2,
    )
    assert (evaluation.suite_version, evaluation.target) == (version, "policy")
    assert eval_queue_messages(evaluation.pk) == 1
    evaluate_later(run.pk, 2)  # asked again (the final evaluation's resend): the same one, sent again
    assert SuiteEvaluation.objects.count() == 1
    assert eval_queue_messages(evaluation.pk) == 2
    SuiteEvaluation.objects.filter(pk=evaluation.pk).update(status="succeeded")
    evaluate_later(run.pk, 2)  # once done, never again
    assert eval_queue_messages(evaluation.pk) == 2


def test_a_second_delivery_finds_the_evaluation_claimed(lab):
    version = make_suite(lab)
    evaluation = suite_services.suite_evaluate(suite_version=version, by=lab["owner"], tier=lab["tier"])
    assert suite_services.suite_evaluation_claim(evaluation_id=evaluation.pk).status == "running"
    assert suite_services.suite_evaluation_claim(evaluation_id=evaluation.pk) is None


# --- REST shapes and pages ------------------------------------------------------------------


def finished_evaluation(lab, text: str = "print(1)") -> SuiteEvaluation:
    version = make_suite(lab, samples=2, k=[1, 2], temperature=1.0)
    evaluation = suite_services.suite_evaluate(suite_version=version, by=lab["owner"], tier=lab["tier"])
    item = lab["version"].items.filter(split="heldout").first()
    completion = {"text": text, "tokens": 3, "reward": 1.0, "passed": True, "errored": False}
    SuiteResult.objects.create(
        evaluation=evaluation,
        entry=0,
        item=item,
        samples=2,
        passes=1,
        reward_mean=0.5,
        grader_means={},
        completion_tokens_mean=3.0,
        completions=[completion, completion | {"reward": 0.0, "passed": False}],
    )
    metrics = figures([ItemFigures(2, 1, (1.0, 0.0), tokens=(3, 3))], [1, 2])
    SuiteEvaluation.objects.filter(pk=evaluation.pk).update(
        status="succeeded",
        metrics={"overall": metrics, "entries": [{"entry": 0, "task_set": "arith"} | metrics]},
    )
    return SuiteEvaluation.objects.get(pk=evaluation.pk)


def test_answers_match_their_declared_shapes(lab, schema):  # noqa: F811
    client = api_client_for(lab["owner"])
    evaluation = finished_evaluation(lab)
    suite = evaluation.suite_version.suite
    answers = [
        ("get", "/api/v1/eval-suites", client.get("/api/v1/eval-suites")),
        (
            "post",
            "/api/v1/eval-suites",
            client.post(
                "/api/v1/eval-suites", {"project": lab["project"].pk, "name": "empty"}, format="json"
            ),
        ),
        ("get", "/api/v1/eval-suites/{id}", client.get(f"/api/v1/eval-suites/{suite.pk}")),
        (
            "post",
            "/api/v1/eval-suites/{id}/versions",
            client.post(
                f"/api/v1/eval-suites/{suite.pk}/versions", {"entries": [entry_of(lab)]}, format="json"
            ),
        ),
        (
            "post",
            "/api/v1/eval-suites/{id}/evaluate",
            client.post(f"/api/v1/eval-suites/{suite.pk}/evaluate", {"tier": lab["tier"].pk}, format="json"),
        ),
        (
            "post",
            "/api/v1/eval-suites/{id}/evaluate",
            client.post(f"/api/v1/eval-suites/{suite.pk}/evaluate", {}, format="json"),
        ),
        ("get", "/api/v1/suite-evaluations/{id}", client.get(f"/api/v1/suite-evaluations/{evaluation.pk}")),
        (
            "get",
            "/api/v1/suite-evaluations/{id}/results",
            client.get(f"/api/v1/suite-evaluations/{evaluation.pk}/results"),
        ),
    ]
    assert [response.status_code for _, _, response in answers] == [200, 201, 200, 201, 201, 400, 200, 200]
    for method, path, response in answers:
        assert_matches_schema(schema, response, method, path)
    assert answers[5][2].json()["error"]["param"] == "target"
    detail = answers[6][2].json()
    assert (detail["status"], detail["metrics"]["overall"]["pass@2"]) == ("succeeded", 1.0)
    (result,) = answers[7][2].json()["results"]
    assert (result["samples"], result["passes"], len(result["completions"])) == (2, 1, 2)


def test_the_pages_show_the_figures_and_escape_model_output(lab, client):
    evaluation = finished_evaluation(lab, text="<script>alert('x')</script>")
    client.force_login(lab["viewer"])
    page = client.get(f"/suite-evaluations/{evaluation.pk}/").content.decode()
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "<script>alert(" not in page
    assert 'id="figures-table"' in page and "pass@2" in page
    suite_page = client.get(f"/eval-suites/{evaluation.suite_version.suite_id}/").content.decode()
    assert f'href="/suite-evaluations/{evaluation.pk}/"' in suite_page
    assert 'id="evaluate-form"' not in suite_page  # a viewer reads, and only reads
    project_page = client.get(f"/projects/{lab['project'].pk}/").content.decode()
    assert f'href="/projects/{lab["project"].pk}/eval-suites/"' in project_page


# --- through a real eval worker -------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_runs_policy_version_and_a_tier_are_evaluated_by_a_real_eval_worker(tiny_model):
    setup = demo_project(tiny_model)
    owner, rule_version = setup["owner"], setup["rule"].versions.get()
    run = run_create(
        request=RunRequest(
            project=setup["project"],
            name="evaluated",
            task_set_version=setup["version"],
            reward_rule_version=rule_version,
            tier=setup["tier"],
            hyperparameters={"group_size": 4},
        ),
        by=owner,
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    policy_publish(run.pk, 1, model, AutoTokenizer.from_pretrained(tiny_model))
    Run.objects.filter(pk=run.pk).update(policy_version=1)
    entries = [
        {
            "task_set_version": setup["version"].pk,
            "split": "heldout",
            "reward_rule_version": rule_version.pk,
            "limit": 2,
        },
        {
            "task_set_version": setup["version"].pk,
            "split": "train",
            "reward_rule_version": rule_version.pk,
            "limit": 1,
        },
    ]
    client = api_client_for(owner)
    created = client.post(
        "/api/v1/eval-suites",
        {
            "project": setup["project"].pk,
            "name": "demo",
            "entries": entries,
            "sampling": {"samples": 3, "k": [1, 3], "temperature": 1.0},
        },
        format="json",
    )
    assert created.status_code == 201, created.json()
    suite_id = created.json()["id"]
    host = Host(worker_env())
    with hosts_killed(host):
        host.worker("eval")
        ids = [
            client.post(f"/api/v1/eval-suites/{suite_id}/evaluate", target, format="json").json()["id"]
            for target in ({"run": run.pk, "version": 1}, {"tier": setup["tier"].pk})
        ]
        wait_until(
            lambda: all(SuiteEvaluation.objects.get(pk=pk).is_terminal for pk in ids), "the suite evaluations"
        )
    for pk in ids:
        evaluation = SuiteEvaluation.objects.get(pk=pk)
        assert evaluation.status == "succeeded", evaluation.error
        results = list(evaluation.results.order_by("id"))
        assert [(r.entry, r.samples + r.errored) for r in results] == [(0, 3), (0, 3), (1, 3)]
        assert all(len(r.completions) == 3 and r.completion_tokens_mean > 0 for r in results)
        overall, per_entry = evaluation.metrics["overall"], evaluation.metrics["entries"]
        graded = [r for r in results if r.samples]
        assert overall["items"] == 3 and [e["items"] for e in per_entry] == [2, 1]
        assert overall["pass@1"] == pytest.approx(sum(r.passes / r.samples for r in graded) / len(graded))
        expected = [pass_at_k(r.samples, r.passes, 3) for r in graded if r.samples >= 3]
        assert overall["pass@3"] == (pytest.approx(sum(expected) / len(expected)) if expected else None)
    policy, tier = (SuiteEvaluation.objects.get(pk=pk) for pk in ids)
    assert (policy.target, policy.run_id, policy.policy_version) == ("policy", run.pk, 1)
    assert (tier.target, tier.model) == ("tier", str(tiny_model))
    page = client.get(f"/api/v1/suite-evaluations/{ids[0]}/results?entry=1").json()["results"]
    assert [r["entry"] for r in page] == [1]


def test_a_checkpoint_shows_the_suite_scores_of_its_policy_version_on_the_run_page(lab, client):
    from runs.models import Checkpoint

    evaluation = finished_evaluation(lab)
    run = make_run(lab)
    SuiteEvaluation.objects.filter(pk=evaluation.pk).update(target="run", run=run, policy_version=3)
    Checkpoint.objects.create(run=run, step=3, policy_version=3, path="x")
    Checkpoint.objects.create(run=run, step=5, policy_version=5, path="y")
    client.force_login(lab["viewer"])
    page = client.get(f"/runs/{run.pk}/").content.decode()
    suite = evaluation.suite_version.suite.name
    row = page.split('data-step="3"')[1].split("</tr>")[0]
    assert f'href="/suite-evaluations/{evaluation.pk}/">{suite} v1</a>: pass@1 0.500' in row
    unevaluated = page.split('data-step="5"')[1].split("</tr>")[0]
    assert 'data-metric="suites"><span class="muted">—</span>' in unevaluated


def test_two_evaluations_of_a_suite_version_compare_item_by_item(lab, schema):  # noqa: F811
    before = finished_evaluation(lab)
    version = before.suite_version
    after = suite_services.suite_evaluate(suite_version=version, by=lab["owner"], tier=lab["tier"])
    result = before.results.get()
    SuiteResult.objects.create(
        evaluation=after, entry=0, item=result.item, samples=2, passes=2, reward_mean=1.0, completions=[]
    )
    client = api_client_for(lab["viewer"])
    url = f"/api/v1/suite-evaluations/{after.pk}/compare?against={before.pk}"
    response = client.get(url)
    assert_matches_schema(schema, response, "get", "/api/v1/suite-evaluations/{id}/compare")
    body = response.json()
    assert (body["before"], body["after"], body["summary"]["items"]) == (before.pk, after.pk, 1)
    [row] = body["items"]
    assert (row["external_id"], row["before"], row["after"], row["change"]) == (
        result.item.external_id,
        0.5,
        1.0,
        "improved",
    )
    assert body["summary"]["delta"] == 0.5
    assert client.get(url + "&change=regressed").json()["items"] == []
    other_suite = suite_services.suite_create(
        project=lab["project"], name="other", by=lab["owner"], entries=[entry_of(lab)]
    )
    other = suite_services.suite_evaluate(
        suite_version=other_suite.versions.get(), by=lab["owner"], tier=lab["tier"]
    )
    refused = client.get(f"/api/v1/suite-evaluations/{after.pk}/compare?against={other.pk}")
    assert refused.status_code == 409 and refused.json()["error"]["param"] == "against"
    assert api_client_for(lab["outsider"]).get(url).status_code == 404

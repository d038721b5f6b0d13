"""The reward-rules REST API: rules, versions, diffs, validation, dry-runs, OpenAI grader JSON;
the error shape, roles (viewers read, launchers and owners edit, outsiders see nothing), the schema."""

import json

import pytest
from rest_framework.test import APIClient

from projects import services as project_services
from rewards import services as reward_services
from rewards.models import RewardRule, RewardRuleVersion
from tests.conftest import api_client_for
from tests.test_api_schema import assert_matches_schema

EXACT = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.reference}}",
    "operation": "eq",
}
LOOSE = EXACT | {"operation": "ilike"}
ITEMS = [
    {"id": "q1", "kind": "answer", "prompt": "What is 1 + 1?", "reference": "2"},
    {"id": "q2", "kind": "answer", "prompt": "Name the capital of France.", "reference": "Paris"},
]


def error_of(response) -> dict:
    return response.json()["error"]


def create(client, project, name="exact answer", spec=None, **extra):
    body = {"project": project.pk, "name": name, "spec": spec or EXACT, **extra}
    return client.post("/api/v1/reward-rules", body, format="json")


@pytest.fixture
def rule(team) -> RewardRule:
    return reward_services.reward_rule_create(
        project=team["project"], name="exact answer", spec=EXACT, by=team["owner"]
    )


# --- rules ---------------------------------------------------------------------------------


def test_a_launcher_creates_a_rule_as_version_1(team):
    response = create(api_client_for(team["launcher"]), team["project"], description="math", note="first")
    assert response.status_code == 201
    body = response.json()
    rule = RewardRule.objects.get()
    version = rule.versions.get()
    assert body == {
        "id": rule.pk,
        "project": team["project"].pk,
        "name": "exact answer",
        "description": "math",
        "version_count": 1,
        "latest_version": {
            "id": version.pk,
            "rule": rule.pk,
            "number": 1,
            "spec": EXACT,
            "content_hash": reward_services.spec_content_hash(EXACT),
            "note": "first",
            "is_used": False,
            "used_at": None,
            "created_by": team["launcher"].pk,
            "created_at": body["latest_version"]["created_at"],
        },
        "created_by": team["launcher"].pk,
        "created_at": body["created_at"],
    }


def test_a_viewer_may_read_but_not_create_or_edit(team, rule):
    client = api_client_for(team["viewer"])
    assert client.get(f"/api/v1/reward-rules/{rule.pk}").json()["name"] == "exact answer"
    response = create(client, team["project"], name="mine")
    assert response.status_code == 403
    assert error_of(response)["code"] == "forbidden"
    response = client.patch(f"/api/v1/reward-rules/{rule.pk}", {"spec": LOOSE}, format="json")
    assert response.status_code == 403
    assert RewardRule.objects.count() == 1 and RewardRuleVersion.objects.count() == 1


def test_an_outsider_sees_no_rule_of_the_project(team, rule):
    client = api_client_for(team["outsider"])
    for url in (
        f"/api/v1/reward-rules/{rule.pk}",
        f"/api/v1/reward-rules/{rule.pk}/versions",
        f"/api/v1/reward-rules/{rule.pk}/versions/1",
        f"/api/v1/reward-rules/{rule.pk}/versions/1/openai",
        f"/api/v1/reward-rules/{rule.pk}/diff",
    ):
        response = client.get(url)
        assert response.status_code == 404, url
        assert error_of(response)["code"] == "not_found"
    assert client.get("/api/v1/reward-rules").json()["results"] == []
    response = create(client, team["project"], name="theirs")
    assert response.status_code == 404
    assert client.post(f"/api/v1/reward-rules/{rule.pk}/dry-run", {}, format="json").status_code == 404
    assert client.delete(f"/api/v1/reward-rules/{rule.pk}").status_code == 404
    assert RewardRule.objects.count() == 1


def test_rules_are_listed_newest_first_and_filtered_by_project(team, rule):
    client = api_client_for(team["owner"])
    create(client, team["project"], name="second")
    project_services.member_add(project=team["other_project"], username="owner", role="viewer")
    reward_services.reward_rule_create(
        project=team["other_project"], name="theirs", spec=EXACT, by=team["outsider"]
    )
    names = [r["name"] for r in client.get("/api/v1/reward-rules").json()["results"]]
    assert names == ["theirs", "second", "exact answer"]
    only = client.get(f"/api/v1/reward-rules?project={team['project'].pk}").json()["results"]
    assert [r["name"] for r in only] == ["second", "exact answer"]


def test_an_invalid_spec_answers_400_naming_each_place_and_saves_nothing(team):
    spec = {"type": "multi", "graders": {"a": EXACT, "b": {"type": "nonsense"}}, "calculate_output": "a + c"}
    response = create(api_client_for(team["owner"]), team["project"], spec=spec)
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "invalid_request"
    expected = [
        {"param": reward_services.spec_param(p.path), "message": p.message}
        for p in reward_services.spec_problems(spec)
    ]
    assert error["details"] == expected
    assert {d["param"] for d in expected} >= {"spec.graders.b.type", "spec.calculate_output"}
    assert not RewardRule.objects.exists() and not RewardRuleVersion.objects.exists()


def test_a_spec_that_is_not_an_object_is_refused(team):
    response = create(api_client_for(team["owner"]), team["project"], spec=["string_check"])
    assert response.status_code == 400
    assert error_of(response)["details"] == [
        {"param": "spec", "message": "a rule is a JSON object with a type"}
    ]


def test_patching_a_new_spec_creates_a_version_and_an_identical_one_does_not(team, rule):
    client = api_client_for(team["launcher"])
    url = f"/api/v1/reward-rules/{rule.pk}"
    changed = client.patch(url, {"spec": LOOSE, "note": "ilike"}, format="json")
    assert changed.status_code == 200
    body = changed.json()
    assert body["version_created"] is True
    assert (body["version_count"], body["latest_version"]["number"], body["latest_version"]["spec"]) == (
        2,
        2,
        LOOSE,
    )
    same = client.patch(url, {"spec": LOOSE}, format="json").json()
    assert same["version_created"] is False and same["latest_version"]["number"] == 2
    renamed = client.patch(url, {"name": "loose answer"}, format="json").json()
    assert renamed["name"] == "loose answer" and renamed["version_created"] is False
    assert RewardRuleVersion.objects.get(rule=rule, number=1).spec == EXACT


def test_an_invalid_patch_changes_nothing(team, rule):
    client = api_client_for(team["owner"])
    response = client.patch(
        f"/api/v1/reward-rules/{rule.pk}", {"name": "renamed", "spec": {"type": "nonsense"}}, format="json"
    )
    assert response.status_code == 400
    assert error_of(response)["param"] == "spec.type"
    rule.refresh_from_db()
    assert rule.name == "exact answer" and rule.versions.count() == 1


def test_deleting_a_used_rule_answers_409_and_keeps_it(team, rule):
    reward_services.reward_rule_version_mark_used(version=rule.versions.get())
    response = api_client_for(team["owner"]).delete(f"/api/v1/reward-rules/{rule.pk}")
    assert response.status_code == 409
    assert error_of(response)["code"] == "conflict"
    assert RewardRule.objects.filter(pk=rule.pk).exists()


def test_an_idempotency_key_replays_the_creation(team):
    client = api_client_for(team["owner"])
    client.credentials(
        HTTP_AUTHORIZATION=client._credentials["HTTP_AUTHORIZATION"], HTTP_IDEMPOTENCY_KEY="k1"
    )
    first = create(client, team["project"])
    again = create(client, team["project"])
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert RewardRule.objects.count() == 1


# --- versions and diffs --------------------------------------------------------------------


def test_versions_are_listed_newest_first_and_fetched_by_number(team, rule):
    reward_services.reward_rule_update(rule=rule, by=team["owner"], spec=LOOSE, note="ilike")
    client = api_client_for(team["viewer"])
    listed = client.get(f"/api/v1/reward-rules/{rule.pk}/versions").json()
    assert [(v["number"], v["note"]) for v in listed["results"]] == [(2, "ilike"), (1, "created")]
    assert client.get(f"/api/v1/reward-rules/{rule.pk}/versions/1").json()["spec"] == EXACT
    missing = client.get(f"/api/v1/reward-rules/{rule.pk}/versions/9")
    assert missing.status_code == 404
    assert error_of(missing)["message"] == "exact answer has no version 9"


def test_the_diff_compares_the_latest_with_the_one_before_by_default(team, rule):
    reward_services.reward_rule_update(rule=rule, by=team["owner"], spec=LOOSE)
    client = api_client_for(team["viewer"])
    body = client.get(f"/api/v1/reward-rules/{rule.pk}/diff").json()
    assert (body["rule"], body["from"], body["to"]) == (rule.pk, 1, 2)
    assert body["diff"] == (
        "--- exact answer v1\n"
        "+++ exact answer v2\n"
        "@@ -1,7 +1,7 @@\n"
        " {\n"
        '   "input": "{{sample.output_text}}",\n'
        '   "name": "exact",\n'
        '-  "operation": "eq",\n'
        '+  "operation": "ilike",\n'
        '   "reference": "{{item.reference}}",\n'
        '   "type": "string_check"\n'
        " }\n"
    )
    assert [line["kind"] for line in body["lines"]][:3] == ["header", "header", "hunk"]
    assert body["lines"][6] == {"kind": "removed", "text": '-  "operation": "eq",'}
    backwards = client.get(f"/api/v1/reward-rules/{rule.pk}/diff?from=2&to=1").json()
    assert backwards["diff"].splitlines()[6:8] == ['-  "operation": "ilike",', '+  "operation": "eq",']
    same = client.get(f"/api/v1/reward-rules/{rule.pk}/diff?from=1&to=1").json()
    assert same["diff"] == "" and same["lines"] == []
    bad = client.get(f"/api/v1/reward-rules/{rule.pk}/diff?from=x")
    assert bad.status_code == 400 and error_of(bad)["param"] == "from"


# --- validation ----------------------------------------------------------------------------


def test_validate_reports_the_problems_of_a_spec_without_saving_it(team):
    client = api_client_for(team["outsider"])  # any signed-in user may check a spec
    assert client.post("/api/v1/reward-rules/validate", {"spec": EXACT}, format="json").json() == {
        "valid": True,
        "problems": [],
    }
    body = client.post("/api/v1/reward-rules/validate", {"spec": {"type": "nonsense"}}, format="json").json()
    assert body["valid"] is False
    assert [p["path"] for p in body["problems"]] == ["type"]
    assert (
        APIClient().post("/api/v1/reward-rules/validate", {"spec": EXACT}, format="json").status_code == 401
    )
    assert not RewardRule.objects.exists()


def test_validate_accepts_the_browser_session_with_its_csrf_token(team):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(team["viewer"])
    refused = client.post("/api/v1/reward-rules/validate", {"spec": EXACT}, format="json")
    assert refused.status_code == 403
    client.get("/accounts/login/")  # sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    response = client.post(
        "/api/v1/reward-rules/validate", {"spec": EXACT}, format="json", HTTP_X_CSRFTOKEN=token
    )
    assert response.status_code == 200 and response.json()["valid"] is True


# --- dry-run -------------------------------------------------------------------------------


def expected_result(spec: dict, item: dict, sample: dict) -> dict:
    from rewards import engine

    return engine.score(spec, item, engine.Sample.from_dict(sample)).to_dict()


def test_a_dry_run_returns_the_engines_exact_results(team, rule):
    samples = ["2", {"output_text": "paris", "item_id": "q2"}, {"output_text": "Paris", "item_id": "q2"}]
    response = api_client_for(team["launcher"]).post(
        f"/api/v1/reward-rules/{rule.pk}/dry-run", {"items": ITEMS, "samples": samples}, format="json"
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["rule"], body["version"]) == (rule.pk, 1)
    pairs = [
        (ITEMS[0], {"output_text": "2"}),
        (ITEMS[1], {"output_text": "paris"}),
        (ITEMS[1], {"output_text": "Paris"}),
    ]
    assert [r["item_id"] for r in body["results"]] == ["q1", "q2", "q2"]
    assert [r["result"] for r in body["results"]] == [expected_result(EXACT, i, s) for i, s in pairs]
    assert [r["result"]["total"] for r in body["results"]] == [1.0, 0.0, 1.0]
    assert body["summary"] | {"component_means": None} == {
        "count": 3,
        "scored": 3,
        "errored": 0,
        "flagged": 0,
        "mean_total": 2 / 3,
        "min_total": 0.0,
        "max_total": 1.0,
        "component_means": None,
    }


def test_a_dry_run_scores_an_older_version_when_asked(team, rule):
    reward_services.reward_rule_update(rule=rule, by=team["owner"], spec=LOOSE)
    client = api_client_for(team["owner"])
    url = f"/api/v1/reward-rules/{rule.pk}/dry-run"
    latest = client.post(url, {"items": ITEMS[1:], "samples": ["paris"]}, format="json").json()
    first = client.post(url, {"version": 1, "items": ITEMS[1:], "samples": ["paris"]}, format="json").json()
    assert (latest["version"], latest["results"][0]["result"]["total"]) == (2, 1.0)
    assert (first["version"], first["results"][0]["result"]["total"]) == (1, 0.0)


def test_a_dry_run_picks_items_from_a_task_set_version(team, rule):
    task_set = project_services.task_set_create(project=team["project"], name="arith", by=team["owner"])
    report = project_services.task_set_import(
        task_set=task_set,
        stream=[(json.dumps(item) + "\n").encode() for item in ITEMS],
        file_format="jsonl",
        by=team["owner"],
    )
    body = api_client_for(team["owner"]).post(
        f"/api/v1/reward-rules/{rule.pk}/dry-run",
        {"task_set_version": report.version.pk, "item_ids": ["q2"], "samples": ["Paris", "Lyon"]},
        format="json",
    )
    assert body.status_code == 400
    assert error_of(body)["details"] == [
        {
            "param": "samples[1]",
            "message": "there are 1 items: give this sample an `item_id` to pair it with one",
        }
    ]
    ok = api_client_for(team["owner"]).post(
        f"/api/v1/reward-rules/{rule.pk}/dry-run",
        {"task_set_version": report.version.pk, "item_ids": ["q2"], "samples": ["Paris"]},
        format="json",
    )
    assert [(r["item_id"], r["result"]["total"]) for r in ok.json()["results"]] == [("q2", 1.0)]
    unknown = api_client_for(team["owner"]).post(
        f"/api/v1/reward-rules/{rule.pk}/dry-run",
        {"task_set_version": report.version.pk, "item_ids": ["nope"], "samples": ["Paris"]},
        format="json",
    )
    assert unknown.status_code == 400 and error_of(unknown)["param"] == "item_ids"


def test_a_dry_run_names_the_sample_it_cannot_pair_or_read(team, rule):
    client = api_client_for(team["owner"])
    url = f"/api/v1/reward-rules/{rule.pk}/dry-run"
    response = client.post(
        url, {"items": ITEMS, "samples": ["2", {"output_text": "x", "item_id": "q9"}]}, format="json"
    )
    assert response.status_code == 400
    assert error_of(response)["details"] == [
        {"param": "samples[1].item_id", "message": "no item has the id 'q9'"}
    ]
    typo = client.post(url, {"items": ITEMS, "samples": [{"output": "2"}]}, format="json")
    assert typo.status_code == 400 and error_of(typo)["param"] == "samples[0]"
    neither = client.post(url, {"samples": ["2"]}, format="json")
    assert neither.status_code == 400 and error_of(neither)["param"] == "items"


def test_a_dry_run_needs_the_edit_permission(team, rule):
    body = {"items": ITEMS, "samples": ["2"]}
    for role in ("viewer", "reviewer"):
        response = api_client_for(team[role]).post(
            f"/api/v1/reward-rules/{rule.pk}/dry-run", body, format="json"
        )
        assert response.status_code == 403, role


# --- OpenAI grader JSON --------------------------------------------------------------------

OPENAI_MULTI = {
    "type": "multi",
    "graders": {
        "exact": {
            "type": "string_check",
            "name": "exact",
            "input": "{{sample.output_text}}",
            "reference": "{{item.reference}}",
            "operation": "eq",
        },
        "close": {
            "type": "text_similarity",
            "name": "close",
            "input": "{{sample.output_text}}",
            "reference": "{{item.reference}}",
            "evaluation_metric": "fuzzy_match",
        },
    },
    "calculate_output": "0.5 * exact + 0.5 * close",
}


def test_openai_grader_json_imports_and_exports_unchanged(team):
    client = api_client_for(team["owner"])
    body = {"project": team["project"].pk, "name": "from rft", "grader": OPENAI_MULTI}
    response = client.post("/api/v1/reward-rules/import-openai", body, format="json")
    assert response.status_code == 201, response.json()
    rule = response.json()
    assert rule["latest_version"]["note"] == "imported from OpenAI"
    exported = client.get(f"/api/v1/reward-rules/{rule['id']}/versions/1/openai")
    assert exported.status_code == 200
    assert exported.json() == OPENAI_MULTI


def test_a_bad_openai_grader_is_refused_naming_the_place(team):
    body = {"project": team["project"].pk, "name": "bad", "grader": {"type": "nonsense"}}
    response = api_client_for(team["owner"]).post("/api/v1/reward-rules/import-openai", body, format="json")
    assert response.status_code == 400
    assert error_of(response)["param"] == "grader.type"
    assert error_of(response)["message"].startswith("grader.type: nonsense graders are not a grader type")
    flywheel_only = dict(
        body, grader={"type": "multi", "graders": {"t": {"type": "unit_tests"}}, "calculate_output": "t"}
    )
    response = api_client_for(team["owner"]).post(
        "/api/v1/reward-rules/import-openai", flywheel_only, format="json"
    )
    assert response.status_code == 400 and error_of(response)["param"] == "grader.graders.t.type"
    assert not RewardRule.objects.exists()


def test_a_flywheel_only_rule_has_no_openai_form(team):
    spec = {"type": "numeric", "input": "{{sample.output_text}}", "reference": "{{item.reference}}"}
    rule = reward_services.reward_rule_create(
        project=team["project"], name="num", spec=spec, by=team["owner"]
    )
    response = api_client_for(team["viewer"]).get(f"/api/v1/reward-rules/{rule.pk}/versions/1/openai")
    assert response.status_code == 409
    assert error_of(response)["message"].startswith(
        "version 1 has no OpenAI form: type: numeric graders are Flywheel's own"
    )


def test_importing_needs_the_edit_permission(team):
    body = {"project": team["project"].pk, "name": "x", "grader": EXACT}
    response = api_client_for(team["reviewer"]).post(
        "/api/v1/reward-rules/import-openai", body, format="json"
    )
    assert response.status_code == 403


# --- the schema ----------------------------------------------------------------------------


@pytest.fixture
def schema(team) -> dict:
    response = api_client_for(team["viewer"]).get("/api/v1/schema/", {"format": "json"})
    assert response.status_code == 200
    return json.loads(response.content)


def test_reward_rule_answers_match_their_declared_shapes(team, rule, schema):
    client = api_client_for(team["owner"])
    reward_services.reward_rule_update(rule=rule, by=team["owner"], spec=LOOSE)
    base = "/api/v1/reward-rules"
    calls = [
        ("get", base, "/api/v1/reward-rules", None),
        ("post", base, "/api/v1/reward-rules", {"project": team["project"].pk, "name": "n2", "spec": EXACT}),
        ("post", base, "/api/v1/reward-rules", {"project": team["project"].pk, "name": "n3", "spec": {}}),
        ("get", f"{base}/{rule.pk}", "/api/v1/reward-rules/{id}", None),
        ("patch", f"{base}/{rule.pk}", "/api/v1/reward-rules/{id}", {"spec": EXACT}),
        ("get", f"{base}/{rule.pk}/versions", "/api/v1/reward-rules/{id}/versions", None),
        ("get", f"{base}/{rule.pk}/versions/1", "/api/v1/reward-rules/{id}/versions/{number}", None),
        ("get", f"{base}/{rule.pk}/versions/9", "/api/v1/reward-rules/{id}/versions/{number}", None),
        (
            "get",
            f"{base}/{rule.pk}/versions/1/openai",
            "/api/v1/reward-rules/{id}/versions/{number}/openai",
            None,
        ),
        ("get", f"{base}/{rule.pk}/diff", "/api/v1/reward-rules/{id}/diff", None),
        ("post", f"{base}/validate", "/api/v1/reward-rules/validate", {"spec": {"type": "nonsense"}}),
        (
            "post",
            f"{base}/{rule.pk}/dry-run",
            "/api/v1/reward-rules/{id}/dry-run",
            {"items": ITEMS, "samples": ["2"]},
        ),
        (
            "post",
            f"{base}/import-openai",
            "/api/v1/reward-rules/import-openai",
            {"project": team["project"].pk, "name": "oa", "grader": EXACT},
        ),
    ]
    for method, url, path_, body in calls:
        response = getattr(client, method)(url, body, format="json")
        assert response.status_code < 500, url
        assert_matches_schema(schema, response, method, path_)

"""Reward rule pages: what each role sees and may do, forms that refuse bad rules next to the
place, versions and diffs, dry-runs, OpenAI import; model output and names are always escaped."""

import json
import os
from pathlib import Path

import pytest
from django.urls import reverse

from projects import services as project_services
from rewards import services as reward_services
from rewards.models import RewardRule, RewardRuleVersion
from tests.conftest import make_project, make_user

EXACT = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.reference}}",
    "operation": "eq",
}
LOOSE = EXACT | {"operation": "ilike"}
XSS = "<script>alert(1)</script>"
CHROMIUM = "/usr/bin/chromium"
ITEM = {"id": "q1", "kind": "answer", "prompt": "What is 1 + 1?", "reference": "2"}


def page(client, user, url, **kwargs):
    client.force_login(user)
    return client.get(url, **kwargs)


def text(response) -> str:
    return response.content.decode()


@pytest.fixture
def rule(team) -> RewardRule:
    return reward_services.reward_rule_create(
        project=team["project"], name="exact answer", spec=EXACT, by=team["owner"], description="math"
    )


def form_body(spec, **extra) -> dict:
    return {"name": "exact answer", "description": "", "note": "", "spec": json.dumps(spec), **extra}


# --- list and detail -----------------------------------------------------------------------


def test_the_list_shows_the_rules_and_edit_buttons_only_to_editors(client, team, rule):
    viewer = text(page(client, team["viewer"], reverse("reward-rule-list", args=[team["project"].pk])))
    assert "exact answer" in viewer and "v1" in viewer
    assert "New reward rule" not in viewer and "Import OpenAI grader" not in viewer
    launcher = text(page(client, team["launcher"], reverse("reward-rule-list", args=[team["project"].pk])))
    assert "New reward rule" in launcher and "Import OpenAI grader" in launcher


def test_an_outsider_gets_404_and_an_anonymous_visitor_the_sign_in_page(client, team, rule):
    for url in (
        reverse("reward-rule-list", args=[team["project"].pk]),
        reverse("reward-rule-detail", args=[rule.pk]),
        reverse("reward-rule-version", args=[rule.pk, 1]),
        reverse("reward-rule-diff", args=[rule.pk]),
    ):
        assert page(client, team["outsider"], url).status_code == 404, url
    client.logout()
    response = client.get(reverse("reward-rule-detail", args=[rule.pk]))
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_the_detail_page_shows_the_latest_spec_and_every_version(client, team, rule):
    reward_services.reward_rule_update(rule=rule, by=team["owner"], spec=LOOSE, note="ilike")
    reward_services.reward_rule_version_mark_used(version=rule.versions.get(number=1))
    body = text(page(client, team["viewer"], reverse("reward-rule-detail", args=[rule.pk])))
    assert "&quot;operation&quot;: &quot;ilike&quot;" in body
    assert "ilike" in body and "used" in body
    assert reverse("reward-rule-diff", args=[rule.pk]) in body
    assert "Delete reward rule" not in body  # a viewer; and a used rule is kept anyway


# --- create and edit -----------------------------------------------------------------------


def test_a_launcher_creates_a_rule_through_the_form(client, team):
    client.force_login(team["launcher"])
    url = reverse("reward-rule-create", args=[team["project"].pk])
    form = client.get(url)
    assert form.status_code == 200
    assert 'id="grader-types"' in text(form) and 'data-validate-url="/api/v1/reward-rules/validate"' in text(
        form
    )
    response = client.post(url, form_body(EXACT, description="math"))
    rule = RewardRule.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse(
        "reward-rule-detail", args=[rule.pk]
    )
    assert rule.versions.get().spec == EXACT and rule.description == "math"


def test_the_editor_lists_every_registered_grader_type(client, team):
    from rewards.graders import grader_types

    response = page(client, team["owner"], reverse("reward-rule-create", args=[team["project"].pk]))
    types = {kind["type"] for kind in response.context["grader_types"]}
    assert types == set(grader_types()) and {"string_check", "unit_tests", "multi"} <= types
    string_check = next(kind for kind in response.context["grader_types"] if kind["type"] == "string_check")
    assert [(f["name"], f["kind"]) for f in string_check["fields"]] == [
        ("input", "template"),
        ("reference", "template"),
        ("operation", "select"),
    ]


def test_a_viewer_may_not_open_the_editor(client, team, rule):
    assert (
        page(client, team["viewer"], reverse("reward-rule-create", args=[team["project"].pk])).status_code
        == 403
    )
    assert page(client, team["reviewer"], reverse("reward-rule-edit", args=[rule.pk])).status_code == 403


def test_an_invalid_rule_is_refused_next_to_its_place_and_nothing_is_saved(client, team):
    client.force_login(team["owner"])
    spec = {"type": "multi", "graders": {"a": EXACT}, "calculate_output": "a + missing"}
    response = client.post(reverse("reward-rule-create", args=[team["project"].pk]), form_body(spec))
    assert response.status_code == 200
    problems = response.context["problems"]
    assert [p["path"] for p in problems] == ["calculate_output"]
    assert f"calculate_output: {problems[0]['message']}" in response.context["form"].errors["spec"]
    assert not RewardRule.objects.exists()


def test_json_that_does_not_parse_is_refused_with_its_line(client, team):
    client.force_login(team["owner"])
    response = client.post(
        reverse("reward-rule-create", args=[team["project"].pk]), form_body(None) | {"spec": '{\n  "type": }'}
    )
    assert response.context["form"].errors["spec"] == [
        "the rule is not valid JSON: line 2, column 11: Expecting value"
    ]
    assert not RewardRule.objects.exists()


def test_editing_creates_a_new_version_and_an_identical_save_does_not(client, team, rule):
    client.force_login(team["launcher"])
    url = reverse("reward-rule-edit", args=[rule.pk])
    assert json.loads(client.get(url).context["form"].initial["spec"]) == EXACT
    client.post(url, form_body(LOOSE, note="ilike"))
    assert list(rule.versions.values_list("number", "note")) == [(2, "ilike"), (1, "created")]
    response = client.post(url, form_body(LOOSE), follow=True)
    assert "identical to version 2; no new version" in text(response)
    assert rule.versions.count() == 2


# --- versions, diff ------------------------------------------------------------------------


def test_the_diff_page_colours_added_and_removed_lines(client, team, rule):
    reward_services.reward_rule_update(rule=rule, by=team["owner"], spec=LOOSE)
    body = text(page(client, team["viewer"], reverse("reward-rule-diff", args=[rule.pk]) + "?from=1&to=2"))
    assert '<span class="diff-line diff-removed">-  &quot;operation&quot;: &quot;eq&quot;,</span>' in body
    assert '<span class="diff-line diff-added">+  &quot;operation&quot;: &quot;ilike&quot;,</span>' in body
    assert '<span class="diff-line diff-header">--- exact answer v1</span>' in body


def test_a_version_page_shows_its_spec_and_whether_it_was_used(client, team, rule):
    reward_services.reward_rule_version_mark_used(version=rule.versions.get())
    body = text(page(client, team["viewer"], reverse("reward-rule-version", args=[rule.pk, 1])))
    assert "used by a run" in body and "&quot;operation&quot;: &quot;eq&quot;" in body
    assert page(client, team["viewer"], reverse("reward-rule-version", args=[rule.pk, 2])).status_code == 404


# --- escaping ------------------------------------------------------------------------------


def test_names_descriptions_and_specs_are_escaped_everywhere(client, team):
    spec = EXACT | {"name": XSS, "reference": XSS}
    rule = reward_services.reward_rule_create(
        project=team["project"], name=XSS, spec=spec, by=team["owner"], description=XSS
    )
    reward_services.reward_rule_update(rule=rule, by=team["owner"], spec=spec | {"operation": "ne"}, note=XSS)
    client.force_login(team["owner"])
    for url in (
        reverse("reward-rule-list", args=[team["project"].pk]),
        reverse("reward-rule-detail", args=[rule.pk]),
        reverse("reward-rule-edit", args=[rule.pk]),
        reverse("reward-rule-version", args=[rule.pk, 2]),
        reverse("reward-rule-diff", args=[rule.pk]),
        reverse("reward-rule-dry-run", args=[rule.pk]),
    ):
        body = text(client.get(url))
        assert XSS not in body, url
        assert "&lt;script&gt;" in body or "\\u003Cscript\\u003E" in body, url


def test_dry_run_output_is_escaped(client, team, rule):
    client.force_login(team["owner"])
    response = client.post(
        reverse("reward-rule-dry-run", args=[rule.pk]),
        {"version": "1", "source": "paste", "items": json.dumps(ITEM), "samples": json.dumps([XSS])},
    )
    body = text(response)
    assert XSS not in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body


# --- dry-run -------------------------------------------------------------------------------


def test_the_dry_run_page_shows_each_total(client, team, rule):
    client.force_login(team["launcher"])
    items = "\n".join(json.dumps(ITEM | {"id": f"q{i}"}) for i in (1, 2))
    samples = "\n".join(json.dumps(s) for s in ["2", {"output_text": "3", "item_id": "q2"}])
    response = client.post(
        reverse("reward-rule-dry-run", args=[rule.pk]),
        {"version": "1", "source": "paste", "items": items, "samples": samples},
    )
    assert response.status_code == 200
    rows = response.context["rows"]
    assert [(row["item_id"], row["total"], row["errored"]) for row in rows] == [
        ("q1", 1.0, False),
        ("q2", 0.0, False),
    ]
    assert response.context["result"].summary.mean_total == 0.5
    assert 'id="dry-run-results"' in text(response)


def test_the_dry_run_page_picks_items_from_a_task_set(client, team, rule):
    task_set = project_services.task_set_create(project=team["project"], name="arith", by=team["owner"])
    version = project_services.task_set_import(
        task_set=task_set, stream=[(json.dumps(ITEM) + "\n").encode()], file_format="jsonl", by=team["owner"]
    ).version
    client.force_login(team["owner"])
    response = client.post(
        reverse("reward-rule-dry-run", args=[rule.pk]),
        {
            "version": "1",
            "source": "task_set",
            "task_set_version": str(version.pk),
            "item_ids": "q1",
            "samples": '"2"',
        },
    )
    assert [(row["item_id"], row["total"]) for row in response.context["rows"]] == [("q1", 1.0)]


def test_the_dry_run_page_reports_bad_input_without_scoring(client, team, rule):
    client.force_login(team["owner"])
    response = client.post(
        reverse("reward-rule-dry-run", args=[rule.pk]),
        {"version": "1", "source": "paste", "items": json.dumps(ITEM), "samples": '"2"\n{oops'},
    )
    assert response.context["result"] is None
    assert response.context["form"].errors["samples"] == [
        "samples, line 2: not valid JSON: Expecting property name enclosed in double quotes"
    ]


def test_a_reviewer_may_not_dry_run(client, team, rule):
    assert page(client, team["reviewer"], reverse("reward-rule-dry-run", args=[rule.pk])).status_code == 403


# --- import and delete ---------------------------------------------------------------------


def test_an_openai_grader_is_imported_from_the_page(client, team):
    client.force_login(team["owner"])
    response = client.post(
        reverse("reward-rule-import", args=[team["project"].pk]),
        {"name": "rft", "description": "", "grader": json.dumps(EXACT)},
    )
    rule = RewardRule.objects.get()
    assert response.status_code == 302 and rule.versions.get().note == "imported from OpenAI"
    refused = client.post(
        reverse("reward-rule-import", args=[team["project"].pk]),
        {"name": "bad", "description": "", "grader": json.dumps({"type": "nonsense"})},
    )
    assert refused.status_code == 200 and refused.context["form"].errors["grader"]
    assert RewardRule.objects.count() == 1


def test_a_used_rule_is_not_deleted_from_the_page(client, team, rule):
    reward_services.reward_rule_version_mark_used(version=rule.versions.get())
    client.force_login(team["owner"])
    response = client.post(reverse("reward-rule-delete", args=[rule.pk]), follow=True)
    assert "was used by a run" in text(response)
    assert RewardRuleVersion.objects.filter(rule=rule).exists()
    unused = reward_services.reward_rule_create(
        project=team["project"], name="scratch", spec=EXACT, by=team["owner"]
    )
    response = client.post(reverse("reward-rule-delete", args=[unused.pk]))
    assert response["Location"] == reverse("reward-rule-list", args=[team["project"].pk])
    assert not RewardRule.objects.filter(pk=unused.pk).exists()


# --- the editor in a real browser ----------------------------------------------------------


@pytest.mark.browser
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing")
def test_the_form_editor_and_the_json_view_stay_in_sync_and_validate_as_you_type(
    live_server, transactional_db
):
    from playwright.sync_api import sync_playwright

    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # the ORM below runs beside Playwright's loop
    owner = make_user("editor")
    project = make_project(owner)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox"])
        page_ = browser.new_page(viewport={"width": 1400, "height": 1000})
        page_.set_default_timeout(10_000)
        page_.goto(live_server.url + "/accounts/login/")
        page_.fill("input[name=username]", "editor")
        page_.fill("input[name=password]", "pw-123456")
        page_.click("button[type=submit]")
        page_.wait_for_url(lambda url: "/accounts/login/" not in url)  # signed in: the session cookie is set
        page_.goto(live_server.url + reverse("reward-rule-create", args=[project.pk]))
        page_.wait_for_selector("#spec-status[data-state=valid]")
        # form -> JSON: make the rule a multi of unit tests and steps, with a formula
        page_.select_option("#spec-editor select >> nth=0", "multi")
        for key, kind in (("tests", "unit_tests"), ("steps", "steps")):
            page_.fill(".add-grader input", key)
            page_.select_option(".add-grader select", kind)
            page_.click(".add-grader button")
        page_.fill("[data-path='calculate_output'] input", "2.0 * tests - 0.01 * nope")
        page_.wait_for_selector("#spec-problems li:has-text('nope')")
        assert "nope" in page_.locator("[data-path='calculate_output'] .field-problem").inner_text()
        page_.fill("[data-path='calculate_output'] input", "2.0 * tests - 0.01 * steps")
        page_.wait_for_selector("#spec-status[data-state=valid]")
        spec = json.loads(page_.input_value("textarea[name=spec]"))
        assert spec["calculate_output"] == "2.0 * tests - 0.01 * steps"
        assert spec["graders"] == {
            "tests": {"type": "unit_tests", "name": "tests"},
            "steps": {"type": "steps", "name": "steps"},
        }
        # JSON -> form: a bad operation shows next to its field
        page_.fill("textarea[name=spec]", json.dumps(EXACT | {"operation": "nope"}))
        page_.wait_for_selector("[data-path='operation'] .field-problem")
        page_.fill("textarea[name=spec]", json.dumps(EXACT))
        page_.wait_for_selector("#spec-status[data-state=valid]")
        page_.fill("input[name=name]", "from the browser")
        page_.click("button[type=submit].btn-primary")
        page_.wait_for_url("**/reward-rules/*/")
        browser.close()
    assert RewardRule.objects.get().versions.get().spec == EXACT

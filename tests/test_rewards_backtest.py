"""Backtests: a past run's scored trajectories rescored with another rule version; both histograms
on shared bins, the trajectories that changed most, errored ones counted and never rescored, the
limit, new hacking flags; REST and the page, with their roles; text from the model is escaped."""

import json
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils import timezone

from projects import services as project_services
from rewards import services as reward_services
from rewards.models import RewardRule
from runs import backtest, services
from runs.models import Run, Trajectory, TrajectoryStep
from tests.conftest import api_client_for
from tests.test_api_schema import assert_matches_schema
from tiers import services as tier_services

EXACT = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.reference}}",
    "operation": "eq",
}
LOOSE_MINUS_STEPS = {
    "type": "multi",
    "graders": {"loose": EXACT | {"name": "loose", "operation": "ilike"}, "steps": {"type": "steps"}},
    "calculate_output": "loose - 0.25 * steps",
}
ITEMS = [
    {"id": "france", "prompt": "Capital of France?", "reference": "Paris"},
    {"id": "italy", "prompt": "Capital of Italy?", "reference": "Rome"},
    {
        "id": "square",
        "kind": "code",
        "prompt": "Write sq(x).",
        "tests": "from solution import sq\nassert sq(3) == 9\n",
        "entry_point": "sq",
    },
]
XSS = "<script>alert(1)</script>"
T0 = timezone.now() - timedelta(days=1)


@pytest.fixture
def world(team):
    """The team's project with a task set, a rule whose v1 scored a run and whose v2 is looser."""
    owner = team["owner"]
    task_set = project_services.task_set_create(project=team["project"], name="capitals", by=owner)
    lines = [(json.dumps(item) + "\n").encode() for item in ITEMS]
    version = project_services.task_set_import(
        task_set=task_set, stream=lines, file_format="jsonl", by=owner
    ).version
    rule = reward_services.reward_rule_create(project=team["project"], name="capital", spec=EXACT, by=owner)
    reward_services.reward_rule_update(rule=rule, by=owner, spec=LOOSE_MINUS_STEPS, note="looser")
    tier = tier_services.tier_create(project=team["project"], by=owner, name="cap", base_model="org/model")
    items = {item.external_id: item for item in version.items.all()}
    return team | {"rule": rule, "task_set_version": version, "tier": tier, "items": items}


def make_run(world, name="past", project=None, task_set_version=None) -> Run:
    return Run.objects.create(
        project=project or world["project"],
        name=name,
        task_set_version=task_set_version or world["task_set_version"],
        reward_rule_version=world["rule"].versions.get(number=1),
        tier=world["tier"],
        tier_config={"base_model": "org/model"},
        max_steps=5,
        status=Run.Status.SUCCEEDED,
    )


def make_trajectory(
    run, item, text, reward, *, minute, steps=0, outcome=Trajectory.Outcome.SCORED, flags=()
) -> Trajectory:
    trajectory = Trajectory.objects.create(
        run=run,
        item=item,
        policy_version=0,
        outcome=outcome,
        reward=reward,
        components={} if reward is None else {"exact": reward},
        flags=list(flags),
        completion_text=text,
        completion_tokens=len(text.split()),
        step_count=steps,
        created_at=T0 + timedelta(minutes=minute),
    )
    for index in range(steps):
        payload, size = TrajectoryStep.pack({"action": f"ls {index}", "valid": True})
        TrajectoryStep.objects.create(
            trajectory=trajectory, index=index, kind="command", payload=payload, raw_size=size
        )
    return trajectory


@pytest.fixture
def run(world):
    """Five scored trajectories (v1: exact match), one errored, one cancelled."""
    run = make_run(world)
    france, italy = world["items"]["france"], world["items"]["italy"]
    scored = [
        make_trajectory(run, france, "Paris", 1.0, minute=1),  # v2: 1.0, unchanged
        make_trajectory(run, france, "The capital is paris.", 0.0, minute=2),  # v2: 1.0
        make_trajectory(run, italy, "rome", 0.0, minute=3, steps=2),  # v2: 1 - 0.5
        make_trajectory(run, italy, "Rome", 1.0, minute=4, steps=4),  # v2: 1 - 1.0
        make_trajectory(run, italy, XSS, 0.0, minute=5, steps=1),  # v2: 0 - 0.25
    ]
    make_trajectory(run, france, "Paris", None, minute=6, outcome=Trajectory.Outcome.ERRORED)
    make_trajectory(run, france, "Paris", None, minute=7, outcome=Trajectory.Outcome.CANCELLED)
    run.scored = scored
    return run


def latest(world):
    return world["rule"].versions.get(number=2)


# --- the service ---------------------------------------------------------------------------


def test_a_backtest_compares_old_and_new_rewards_on_shared_bins(world, run):
    t = run.scored
    result = backtest.reward_rule_backtest(run=run, version=latest(world))
    assert (result.total, result.count, result.limit, result.limited) == (5, 5, 2000, False)
    assert result.old_version == world["rule"].versions.get(number=1)
    assert result.old_mean == pytest.approx(0.4)
    assert result.new_mean == pytest.approx(0.45)
    assert (result.old_scored, result.new_scored, result.errored, result.ungradeable) == (5, 5, 0, 0)
    assert result.histogram.edges == [-0.25, -0.125, 0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0]
    assert result.histogram.old == [0, 0, 3, 0, 0, 0, 0, 0, 0, 2]
    assert result.histogram.new == [1, 0, 1, 0, 0, 0, 1, 0, 0, 2]
    assert result.changed_count == 4
    assert [(row.trajectory, row.item_id, row.old, row.new, row.delta) for row in result.changed] == [
        (t[1].pk, "france", 0.0, 1.0, 1.0),
        (t[3].pk, "italy", 1.0, 0.0, -1.0),  # as large as the one above: the lower id first
        (t[2].pk, "italy", 0.0, 0.5, 0.5),
        (t[4].pk, "italy", 0.0, -0.25, -0.25),
    ]
    assert result.changed[2].old_components == {"exact": 0.0}
    assert result.changed[2].new_components == {"loose": 1.0, "steps": 2.0}
    assert result.changed[3].completion == XSS


def test_errored_and_cancelled_trajectories_are_counted_and_never_rescored(world, run):
    result = backtest.reward_rule_backtest(run=run, version=latest(world))
    assert (result.skipped_errored, result.skipped_cancelled) == (1, 1)
    assert sum(result.histogram.old) == sum(result.histogram.new) == 5  # "Paris" would have scored 1.0
    errored = run.trajectories.get(outcome=Trajectory.Outcome.ERRORED)
    assert errored.pk not in [row.trajectory for row in result.changed]


def test_a_backtest_stores_nothing(world, run):
    before = list(run.trajectories.order_by("pk").values_list("reward", "components", "flags"))
    backtest.reward_rule_backtest(run=run, version=latest(world))
    assert list(run.trajectories.order_by("pk").values_list("reward", "components", "flags")) == before


def test_a_long_run_is_bounded_to_its_newest_trajectories(world, run):
    result = backtest.reward_rule_backtest(run=run, version=latest(world), limit=2)
    assert (result.total, result.count, result.limit, result.limited) == (5, 2, 2, True)
    assert [row.trajectory for row in result.changed] == [run.scored[3].pk, run.scored[4].pk]
    assert result.old_mean == pytest.approx(0.5)
    assert result.new_mean == pytest.approx(-0.125)


def test_the_same_version_changes_nothing(world, run):
    result = backtest.reward_rule_backtest(run=run, version=world["rule"].versions.get(number=1))
    assert (result.changed_count, result.changed) == (0, [])
    assert result.histogram.old == result.histogram.new == [3, 0, 0, 0, 0, 0, 0, 0, 0, 2]
    assert result.old_mean == result.new_mean == pytest.approx(0.4)


def test_new_hacking_flags_and_ungradeable_trajectories_are_reported(world):
    run = make_run(world)
    square = world["items"]["square"]
    make_trajectory(run, square, "import sys\nsys.exit(0)\n", 1.0, minute=1)  # newly flagged
    make_trajectory(
        run,
        square,
        "import sys\nsys.exit(0)\n",
        1.0,
        minute=2,
        flags=[{"detector": "early_exit", "evidence": "sys.exit"}],  # recorded then: not new
    )
    make_trajectory(run, square, "def sq(x):\n    return x * x\n", 1.0, minute=3)
    result = backtest.reward_rule_backtest(run=run, version=latest(world))
    # A code item has no `reference`: the rule cannot judge it (no total), which is not an error.
    assert (result.count, result.new_scored, result.ungradeable, result.errored) == (3, 0, 3, 0)
    assert result.new_mean is None and result.changed == []
    assert result.histogram.old == [3] and result.histogram.new == [0]
    assert result.histogram.edges == [0.5, 1.5]  # one value: one bin one wide around it
    # the recorded flag and the honest solution add nothing
    assert (result.newly_flagged, result.new_flags) == (1, {"early_exit": 1})


def test_a_run_of_another_project_is_refused(world, run):
    other_set = project_services.task_set_create(
        project=world["other_project"], name="x", by=world["outsider"]
    )
    lines = [(json.dumps(ITEMS[0]) + "\n").encode()]
    other_version = project_services.task_set_import(
        task_set=other_set, stream=lines, file_format="jsonl", by=world["outsider"]
    ).version
    foreign = make_run(world, project=world["other_project"], task_set_version=other_version)
    with pytest.raises(ValidationError) as refused:
        backtest.reward_rule_backtest(run=foreign, version=latest(world))
    assert list(refused.value.message_dict) == ["run"]


def test_histogram_bins_span_both_sides():
    histogram = backtest.histogram([0.0, None, 2.0], [4.0], bins=4)
    assert (histogram.edges, histogram.old, histogram.new) == (
        [0.0, 1.0, 2.0, 3.0, 4.0],
        [1, 0, 1, 0],
        [0, 0, 0, 1],
    )
    assert backtest.histogram([None], [None]) == backtest.Histogram()


# --- REST ----------------------------------------------------------------------------------


def post_backtest(user, rule: RewardRule, body: dict):
    return api_client_for(user).post(f"/api/v1/reward-rules/{rule.pk}/backtest", body, format="json")


@pytest.fixture
def schema(db) -> dict:
    client = api_client_for(services.User.objects.create_user(username="schema-reader"))
    return json.loads(client.get("/api/v1/schema/", {"format": "json"}).content)


def test_a_launcher_backtests_with_the_latest_version_by_default(world, run, schema):
    response = post_backtest(world["launcher"], world["rule"], {"run": run.pk, "bins": 5})
    assert response.status_code == 200
    assert_matches_schema(schema, response, "post", "/api/v1/reward-rules/{id}/backtest")
    body = response.json()
    assert (body["run"], body["rule"], body["version"]) == (run.pk, world["rule"].pk, 2)
    assert body["old_version"] == {"rule": world["rule"].pk, "name": "capital", "version": 1}
    assert body["histogram"] == {
        "edges": [-0.25, 0.0, 0.25, 0.5, 0.75, 1.0],
        "old": [0, 3, 0, 0, 2],
        "new": [1, 1, 0, 1, 2],
    }
    assert (body["count"], body["skipped_errored"], body["changed_count"]) == (5, 1, 4)
    assert [row["delta"] for row in body["changed"]] == [1.0, -1.0, 0.5, -0.25]
    assert body["changed"][0]["new_components"] == {"loose": 1.0, "steps": 0.0}


def test_the_api_backtests_a_chosen_version_within_a_limit(world, run):
    body = post_backtest(world["owner"], world["rule"], {"run": run.pk, "version": 1, "limit": 3}).json()
    assert (body["version"], body["count"], body["limited"], body["changed"]) == (1, 3, True, [])


def test_the_api_refuses_a_run_of_another_project_naming_run(world, run):
    foreign_rule = reward_services.reward_rule_create(
        project=world["other_project"], name="theirs", spec=EXACT, by=world["outsider"]
    )
    response = post_backtest(world["outsider"], foreign_rule, {"run": run.pk})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "run"
    missing = post_backtest(world["launcher"], world["rule"], {"run": 10**8})
    assert (missing.status_code, missing.json()["error"]["param"]) == (400, "run")


def test_the_api_refuses_viewers_outsiders_and_unknown_versions(world, run):
    assert post_backtest(world["viewer"], world["rule"], {"run": run.pk}).status_code == 403
    assert post_backtest(world["reviewer"], world["rule"], {"run": run.pk}).status_code == 403
    assert post_backtest(world["outsider"], world["rule"], {"run": run.pk}).status_code == 404
    assert post_backtest(world["launcher"], world["rule"], {"run": run.pk, "version": 9}).status_code == 404
    too_many = post_backtest(world["launcher"], world["rule"], {"run": run.pk, "limit": 10**6})
    assert (too_many.status_code, too_many.json()["error"]["param"]) == (400, "limit")


# --- the page ------------------------------------------------------------------------------


def backtest_url(world) -> str:
    return reverse("reward-rule-backtest", args=[world["rule"].pk])


def test_the_page_shows_both_histograms_and_the_changed_trajectories_escaped(client, world, run):
    client.force_login(world["launcher"])
    form = client.get(backtest_url(world)).content.decode()
    assert f'<option value="{run.pk}"' in form and "5 scored" in form
    page = client.post(backtest_url(world), {"run": run.pk, "version": 2, "limit": ""})
    assert page.status_code == 200
    html = page.content.decode()
    assert html.count("<svg") == 2
    assert 'class="bar bar-old"' in html and 'class="bar bar-new"' in html
    old_counts = [2 if i == 9 else 3 if i == 2 else 0 for i in range(10)]
    new_counts = [1, 0, 1, 0, 0, 0, 1, 0, 0, 2]
    for side, counts in (("old", old_counts), ("new", new_counts)):
        chart = html.split(f'data-side="{side}"')[1].split("</svg>")[0]
        assert [int(part.split('"')[0]) for part in chart.split('data-count="')[1:]] == counts
    table = html.split('id="backtest-changed"')[1].split("</table>")[0]
    assert table.index(str(run.scored[1].pk)) < table.index(str(run.scored[4].pk))
    assert XSS not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in table
    assert "+1.0000" in table and "-0.2500" in table


def test_the_page_refuses_a_foreign_run_next_to_the_field(client, world, run):
    client.force_login(world["launcher"])
    page = client.post(backtest_url(world), {"run": 10**8, "version": 2})
    assert page.status_code == 200 and "<svg" not in page.content.decode()
    assert "Select a valid choice" in page.content.decode()


def test_the_page_is_for_editors_and_the_rule_page_links_to_it(client, world, run):
    detail = reverse("reward-rule-detail", args=[world["rule"].pk])
    client.force_login(world["viewer"])
    assert client.get(backtest_url(world)).status_code == 403
    assert backtest_url(world) not in client.get(detail).content.decode()
    client.force_login(world["outsider"])
    assert client.get(backtest_url(world)).status_code == 404
    client.force_login(world["launcher"])
    assert backtest_url(world) in client.get(detail).content.decode()


def test_a_project_without_runs_says_so(client, world):
    client.force_login(world["owner"])
    html = client.get(backtest_url(world)).content.decode()
    assert 'id="backtest-no-runs"' in html and 'id="backtest-form"' not in html

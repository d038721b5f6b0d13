"""The UI in headless Chromium (issue 15): each bug found by trying it as a new user would, fixed
under a test that failed before the fix, and the habits its users bring (runs table, chart
controls, keyboard review, first screen).

One browser for the module and one in-process live server (no websockets: the run page falls
back to polling its REST endpoints every 5 s, which is what these tests watch). Each test signs
in by setting a session cookie, not through the form (tests/test_browser.py covers sign-in).
"""

import os
import tempfile
from collections.abc import Iterator

import pytest
from django.test import Client
from playwright.sync_api import Browser, Page, expect, sync_playwright

from runs import lifecycle
from runs.models import Checkpoint, MetricPoint, Run, Trajectory, TrajectoryStep
from tests.conftest import make_project
from tests.test_browser import CHROMIUM
from tests.test_live_browser import build_run
from tiers.models import Tier, TierEvaluation

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # see tests/test_browser.py
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
S = Run.Status
expect.set_options(timeout=15_000)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
            ],
        )
        yield browser
        browser.close()


@pytest.fixture
def open_as(browser, live_server):
    """open_as(user, path, width=1400) -> a page signed in as `user`, at `path`."""
    contexts = []

    def opener(user, path: str, width: int = 1400, scheme: str = "light") -> Page:
        client = Client()
        client.force_login(user)
        context = browser.new_context(viewport={"width": width, "height": 900}, color_scheme=scheme)
        context.add_cookies(
            [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]
        )
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.goto(f"{live_server.url}{path}")
        return page

    yield opener
    for context in contexts:
        context.close()


@pytest.fixture
def owner(django_user_model):
    return django_user_model.objects.create_user(username="ada", password="pw-123456")


def metrics(run: Run, steps: range, **values) -> None:
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, name=name, step=step, value=value(step) if callable(value) else value)
        for step in steps
        for name, value in values.items()
    )


def step_record(trajectory: Trajectory, index: int, kind: str, data: dict) -> None:
    payload, size = TrajectoryStep.pack(data)
    TrajectoryStep.objects.create(
        trajectory=trajectory, index=index, kind=kind, payload=payload, raw_size=size
    )


def trajectory_of(run: Run, **fields) -> Trajectory:
    values = {"policy_version": 0, "outcome": "scored", "reward": 1.0, "completion_text": "4"} | fields
    item = run.task_set_version.items.order_by("position")[values.pop("index", 0)]
    return Trajectory.objects.create(run=run, item=item, **values)


# --- bug 1: the first chart fits its cell -------------------------------------------------------


def test_the_first_chart_fits_its_cell_once_a_second_chart_appears(owner, open_as):
    run = build_run(owner)
    metrics(run, range(1, 41), **{"reward/mean": lambda s: s / 40, "learner/kl": lambda s: s / 100})
    page = open_as(owner, f"/runs/{run.pk}/")
    expect(page.locator("#chart-reward")).to_have_attribute("data-points", "40")
    expect(page.locator("#chart-kl")).to_have_attribute("data-points", "40")
    cell = page.locator("#chart-reward")
    width = float(cell.locator(".main-svg").first.get_attribute("width"))
    assert abs(width - cell.evaluate("node => node.getBoundingClientRect().width")) <= 1


# --- bug 2: the run header follows the run --------------------------------------------------------


def test_the_run_header_follows_the_run_to_its_end(owner, open_as):
    run = build_run(owner)
    Run.objects.filter(pk=run.pk).update(status=S.RUNNING)
    page = open_as(owner, f"/runs/{run.pk}/")
    actions = page.locator("#run-actions button")
    expect(actions).to_have_text(["Pause", "Cancel", "Clone"])
    page.get_by_role("button", name="Pause").click()
    expect(page.locator(".message-success")).to_have_text("Run live is pausing.")
    expect(actions).to_have_text(["Cancel", "Clone"])

    lifecycle.run_transition(run, allowed=(S.PAUSING,), to=S.PAUSED)  # the learner stops
    expect(actions).to_have_text(["Resume", "Cancel", "Clone"])
    expect(page.locator("#run-status")).to_have_text("paused")
    expect(page.locator(".messages")).to_have_count(0)

    Run.objects.filter(pk=run.pk).update(status=S.RUNNING)
    for step in (1, 2):
        Checkpoint.objects.create(run=run, step=step, policy_version=step, path=f"c{step}")
    Run.objects.filter(pk=run.pk).update(sandbox_cpu_seconds=12.5, learner_step=2)
    lifecycle.run_transition(run, allowed=(S.RUNNING,), to=S.SUCCEEDED)
    expect(page.locator("#run-status")).to_have_text("succeeded")
    expect(actions).to_have_text(["Clone"])
    expect(page.locator("#sandbox-cpu-seconds")).to_have_text("12.5")
    expect(page.locator("#checkpoints tbody tr")).to_have_count(2)


def test_a_stale_button_says_what_the_run_is_now(owner, open_as):
    run = build_run(owner)
    page = open_as(owner, f"/runs/{run.pk}/")
    # The page cannot learn of the change (its re-fetches fail): its Pause button is stale.
    page.route("**/api/v1/runs/**", lambda route: route.abort())
    page.route(
        f"**/runs/{run.pk}/",
        lambda route: route.abort() if route.request.resource_type == "fetch" else route.continue_(),
    )
    page.reload()  # from the start, with no fetch of the page's own getting through
    Run.objects.filter(pk=run.pk).update(status=S.SUCCEEDED)
    page.get_by_role("button", name="Pause").click()
    expect(page.locator(".message-error")).to_have_text(
        "Not paused: run live is succeeded now (the page was stale)."
    )


# --- bug 3: tokens as text, coloured by log-probability ---------------------------------------------


def test_tokens_show_as_text_when_only_their_ids_were_recorded(owner, open_as):
    from workers.base_model import tokenizer_train

    run = build_run(owner)
    tokenizer = tokenizer_train(["def add(a, b):\n    return a + b\n"] * 20, vocab_size=300)
    model_dir = tempfile.mkdtemp()
    tokenizer.save_pretrained(model_dir)
    Run.objects.filter(pk=run.pk).update(tier_config=run.tier_config | {"base_model": model_dir})
    ids = tokenizer.encode("return a + b")
    trajectory = trajectory_of(run)
    step_record(
        trajectory,
        0,
        "completion",
        {"prompt": "add", "completion": "return a + b", "token_ids": ids, "logprobs": [-0.1] * len(ids)},
    )
    page = open_as(owner, f"/trajectories/{trajectory.pk}/")
    tokens = page.locator("#replay-step .token")
    expect(tokens).to_have_count(len(ids))
    assert "".join(tokens.all_text_contents()) == "return a + b"
    expect(page.locator("#replay-step .tokens button")).to_be_hidden()


# --- bug 4: stop sequences of newlines --------------------------------------------------------------


def test_a_tier_keeps_a_newline_stop_sequence_and_the_form_can_enter_one(owner, open_as):
    run = build_run(owner)
    tier = run.tier
    Tier.objects.filter(pk=tier.pk).update(stop=["\n\n", "###"])
    page = open_as(owner, f"/tiers/{tier.pk}/edit/")
    expect(page.get_by_label("Stop")).to_have_value("\\n\\n\n###")
    page.get_by_role("button", name="Save tier").click()
    expect(page.locator(".message-success")).to_have_text("Tier cap saved.")
    tier.refresh_from_db()
    assert tier.stop == ["\n\n", "###"]
    page.goto(page.url + "edit/")
    page.get_by_label("Stop").fill("\\n\\nUser:\n\\t")
    page.get_by_role("button", name="Save tier").click()
    expect(page.locator("#stop-sequences code")).to_have_text(["\\n\\nUser:", "\\t"])
    tier.refresh_from_db()
    assert tier.stop == ["\n\nUser:", "\t"]


# --- bugs 5 and 6: every problem of a form at once -----------------------------------------------


def test_the_launch_form_reports_every_problem_rest_would(owner, open_as):
    run = build_run(owner)
    page = open_as(owner, f"/projects/{run.project_id}/runs/new/")
    page.locator("#id_task_set_version").select_option(index=1)
    page.locator("#id_reward_rule_version").select_option(index=1)
    page.locator("#id_tier").select_option(index=1)
    page.locator("#id_name").fill("")
    page.locator("#id_hp_group_size").fill("1")
    page.locator("#id_max_steps").fill("0")
    page.get_by_role("button", name="Launch run").click()
    expect(page.locator('.field-error[data-field="name"]')).to_have_text("This field is required.")
    expect(page.locator('.field-error[data-field="hp_group_size"]')).to_have_text("must be at least 2")
    expect(page.locator('.field-error[data-field="max_steps"]')).to_have_text("must be at least 1")
    assert Run.objects.count() == 1


def test_the_webhook_form_reports_both_bad_fields(owner, open_as):
    run = build_run(owner)
    page = open_as(owner, f"/projects/{run.project_id}/webhooks/")
    page.get_by_label("URL").fill("ftp://example.com/hook")
    description = page.get_by_label("Description")
    description.evaluate("node => node.removeAttribute('maxlength')")
    description.fill("x" * 201)
    page.get_by_role("button", name="Add webhook").click()
    expect(page.locator('.field-error[data-field="url"]')).to_have_text(
        "must start with http:// or https://, not ftp://"
    )
    expect(page.locator('.field-error[data-field="description"]')).to_contain_text("at most 200 characters")


# --- bug 7: trajectory filters say what they did not understand ------------------------------------


def test_a_bad_trajectory_filter_is_reported_and_the_task_filter_matches_part_of_an_id(owner, open_as):
    run = build_run(owner)
    for index in (0, 1, 2):
        trajectory_of(run, index=index, reward=index / 2)
    page = open_as(owner, f"/runs/{run.pk}/trajectories/?min_reward=abc")
    expect(page.locator("#filter-errors")).to_have_text("Reward ≥: 'abc' is not a number; filter not applied")
    expect(page.locator("#trajectories tbody tr")).to_have_count(3)
    page.get_by_label("Reward ≥").fill("")
    page.get_by_label("Task").fill("1")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#trajectories tbody tr td code")).to_have_text(["q1"])
    expect(page.locator("#filter-errors")).to_have_count(0)


# --- bug 8: messages that say what is wrong --------------------------------------------------------


def test_an_import_names_a_raw_control_character_once(owner, open_as, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    run = build_run(owner)
    page = open_as(owner, f"/task-sets/{run.task_set_version.task_set_id}/import/")
    line = '{"id": "t", "prompt": "a\tb", "reference": "1"}\n'
    page.get_by_label("JSONL or CSV file").set_input_files(
        {"name": "tab.jsonl", "mimeType": "application/x-ndjson", "buffer": line.encode()}
    )
    page.get_by_role("button", name="Preview").click()
    expect(page.locator("#errors tbody tr td").nth(2)).to_have_text(
        "not valid JSON: raw control character '\\t' inside a string: write it escaped, as \\t at column 25"
    )


def test_the_rule_editor_names_a_dangling_operator_and_a_new_multi_gets_its_own_name(owner, open_as):
    run = build_run(owner)
    page = open_as(owner, f"/projects/{run.project_id}/reward-rules/new/")
    expect(page.locator("#spec-status[data-state=valid]")).to_have_count(1)
    name = page.locator("#spec-editor [data-path='name'] input")
    name.fill("exact")
    page.locator("#spec-editor select").first.select_option("multi")
    expect(page.locator("#spec-editor [data-path='name'] input")).to_have_value("combined")
    page.fill(".add-grader input", "tests")
    page.select_option(".add-grader select", "unit_tests")
    page.click(".add-grader button")
    page.fill("[data-path='calculate_output'] input", "2.0 * tests +")
    expect(page.locator("[data-path='calculate_output'] .field-problem")).to_have_text(
        "ends with '+': a term is missing after it"
    )


# --- bug 9: plurals, decimals, preferences marked ----------------------------------------------------


def test_compare_advantages_and_preferences_read_right(owner, open_as):
    from reviews import services as review_services

    run = build_run(owner)
    first = trajectory_of(run, index=0, advantage=0.1234567890123456, completion_text="4")
    second = trajectory_of(run, index=0, sample_index=1, advantage=-0.25, completion_text="5")
    review_services.preference_create(chosen=first, rejected=second, by=owner, comment="")
    page = open_as(owner, f"/runs/compare/?runs={run.pk}")
    expect(page.get_by_role("heading", level=1)).to_have_text("Compare 1 run")
    page.goto(page.url.split("/runs/")[0] + f"/trajectories/{first.pk}/")
    expect(page.locator("#advantage")).to_have_text("0.123")
    page.goto(page.url.split("/trajectories/")[0] + f"/trajectories/{first.pk}/group/")
    cards = page.locator("#group .group-member")
    expect(cards.locator(".advantage")).to_have_text(["0.123", "-0.250"])
    expect(cards.nth(0).locator(".preferences")).to_have_text(f"Preferred over #{second.pk} by ada")
    expect(cards.nth(1).locator(".preferences")).to_have_text(f"#{first.pk} preferred over this by ada")
    expect(cards.nth(1).locator("button[aria-pressed=true]")).to_have_text(f"#{first.pk} is better")


# --- bug 10: a tier evaluation says how many items it rests on ---------------------------------------


def test_a_tier_evaluation_shows_the_items_and_interval_behind_a_pass_rate(owner, open_as):
    run = build_run(owner)
    result = {"name": "cap", "pass_rate": 0.8333, "passed": 5, "scored": 6, "tokens_per_second": 10.0}
    evaluation = TierEvaluation.objects.create(
        project=run.project,
        tier=run.tier,
        tier_configs=[{"id": run.tier_id, "name": "cap"}],
        checkpoint="base",
        task_set_version=run.task_set_version,
        status="succeeded",
        results=[result],
    )
    page = open_as(owner, f"/tier-evaluations/{evaluation.pk}/")
    rows = page.locator("#tier-results tbody tr")
    expect(rows.nth(0).locator("td")).to_have_text(["Pass rate", "0.833 (5 of 6 items; 95% CI 0.436–0.97)"])
    expect(rows.nth(1).locator("td")).to_have_text(["Items scored", "6"])


# --- the runs table -----------------------------------------------------------------------------


def three_runs(owner) -> list[Run]:
    """Runs 'live' (succeeded, reward 0.2), 'bravo' (running, reward 0.9), 'charlie' (queued)."""
    first = build_run(owner)
    runs = [first] + [
        lifecycle.run_create(request=lifecycle.run_request_from(first, name=name), by=owner)
        for name in ("bravo", "charlie")
    ]
    Run.objects.filter(pk=runs[0].pk).update(status=S.SUCCEEDED, learner_step=50, sandbox_cpu_seconds=3.5)
    Run.objects.filter(pk=runs[1].pk).update(status=S.RUNNING, learner_step=7)
    metrics(runs[0], range(1, 4), **{"reward/mean": lambda s: s / 15, "heldout/pass_rate": 0.5})
    metrics(runs[1], range(1, 4), **{"reward/mean": lambda s: s * 0.3, "learner/kl": 0.01})
    return runs


def test_the_runs_table_sorts_filters_searches_and_compares_a_selection(owner, open_as):
    live, bravo, charlie = three_runs(owner)
    page = open_as(owner, "/runs/")
    names = page.locator("#runs tbody tr td:nth-child(2) > a")
    expect(names).to_have_text(["charlie", "bravo", "live"])  # newest first
    expect(page.locator(f"#runs tr[data-run='{live.pk}'] td.num")).to_have_text(
        ["50 / 50", "0.200", "0.500", "—", "3.5", "—"]  # no usage recorded: no cost
    )
    page.get_by_role("link", name="Last reward").click()
    expect(names).to_have_text(["bravo", "live", "charlie"])  # highest first, no reward last
    page.get_by_role("link", name="Last reward ▼").click()
    expect(names).to_have_text(["live", "bravo", "charlie"])
    page.get_by_label("Status").select_option("running")
    page.get_by_role("button", name="Filter").click()
    expect(names).to_have_text(["bravo"])
    page.get_by_role("link", name="clear").click()
    page.get_by_label("Search").fill("CHAR")
    page.get_by_label("Search").press("Enter")
    expect(names).to_have_text(["charlie"])
    page.get_by_role("link", name="clear").click()

    compare = page.locator("#compare-selected")
    expect(compare).to_be_disabled()
    page.get_by_label("Select live").check()
    expect(page.locator("#compare-count")).to_have_text("Tick one more.")
    page.get_by_label("Select bravo").check()
    expect(compare).to_have_text("Compare 2 runs")
    compare.click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Compare 2 runs")
    assert sorted(page.url.split("?")[1].split("&")) == sorted([f"runs={bravo.pk}", f"runs={live.pk}"])


def test_the_project_page_shows_the_same_table(owner, open_as):
    live, bravo, charlie = three_runs(owner)
    page = open_as(owner, f"/projects/{live.project_id}/?sort=name")
    expect(page.locator("#runs tbody tr td:nth-child(2) > a")).to_have_text(["bravo", "charlie", "live"])
    expect(page.locator("#runs thead th")).to_have_count(12)  # no project column on a project's page


# --- run page charts -----------------------------------------------------------------------------


def test_charts_come_first_and_smooth_log_scale_and_change_their_x_axis(owner, open_as):
    run = build_run(owner)
    metrics(
        run,
        range(1, 21),
        **{"reward/mean": lambda s: (s % 2) + s / 10, "heldout/reward": lambda s: s / 40, "learner/kl": 0.5},
    )
    page = open_as(owner, f"/runs/{run.pk}/")
    reward = page.locator("#chart-reward")
    expect(reward).to_have_attribute("data-points", "40")
    headings = page.locator("main h2").all_text_contents()
    assert headings.index("Live charts") < headings.index("Configuration")
    names = "node => node.data.map(t => t.name + ':' + (t.yaxis || 'y') + ':' + (t.meta || ''))"
    assert reward.evaluate(names) == ["mean:y:", "held-out:y2:heldout"]  # held-out on its own axis

    page.locator("#chart-smoothing").fill("0.9")
    expect(reward).to_have_attribute("data-smoothing", "0.9")
    # Held-out evaluations are drawn as measured, markers and all, whatever the smoothing.
    assert reward.evaluate(names) == ["mean:y:raw", "mean (smoothed):y:smoothed", "held-out:y2:heldout"]
    held_out = reward.evaluate("node => [node.data[2].y, node.data[2].mode]")
    assert held_out == [[step / 40 for step in range(1, 21)], "lines+markers"]
    raw, smooth = reward.evaluate("node => [node.data[0].y, node.data[1].y]")
    assert smooth[0] == pytest.approx(raw[0])  # debiased: the first point is the first value
    assert max(smooth[10:]) - min(smooth[10:]) < max(raw[10:]) - min(raw[10:])
    expect(page.locator("#chart-smoothing-value")).to_have_text("0.90")

    page.get_by_label("Log scale").check()
    expect(reward).to_have_attribute("data-yscale", "log")
    assert reward.evaluate("node => node.layout.yaxis.type") == "log"
    page.get_by_label("Log scale").uncheck()
    expect(reward).to_have_attribute("data-yscale", "linear")

    page.get_by_label("X axis").select_option("wall")
    expect(reward).to_have_attribute("data-x", "wall")
    assert reward.evaluate("node => node.layout.xaxis.title.text") == "wall time (s)"

    page.get_by_role("button", name="Full screen: Reward (mean, min–max band, ± std)").click()
    cell = page.locator(".chart-cell[data-chart='chart-reward']")
    expect(cell).to_have_class("chart-cell chart-full")
    assert cell.evaluate("node => node.getBoundingClientRect().width") == 1400
    page.keyboard.press("Escape")
    expect(cell).to_have_class("chart-cell")


def test_a_held_out_series_is_drawn_as_measured_while_the_train_series_is_smoothed(owner, open_as):
    run = build_run(owner)
    heldout = {0: 0.5, 10: 0.75, 20: 0.75, 30: 0.875, 40: 1.0}  # five evaluations, ending at 1.0
    metrics(run, range(1, 41), **{"train/pass_rate": lambda s: (s % 3) / 2})
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, name="heldout/pass_rate", step=step, value=value)
        for step, value in heldout.items()
    )
    page = open_as(owner, f"/runs/{run.pk}/")
    chart = page.locator("#chart-pass-rate")
    expect(chart).to_have_attribute("data-points", "45")
    page.locator("#chart-smoothing").fill("0.9")
    expect(chart).to_have_attribute("data-smoothing", "0.9")
    traces = chart.evaluate("node => node.data.map(t => [t.name, t.meta || '', t.mode, t.y.at(-1)])")
    assert traces[0] == ["heldout/pass_rate", "heldout", "lines+markers", 1.0]
    assert [trace[:2] for trace in traces[1:]] == [
        ["train/pass_rate", "raw"],
        ["train/pass_rate (smoothed)", "smoothed"],
    ]
    assert chart.evaluate("node => node.data[0].y") == list(heldout.values())


# --- compare ---------------------------------------------------------------------------------------


def test_compare_overlays_every_metric_hides_identical_settings_and_names_runs_it_cannot_show(
    owner, open_as, django_user_model
):
    live, bravo, charlie = three_runs(owner)
    Run.objects.filter(pk=bravo.pk).update(max_steps=99)
    stranger = django_user_model.objects.create_user(username="eve", password="pw-123456")
    hidden = charlie  # moved to a project ada is not a member of
    Run.objects.filter(pk=hidden.pk).update(project=make_project(stranger, name="beta"))
    page = open_as(owner, f"/runs/compare/?runs={live.pk},{bravo.pk},{hidden.pk},x1")
    expect(page.get_by_role("heading", level=1)).to_have_text("Compare 2 runs")
    expect(page.locator("#compare-errors p")).to_have_text(
        [
            "'x1' is not a run id (run ids are whole numbers)",
            f"run {hidden.pk} does not exist, or is in a project you are not a member of",
        ]
    )
    cells = page.locator("#compare-charts .chart-cell")
    expect(cells).to_have_count(3)  # heldout/pass_rate, learner/kl, reward/mean
    expect(page.locator("#compare-reward-mean")).to_have_attribute("data-runs", "2")
    expect(page.locator("#compare-config tbody tr")).to_have_count(1)
    expect(page.locator("#compare-config tbody tr td")).to_have_text(["max_steps", "50", "99"])
    page.locator("#toggle-identical").click()
    expect(page.locator("#compare-config tbody tr.differs")).to_have_count(1)
    assert page.locator("#compare-config tbody tr").count() > 5

    page.goto(page.url.split("/runs/")[0] + f"/runs/compare/?runs={hidden.pk}")
    expect(page.locator("#compare-errors p")).to_have_text(
        [f"run {hidden.pk} does not exist, or is in a project you are not a member of"]
    )


# --- reviewing -------------------------------------------------------------------------------------


@pytest.fixture
def reviewer(owner, django_user_model):
    return django_user_model.objects.create_user(username="rev", password="pw-123456")


def reviewed_run(owner, reviewer) -> tuple[Run, list[Trajectory]]:
    run = build_run(owner, reviewer)
    outputs = ["The answer is 4", "five, I think", "It is 4."]
    return run, [trajectory_of(run, index=i, completion_text=text) for i, text in enumerate(outputs)]


def test_a_reviewer_labels_with_the_keyboard_and_moves_on(owner, reviewer, open_as):
    from reviews.models import Review

    run, (first, second, third) = reviewed_run(owner, reviewer)
    page = open_as(reviewer, f"/trajectories/{third.pk}/")
    expect(page.locator("#shortcuts")).to_contain_text("1–4 label and save")
    page.keyboard.press("2")
    expect(page.locator(".message-success")).to_have_text(f"Trajectory {third.pk} labelled bad.")
    assert list(Review.objects.values_list("trajectory_id", "label")) == [(third.pk, "bad")]
    page.keyboard.press("n")
    expect(page.get_by_role("heading", level=1)).to_contain_text(f"Trajectory {second.pk}")
    page.keyboard.press("c")
    page.keyboard.type("1 is not a label here")  # typing in the comment box is not a shortcut
    expect(page.locator("textarea[name=comment]")).to_have_value("1 is not a label here")
    page.keyboard.press("Escape")
    page.keyboard.press("1")
    expect(page.locator(".message-success")).to_have_text(f"Trajectory {second.pk} labelled good.")
    assert Review.objects.get(trajectory=second).comment == "1 is not a label here"


def test_a_reviewer_searches_previews_and_labels_a_selection_in_bulk(owner, reviewer, open_as):
    from reviews.models import Review
    from reviews.services import review_save

    run, (first, second, third) = reviewed_run(owner, reviewer)
    review_save(trajectory=first, by=owner, label="good")
    page = open_as(reviewer, f"/runs/{run.pk}/trajectories/")
    expect(page.locator("#trajectories .output-preview")).to_have_text(
        ["It is 4.", "five, I think", "The answer is 4"]
    )
    expect(page.locator("#trajectories .prompt-preview").first).to_have_text("2+2?")
    page.get_by_label("Search").fill("4")
    page.get_by_role("button", name="Filter").click()
    ids = page.locator("#trajectories tbody tr td:nth-child(2) a")
    expect(ids).to_have_text([str(third.pk), str(first.pk)])
    page.get_by_label("Search").fill("answer")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#trajectories tbody tr")).to_have_count(1)
    page.goto(page.url.split("?")[0])
    submit = page.locator("#bulk-submit")
    expect(submit).to_be_disabled()
    page.get_by_label("Select every trajectory on this page").check()
    expect(submit).to_have_text("Label 3 selected")
    page.get_by_label(f"Select trajectory {third.pk}").uncheck()
    expect(page.locator("#bulk-count")).to_have_text("2 selected")
    page.locator("#bulk-label").select_option("reward_hack")
    submit.click()
    expect(page.locator(".message-success")).to_have_text("Labelled 2 trajectories reward hack.")
    mine = Review.objects.filter(reviewer=reviewer).order_by("trajectory_id")
    assert list(mine.values_list("trajectory_id", "label")) == [
        (first.pk, "reward_hack"),
        (second.pk, "reward_hack"),
    ]

    page.goto(page.url.split("/runs/")[0] + f"/runs/{run.pk}/review-queues/")
    expect(page.locator("#agreement-summary")).to_have_text(
        "0 of 1 trajectories labelled by two or more reviewers got one label;"
        " reviewer pairs agree 0.00 of the time."
    )
    expect(page.locator("#disagreements tbody tr td").nth(1)).to_have_text("ada: good rev: reward_hack")


# --- the first screen ----------------------------------------------------------------------------------


def test_a_newcomer_launches_the_demo_from_home_and_finds_the_models_offered(
    owner, open_as, settings, tmp_path
):
    settings.FLYWHEEL_HOME = tmp_path
    model = tmp_path / "models" / "tiny-base"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    page = open_as(owner, "/")
    expect(page.locator("#how-it-works")).to_contain_text("How a run works")
    expect(page.locator("#readme-link")).to_have_attribute("href", "/docs/guides/launch-a-run/")
    page.get_by_role("button", name="Launch the demo run").click()
    expect(page.locator(".message-success")).to_have_text(
        "Launched GRPO demo in Demo (ada): it trains the tiny base model with GRPO."
    )
    expect(page.get_by_role("heading", level=1)).to_contain_text("GRPO demo")
    run = Run.objects.get()
    assert (run.project.name, run.tier_config["base_model"]) == ("Demo (ada)", str(model))

    page.goto(page.url.split("/runs/")[0] + f"/projects/{run.project_id}/tiers/new/")
    expect(page.get_by_label("Base model")).to_have_value(str(model))
    expect(page.locator("#local-models option")).to_have_count(1)
    expect(page.locator("#local-models-help code")).to_have_text([str(model)])
    page.goto(page.url.split("/projects/")[0] + "/readme/")  # the old address leads to the docs
    page.get_by_role("link", name="Launch a run").first.click()
    expect(page.locator("#readme h2#runs")).to_contain_text("Runs")


# --- model output, names and query strings stay inert text on every new page -----------------------------


def test_hostile_text_stays_inert_on_every_new_page_and_field(owner, reviewer, open_as, live_server):
    from reviews import services as review_services
    from tests.test_live_browser import HOSTILE

    run, (first, second, third) = reviewed_run(owner, reviewer)
    Run.objects.filter(pk=run.pk).update(name=HOSTILE, tier_config=run.tier_config | {"base_model": HOSTILE})
    other = lifecycle.run_create(request=lifecycle.run_request_from(run, name="other"), by=owner)
    metrics(run, range(1, 4), **{HOSTILE[:100]: 1.0, "reward/mean": 0.5})
    metrics(other, range(1, 4), **{HOSTILE[:100]: 2.0})
    Trajectory.objects.filter(pk=first.pk).update(completion_text=HOSTILE, advantage=0.5)
    first.item.__class__.objects.filter(pk=first.item_id).update(text=HOSTILE)
    review_services.review_save(trajectory=first, by=owner, label="good", comment=HOSTILE)
    review_services.review_save(trajectory=first, by=reviewer, label="bad", comment=HOSTILE)
    rival = trajectory_of(run, index=0, sample_index=1, completion_text=HOSTILE)
    review_services.preference_create(chosen=first, rejected=rival, by=owner, comment=HOSTILE)
    queue = review_services.queue_create(run=run, name=HOSTILE[:100], filters={}, by=owner)
    Tier.objects.filter(pk=run.tier_id).update(stop=[HOSTILE])
    dialogs = []
    page = open_as(owner, "/runs/")
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    expect(page.get_by_text(HOSTILE).first).to_be_visible()
    visits = [
        (f"/projects/{run.project_id}/?q=%3Cscript%3Ealert(3)%3C/script%3E", "#runs-filters"),
        (f"/runs/{run.pk}/", "#chart-other[data-points='3']"),
        (f"/runs/compare/?runs={run.pk},{other.pk},%3Cimg%20src=x%20onerror=alert(4)%3E", "#compare-errors"),
        (
            f"/runs/{run.pk}/trajectories/?min_reward=%3Cimg%20src=x%20onerror=alert(5)%3E&q=%3Cb%3E",
            "#filter-errors",
        ),
        (f"/trajectories/{first.pk}/", "#review-disagreement"),
        (f"/trajectories/{first.pk}/group/", ".preferences"),
        (f"/review-queues/{queue.pk}/", "#queue-items"),
        (f"/runs/{run.pk}/review-queues/", "#disagreements"),
        (f"/tiers/{run.tier_id}/", "#stop-sequences"),
        (f"/tiers/{run.tier_id}/edit/", "#local-models-help"),
        ("/docs/", "#readme"),
        ("/", "#first-screen"),
    ]
    for path, ready in visits:
        page.goto(live_server.url + path)
        expect(page.locator(ready).first).to_be_visible()
    page.goto(f"{live_server.url}/runs/compare/?runs={run.pk},{other.pk}")
    expect(page.locator(".chart-cell .main-svg").first).to_be_visible()
    expect(page.locator("#compare-runs")).to_contain_text(HOSTILE)
    assert page.evaluate("window.__pwned") is None
    assert page.locator("img[src=x]").count() == 0
    assert page.locator("script:not([src]):not([type='application/json'])").count() == 0
    assert dialogs == []


# --- themes and width --------------------------------------------------------------------------------------


WIDER_THAN_THE_WINDOW = """() => [document.documentElement.scrollWidth - window.innerWidth].concat(
  Array.from(document.querySelectorAll('.table-scroll, .chart-cell'))
    .map(n => n.scrollWidth - n.clientWidth))"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_pages_follow_the_system_theme_and_fit_1280_px(owner, open_as, live_server, scheme):
    live, bravo, charlie = three_runs(owner)
    for index in range(3):
        trajectory_of(live, index=index, completion_text="a fairly long output " * 20)
    page = open_as(owner, "/runs/", width=1280, scheme=scheme)
    background = "rgb(15, 20, 27)" if scheme == "dark" else "rgb(245, 246, 248)"
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == background
    for path, ready in [
        ("/runs/", "#runs"),
        (f"/projects/{live.project_id}/", "#runs"),
        (f"/runs/{live.pk}/", "#chart-reward .main-svg"),
        (f"/runs/{live.pk}/trajectories/", "#trajectories"),
        (f"/runs/compare/?runs={live.pk},{bravo.pk}", "#compare-reward-mean .main-svg"),
        ("/", "#first-screen"),
    ]:
        page.goto(live_server.url + path)
        expect(page.locator(ready).first).to_be_visible()
        overflow = page.evaluate(WIDER_THAN_THE_WINDOW)
        assert max(overflow) <= 1, (path, overflow)

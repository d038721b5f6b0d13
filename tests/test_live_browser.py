"""The live run page, replay and review in headless Chromium against Daphne (websockets included):
a chart grows while points are emitted, a replay is stepped through, a trajectory is labelled
and exported, and model output holding HTML and script stays inert text."""

import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.test_browser import CHROMIUM

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)", allow_module_level=True)

from channels.testing import ChannelsLiveServerTestCase  # noqa: E402
from django.test import override_settings  # noqa: E402
from playwright.sync_api import expect  # noqa: E402

from core.roles import Role  # noqa: E402
from projects import services as project_services
from reviews.models import Review  # noqa: E402
from rewards import services as reward_services  # noqa: E402
from runs import lifecycle  # noqa: E402
from runs.lifecycle import RunRequest  # noqa: E402
from runs.models import Trajectory, TrajectoryStep  # noqa: E402
from tests.conftest import make_project, make_user  # noqa: E402
from tests.run_fixtures import ANSWER_RULE, ITEMS  # noqa: E402
from tests.test_browser import FAST_HASHERS, chromium_page, sign_in  # noqa: E402
from tiers import services as tier_services  # noqa: E402

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # see tests/test_browser.py

pytestmark = pytest.mark.browser
HOSTILE = '<script>window.__pwned=1;alert(1)</script><img src=x onerror="window.__pwned=2;alert(2)">'


def build_run(owner, reviewer=None):
    """A project with a reviewer, a task set, a rule, a tier whose model folder exists, and a run."""
    project = make_project(owner, name="alpha")
    if reviewer is not None:
        project_services.member_add(project=project, username=reviewer.username, role=Role.REVIEWER)
    task_set = project_services.task_set_create(project=project, name="arith", by=owner)
    lines = [(json.dumps(item) + "\n").encode() for item in ITEMS]
    version = project_services.task_set_import(
        task_set=task_set, stream=lines, file_format="jsonl", by=owner
    ).version
    rule = reward_services.reward_rule_create(project=project, name="exact", spec=ANSWER_RULE, by=owner)
    tier = tier_services.tier_create(project=project, by=owner, name="cap", base_model=tempfile.mkdtemp())
    request = RunRequest(
        project=project,
        name="live",
        task_set_version=version,
        reward_rule_version=rule.versions.get(),
        tier=tier,
        hyperparameters={"group_size": 4},
        max_steps=50,
    )
    return lifecycle.run_create(request=request, by=owner)


def emit(run, step: int) -> None:
    """The learner's own metrics_write: one insert, then the notification after commit."""
    from runs.services import metrics_write

    values = {"reward/mean": step / 10, "reward/min": 0.0, "reward/max": 1.0, "episodes/errored_rate": 0.0}
    metrics_write(run, step, values)


def add_step(trajectory, index: int, kind: str, data: dict) -> None:
    payload, size = TrajectoryStep.pack(data)
    TrajectoryStep.objects.create(
        trajectory=trajectory, index=index, kind=kind, payload=payload, raw_size=size
    )


def agent_trajectory(run, text: str = "def add(a, b):\n    return a + b\n") -> Trajectory:
    item = run.task_set_version.items.order_by("position").first()
    trajectory = Trajectory.objects.create(
        run=run,
        item=item,
        policy_version=1,
        outcome="scored",
        reward=0.5,
        components={"tests": 0.5, "format": 1.0},
        completion_text=text,
    )
    add_step(trajectory, 0, "message", {"observation": "Write add(a, b).", "action": "I will write it."})
    add_step(
        trajectory,
        1,
        "code",
        {
            "observation": "workspace ready",
            "action": {"tool": "write_file", "path": "add.py"},
            "files_changed": [{"path": "add.py", "before": "def add(a, b):\n    pass\n", "after": text}],
        },
    )
    add_step(
        trajectory,
        2,
        "command",
        {
            "action": "pytest -q",
            "tool_result": {
                "stdout": "1 passed, 1 failed",
                "stderr": "",
                "exit_code": 1,
                "tests": [
                    {"name": "test_add", "passed": True, "outcome": "pass", "message": ""},
                    {
                        "name": "test_neg",
                        "passed": False,
                        "outcome": "fail",
                        "message": "line 4: assert add(-1, 1) == 0",
                        "expected": "0",
                        "actual": "-2",
                    },
                ],
            },
            "tokens": ["py", "test", " -q"],
            "token_ids": [11, 12, 13],
            "logprobs": [-0.01, -2.5, -7.0],
            "reward": 0.5,
            "components": {"tests": 0.5, "format": 1.0},
        },
    )
    Trajectory.objects.filter(pk=trajectory.pk).update(step_count=3)
    return trajectory


# One test a class: each class forks its own Daphne, which then sees a freshly flushed database.
@override_settings(PASSWORD_HASHERS=FAST_HASHERS)  # before setUpClass forks the server
class LiveChartTest(ChannelsLiveServerTestCase):
    def test_a_chart_grows_while_a_worker_emits_points(self):
        owner = make_user("ada")
        run = build_run(owner)
        with chromium_page() as page:
            page.goto(f"{self.live_server_url}/runs/{run.pk}/")
            sign_in(page, "ada")
            expect(page.locator("#live-status")).to_have_text("live")
            with ThreadPoolExecutor(max_workers=1) as pool:
                pool.submit(emit, run, 1).result()
                expect(page.locator("#chart-reward")).to_have_attribute("data-points", "3")
                for step in range(2, 6):
                    pool.submit(emit, run, step).result()
            expect(page.locator("#metric-step")).to_have_text("5")
            expect(page.locator("#chart-reward")).to_have_attribute("data-points", "15")
            expect(page.locator("#chart-errored")).to_have_attribute("data-points", "5")
            points = page.evaluate("document.getElementById('chart-reward').data[2].y")
            assert points == [0.1, 0.2, 0.3, 0.4, 0.5]
            with ThreadPoolExecutor(max_workers=1) as pool:
                pool.submit(lambda: lifecycle.run_event(run, "alert", "errored", level="warning")).result()
            expect(page.locator("#alerts .alert-message").first).to_have_text(" errored")
            page.screenshot(path="/tmp/flywheel-live-run.png", full_page=True)


@override_settings(PASSWORD_HASHERS=FAST_HASHERS)
class ReplayTest(ChannelsLiveServerTestCase):
    def test_a_replay_is_stepped_through(self):
        owner = make_user("ada")
        trajectory = agent_trajectory(build_run(owner))
        with chromium_page() as page:
            page.goto(f"{self.live_server_url}/trajectories/{trajectory.pk}/")
            sign_in(page, "ada")
            expect(page.locator("#replay-position")).to_have_text("step 0 of 3")
            expect(page.locator("#replay-step .observation")).to_have_text("Write add(a, b).")
            page.get_by_role("button", name="Next step").click()
            expect(page.locator("#replay-position")).to_have_text("step 1 of 3")
            expect(page.locator("#replay-step .diff .del")).to_have_text(["-     pass\n"])
            expect(page.locator("#replay-step .diff .add")).to_have_text(["+     return a + b\n"])
            page.locator("#replay-jump").fill("2")
            page.get_by_role("button", name="Go").click()
            expect(page.locator("#replay-step .exit")).to_have_text("exit 1")
            expect(page.locator("#replay-step .tests .fail")).to_have_text(["fail"])
            failing = page.locator("#replay-step .tests tr").nth(2).locator("td")
            expect(failing).to_have_text(["test_neg", "fail", "line 4: assert add(-1, 1) == 0", "0", "-2"])
            expect(page.locator("#tests .test-row td:first-child")).to_have_text(["test_add", "test_neg"])
            expect(page.locator("#replay-step .token")).to_have_text(["py", "test", " -q"])
            expect(page.locator("#replay-step .stdout")).to_have_text("1 passed, 1 failed")
            page.get_by_role("button", name="Previous step").click()
            page.get_by_role("button", name="Previous step").click()
            page.locator("#replay-speed").select_option("4")
            page.get_by_role("button", name="Play").click()
            expect(page.locator("#replay-position")).to_have_text("step 2 of 3")
            expect(page.locator("#replay-play")).to_have_text("Play")  # stopped at the end


@override_settings(PASSWORD_HASHERS=FAST_HASHERS)
class ReviewExportTest(ChannelsLiveServerTestCase):
    def test_a_reviewer_labels_a_trajectory_and_exports_it(self):
        owner, reviewer = make_user("ada"), make_user("rev")
        trajectory = agent_trajectory(build_run(owner, reviewer))
        with chromium_page() as page:
            page.goto(f"{self.live_server_url}/trajectories/{trajectory.pk}/")
            sign_in(page, "rev")
            page.get_by_label("Good").check()
            page.get_by_label("Comment").fill("clean solution")
            page.get_by_role("button", name="Save label").click()
            expect(page.locator(".message-success")).to_have_text(
                f"Trajectory {trajectory.pk} labelled good."
            )
            expect(page.locator("#reviews")).to_contain_text("Good by rev: clean solution")
            assert list(Review.objects.values_list("label", "comment")) == [("good", "clean solution")]
            page.goto(f"{self.live_server_url}/runs/{trajectory.run_id}/review-queues/")
            with page.expect_download() as download:
                page.get_by_role("link", name="Export SFT JSONL").click()
            lines = Path(download.value.path()).read_text().splitlines()
            assert [json.loads(line)["reference"] for line in lines] == [trajectory.completion_text]


@override_settings(PASSWORD_HASHERS=FAST_HASHERS)
class InertModelOutputTest(ChannelsLiveServerTestCase):
    def test_html_and_script_in_model_output_render_as_inert_text(self):
        owner = make_user("ada")
        run = build_run(owner)
        trajectory = agent_trajectory(run, text=HOSTILE)
        add_step(trajectory, 3, "command", {"action": HOSTILE, "tokens": [HOSTILE], "logprobs": [-1.0]})
        Trajectory.objects.filter(pk=trajectory.pk).update(flags=[{"detector": HOSTILE, "evidence": HOSTILE}])
        dialogs = []
        with chromium_page() as page:
            page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
            page.goto(f"{self.live_server_url}/trajectories/{trajectory.pk}/")
            sign_in(page, "ada")
            expect(page.locator("#completion")).to_have_text(HOSTILE)
            # The replay has drawn its first step: its buttons are wired (Plotly, deferred, loads first).
            expect(page.locator("#replay-step .observation")).to_have_text("Write add(a, b).")
            page.locator("#replay-jump").fill("3")
            page.get_by_role("button", name="Go").click()
            expect(page.locator("#replay-step .action")).to_have_text(HOSTILE)
            expect(page.locator("#replay-step .token")).to_have_text([HOSTILE])
            page.locator("#replay-jump").fill("1")
            page.get_by_role("button", name="Go").click()
            expect(page.locator("#replay-step .diff .add").first).to_contain_text("<script>")
            for path in (f"/trajectories/{trajectory.pk}/group/", f"/runs/{run.pk}/trajectories/"):
                page.goto(f"{self.live_server_url}{path}")
                expect(page.get_by_text(HOSTILE).first).to_be_visible()
            page.wait_for_timeout(300)
            assert page.evaluate("window.__pwned") is None
            assert page.locator("img[src=x]").count() == 0
        assert dialogs == []

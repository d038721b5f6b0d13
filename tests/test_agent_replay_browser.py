"""The replay of a REAL agent run in headless Chromium: a taught model plays an agent item through
a run's rollout batch (tests/test_agent_run.py), and the replay steps through what was stored:
the invalid action and its error, the tool calls, the workspace diff, per-test results, tokens
and the final workspace."""

import os
import tempfile
from pathlib import Path

import pytest

from tests.test_browser import CHROMIUM

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)", allow_module_level=True)

from channels.testing import ChannelsLiveServerTestCase  # noqa: E402
from django.test import override_settings  # noqa: E402
from playwright.sync_api import expect  # noqa: E402

from runs.models import Trajectory  # noqa: E402
from tests.conftest import make_user  # noqa: E402
from tests.test_agent_run import agent_batch_play, agent_run_create, taught_agent  # noqa: E402
from tests.test_browser import FAST_HASHERS, chromium_page, sign_in  # noqa: E402

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # see tests/test_browser.py

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]  # it teaches a model first
__all__ = ["taught_agent"]


@pytest.fixture(scope="class")
def taught_model(request, taught_agent):
    request.cls.model_path = taught_agent


@pytest.mark.usefixtures("taught_model")
@override_settings(PASSWORD_HASHERS=FAST_HASHERS)
class AgentReplayTest(ChannelsLiveServerTestCase):
    model_path: Path

    def test_a_replay_of_a_real_agent_run_shows_its_calls_diff_tests_and_workspace(self):
        owner = make_user("ada")
        with self.settings(FLYWHEEL_HOME=tempfile.mkdtemp()):
            run = agent_run_create(owner, self.model_path)
            batch = agent_batch_play(run)
        trajectory = Trajectory.objects.filter(batch=batch).order_by("pk").first()
        with chromium_page() as page:
            page.goto(f"{self.live_server_url}/trajectories/{trajectory.pk}/")
            sign_in(page, "ada")
            step = page.locator("#replay-step")
            expect(page.locator("#replay-position")).to_have_text("step 0 of 4")
            expect(step.locator(".invalid")).to_have_text(
                "invalid action (arguments): write_file: 'content' is required"
            )
            expect(step.locator(".observation")).to_contain_text("Write 7 into answer.txt.")
            page.get_by_role("button", name="Next step").click()
            expect(page.locator("#replay-position")).to_have_text("step 1 of 4")
            expect(step.locator(".observation")).to_have_text(
                "[user]\nInvalid action: write_file: 'content' is required"
            )
            expect(step.locator(".tool-call-name")).to_have_text(["write_file"])
            expect(step.locator(".diff .add")).to_have_text(["+7\n"])
            page.locator("#replay-jump").fill("2")
            page.get_by_role("button", name="Go").click()
            expect(step.locator(".tool-call-name")).to_have_text(["run_tests"])
            expect(step.locator(".tests .pass")).to_have_text(["passed", "passed"])
            expect(step.locator(".stdout")).to_have_text("2 passed, 0 failed")
            page.locator("#replay-jump").fill("3")
            page.get_by_role("button", name="Go").click()
            expect(step.locator(".workspace h4")).to_have_text(["answer.txt", "test_answer.py"])
            expect(step.locator(".workspace-file").first).to_have_text("7")
            assert step.locator(".token").count() > 5  # the submit call's tokens, by log-prob

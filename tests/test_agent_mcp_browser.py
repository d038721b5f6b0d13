"""The replay of an agent episode that called MCP tools, in headless Chromium: each call, the
server and tool it went to, and what it answered (tests/test_agent_mcp.py plays and stores it)."""

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

from tests.conftest import make_project, make_user  # noqa: E402
from tests.test_agent_mcp import mcp_episode_store, mcp_run_create  # noqa: E402
from tests.test_browser import FAST_HASHERS, chromium_page, sign_in  # noqa: E402

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # see tests/test_browser.py

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


@override_settings(PASSWORD_HASHERS=FAST_HASHERS)
class McpReplayTest(ChannelsLiveServerTestCase):
    def test_the_replay_shows_each_mcp_call_its_server_and_its_result(self):
        owner = make_user("ada")
        home = Path(tempfile.mkdtemp())
        with self.settings(FLYWHEEL_HOME=home):
            trajectory = mcp_episode_store(mcp_run_create(owner, make_project(owner), home))
        with chromium_page() as page:
            page.goto(f"{self.live_server_url}/trajectories/{trajectory.pk}/")
            sign_in(page, "ada")
            step = page.locator("#replay-step")
            expect(page.locator("#replay-position")).to_have_text("step 0 of 3")
            expect(step.locator(".tool-call-name")).to_have_text(["calc__add"])
            expect(step.locator(".tool-call-arguments")).to_contain_text('"a": 2')
            expect(step.locator(".mcp-tool")).to_have_text("MCP server calc, tool add")
            expect(step.locator(".stdout")).to_have_text("5")
            page.get_by_role("button", name="Next step").click()
            expect(step.locator(".observation")).to_have_text("[tool calc__add]\n5")
            expect(step.locator(".mcp-tool")).to_have_text("MCP server files, tool write_file")
            expect(step.locator(".diff .add")).to_have_text(["+5\n"])

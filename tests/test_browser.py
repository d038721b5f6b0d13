"""A real browser through the pages: sign in, create a task set with its file (a broken file first),
import a second file through its preview, create a tier; live updates."""

import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)", allow_module_level=True)

from channels.testing import ChannelsLiveServerTestCase  # noqa: E402
from django.test import override_settings  # noqa: E402
from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402

from projects import services as project_services  # noqa: E402
from projects.models import TaskItem, TaskSet  # noqa: E402
from tests.conftest import make_project, make_user  # noqa: E402
from tiers.models import Tier  # noqa: E402

# Playwright's sync API runs an event loop in this thread; Django's ORM calls from the test
# itself (fixtures, assertions) are still synchronous and safe.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

pytestmark = pytest.mark.browser
SCREENSHOTS = Path("/tmp")
GOOD = [{"id": f"q{i}", "prompt": f"What is {i} + {i}?", "reference": str(2 * i)} for i in range(3)]
BROKEN = [GOOD[0], {"id": "q1", "prompt": "no reference here"}, GOOD[2]]


def jsonl(items) -> bytes:
    return "".join(json.dumps(item) + "\n" for item in items).encode()


# conftest's fast hasher, also for the Daphne process that ChannelsLiveServerTestCase forks.
FAST_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@contextmanager
def chromium_page() -> Iterator[Page]:
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
        context = browser.new_context(viewport={"width": 1280, "height": 860})
        page = context.new_page()
        page.set_default_timeout(15_000)
        try:
            yield page
        finally:
            context.close()
            browser.close()


@pytest.fixture
def browser_page():
    with chromium_page() as page:
        yield page


def sign_in(page: Page, username: str) -> None:
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill("pw-123456")
    page.get_by_role("button", name="Sign in").click()
    # Wait for the page signed in to, with its deferred scripts run, before anything acts on it.
    page.wait_for_url(lambda url: "/accounts/login/" not in url, wait_until="load")


def choose_file(page: Page, name: str, content: bytes) -> None:
    page.get_by_label("JSONL or CSV file").set_input_files(
        {"name": name, "mimeType": "application/x-ndjson", "buffer": content}
    )


def upload(page: Page, name: str, content: bytes) -> None:
    choose_file(page, name, content)
    page.get_by_role("button", name="Preview").click()


def test_a_launcher_imports_a_task_set_and_creates_a_tier(
    live_server, transactional_db, browser_page, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    user = make_user("ada")
    project = make_project(user, name="alpha")
    page = browser_page

    page.goto(f"{live_server.url}/projects/{project.pk}/")
    expect(page.get_by_role("heading", name="Sign in to Flywheel")).to_be_visible()
    sign_in(page, "ada")
    expect(page.get_by_role("heading", name="alpha", level=1)).to_be_visible()
    expect(page.locator(".your-role .badge")).to_have_text("owner")

    page.get_by_role("link", name="New task set").click()
    page.get_by_label("Name").fill("arith")
    choose_file(page, "broken.jsonl", jsonl(BROKEN))
    page.get_by_role("button", name="Create task set").click()
    errors = page.locator("#errors tbody tr")
    expect(errors).to_have_count(1)
    expect(errors.first.locator("td")).to_have_text(["2", "reference", "is required for an answer item"])
    expect(page.locator("#error-summary")).to_have_text("1 error in total; no task set was created.")
    assert not TaskSet.objects.exists()  # created with its file, or not at all

    expect(page.get_by_label("Name")).to_have_value("arith")
    choose_file(page, "good.jsonl", jsonl(GOOD[:2]))
    page.get_by_role("button", name="Create task set").click()
    expect(page.locator(".message-success")).to_have_text("Task set arith created with 2 items as version 1.")
    expect(page.get_by_role("heading", name="arith version 1")).to_be_visible()

    # Later files are previewed before they import.
    page.goto(f"{live_server.url}/task-sets/{TaskSet.objects.get().pk}/import/")
    expect(page.get_by_role("heading", name="Import items into arith")).to_be_visible()
    upload(page, "good.jsonl", jsonl(GOOD))
    expect(page.locator("#item-count")).to_have_text("3")
    expect(page.locator("#preview tbody tr")).to_have_count(3)
    page.screenshot(path=str(SCREENSHOTS / "flywheel-import-preview.png"), full_page=True)
    page.get_by_role("button", name="Import 3 items").click()

    expect(page.locator(".message-success")).to_have_text("Imported 3 items as version 2.")
    expect(page.get_by_role("heading", name="arith version 2")).to_be_visible()
    items = page.locator("#items details")
    expect(items).to_have_count(3)
    items.nth(1).locator("summary").click()
    expect(items.nth(1).locator("dd pre")).to_have_text(["What is 1 + 1?", "2"])
    assert TaskItem.objects.filter(version__task_set__name="arith", version__number=2).count() == 3

    page.locator(".crumbs").get_by_role("link", name="alpha").click()
    page.get_by_role("link", name="New tier").click()
    page.get_by_label("Name").fill("fast")
    page.get_by_label("Base model").fill("./models/tiny")
    page.get_by_label("Device").select_option("cuda")
    page.get_by_label("Precision").select_option("int8")
    page.get_by_role("button", name="Create tier").click()
    expect(page.locator('.field-error[data-field="precision"]')).to_have_text(
        "int8 dynamic quantisation runs on the CPU; choose device cpu or auto"
    )
    assert not Tier.objects.exists()
    page.get_by_label("Device").select_option("cpu")
    page.get_by_role("button", name="Create tier").click()
    expect(page.get_by_role("heading", name="Tier fast")).to_be_visible()

    page.locator(".crumbs").get_by_role("link", name="alpha").click()
    expect(page.locator("#task-sets tbody tr td").nth(1)).to_have_text("v2")
    expect(page.locator("#tiers tbody tr td").first).to_have_text("fast")
    # The live server speaks no websockets: the page stays usable, re-rendered from the server.
    expect(page.locator("#live-status")).to_have_text("live updates off · refreshing every 15 s")
    page.screenshot(path=str(SCREENSHOTS / "flywheel-project.png"), full_page=True)


@override_settings(PASSWORD_HASHERS=FAST_HASHERS)  # before setUpClass forks the server
class ProjectPageLiveUpdatesTest(ChannelsLiveServerTestCase):
    """Against Daphne, websockets included: an import shows up on an open project page."""

    def test_a_new_version_appears_on_an_open_project_page(self):
        user = make_user("ada")
        project = make_project(user, name="alpha")
        task_set = project_services.task_set_create(project=project, name="arith", by=user)
        with chromium_page() as page:
            page.goto(f"{self.live_server_url}/projects/{project.pk}/")
            sign_in(page, "ada")
            expect(page.locator("#live-status")).to_have_text("live")
            expect(page.locator("#task-sets tbody tr td").nth(1)).to_have_text("no version yet")
            # From another thread: Playwright's loop owns this one, and the event is sent with
            # async_to_sync once the import commits.
            with ThreadPoolExecutor(max_workers=1) as pool:
                report = pool.submit(
                    project_services.task_set_import,
                    task_set=task_set,
                    stream=jsonl(GOOD).splitlines(keepends=True),
                    file_format="jsonl",
                    by=user,
                ).result()
            assert report.created
            expect(page.locator("#task-sets tbody tr td").nth(1)).to_have_text("v1")
            expect(page.locator("#task-sets tbody tr td").nth(2)).to_have_text("3")

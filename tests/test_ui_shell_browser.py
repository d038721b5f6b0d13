"""The page shell in headless Chromium (issue 26): on a phone (390×844) every main page fits the
screen and a menu button opens the navigation; the run page's weight on a first and a second visit
through the server's own static files (compressed, fingerprinted, long-cached); no console error on
the chart pages."""

import os
import re
import tempfile
from collections.abc import Iterator

import pytest
from django.core.management import call_command
from django.test import Client
from django.test.testcases import LiveServerThread
from playwright.sync_api import Browser, Page, expect, sync_playwright

from reviews import services as review_services
from runs.models import MetricPoint, Run
from tests.test_browser import CHROMIUM
from tests.test_live_browser import agent_trajectory, build_run
from tiers.models import TierEvaluation

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # see tests/test_browser.py
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=15_000)
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1400, "height": 900}


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
def owner(django_user_model):
    user = django_user_model.objects.create_user(username="ada", password="pw-123456")
    user.is_staff = user.is_superuser = True
    user.save()
    return user


@pytest.fixture
def run(owner) -> Run:
    run = build_run(owner)
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, name=name, step=step, value=step / 10)
        for step in range(1, 11)
        for name in ("reward/mean", "reward/min", "reward/max", "learner/kl", "heldout/reward")
    )
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED, learner_step=10)
    return run


def signed_in_page(browser: Browser, user, base_url: str, viewport: dict) -> Page:
    client = Client()
    client.force_login(user)
    context = browser.new_context(viewport=viewport)
    context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": base_url}])
    page = context.new_page()
    page.set_default_timeout(15_000)
    return page


def main_pages(run: Run, owner) -> dict[str, str]:
    trajectory = agent_trajectory(run)
    queue = review_services.queue_create(run=run, name="all", filters={}, by=owner)
    project = run.project
    return {
        "home": "/",
        "project": f"/projects/{project.pk}/",
        "runs": "/runs/",
        "run": f"/runs/{run.pk}/",
        "tasks": f"/task-sets/{run.task_set_version.task_set_id}/",
        "rewards": f"/projects/{project.pk}/reward-rules/",
        "reviews": f"/runs/{run.pk}/review-queues/",
        "review queue": f"/review-queues/{queue.pk}/",
        "trajectory": f"/trajectories/{trajectory.pk}/",
        "compare": f"/runs/compare/?runs={run.pk}",
        "trajectories": f"/runs/{run.pk}/trajectories/",
        "task set version": f"/task-sets/{run.task_set_version.task_set_id}/versions/1/",
        "reward rule": f"/reward-rules/{run.reward_rule_version.rule_id}/",
        "reward rule editor": f"/reward-rules/{run.reward_rule_version.rule_id}/edit/",
        "tier": f"/tiers/{run.tier_id}/",
        "new run": f"/projects/{project.pk}/runs/new/",
        "members": f"/projects/{project.pk}/members/",
        "traces": f"/projects/{project.pk}/traces/",
        "reward models": f"/projects/{project.pk}/reward-models/",
        "webhooks": f"/projects/{project.pk}/webhooks/",
        "playground": "/playground/",
        "API tokens": "/tokens/",
        "operations": "/ops/",
        "docs": "/docs/guides/launch-a-run/",
    }


def overflow(page: Page) -> dict:
    """How far the page scrolls sideways, and the widest element that sticks out."""
    return page.evaluate(
        """() => {
          const width = document.documentElement.clientWidth;
          const sticksOut = (node) => node.getBoundingClientRect().right > width + 1;
          const culprits = [...document.body.querySelectorAll("*")]
            .filter((node) => sticksOut(node) && ![...node.children].some(sticksOut))
            .slice(0, 3)
            .map((node) => `${node.tagName}.${node.className} ${node.getBoundingClientRect().right}`);
          return { scroll: document.documentElement.scrollWidth, width, culprits };
        }"""
    )


def test_on_a_phone_every_main_page_fits_the_screen_and_the_charts_fit_their_card(
    browser, live_server, owner, run
):
    page = signed_in_page(browser, owner, live_server.url, PHONE)
    too_wide = {}
    for name, path in main_pages(run, owner).items():
        assert page.goto(f"{live_server.url}{path}", wait_until="load").ok, name
        if name == "run":
            expect(page.locator("#chart-reward .main-svg").first).to_be_visible()
            chart = page.locator("#chart-reward .main-svg").first.bounding_box()
            card = page.locator("#chart-reward").bounding_box()
            assert chart["width"] <= card["width"] + 1, (chart, card)
        measured = overflow(page)
        if measured["scroll"] > PHONE["width"]:
            too_wide[name] = measured
    assert too_wide == {}
    # A wide table scrolls inside itself, not the page.
    page.goto(f"{live_server.url}/runs/{run.pk}/", wait_until="load")
    table = page.locator("table.table").first
    assert table.evaluate("t => getComputedStyle(t).overflowX") == "auto"


def test_on_a_phone_the_menu_button_opens_the_navigation(browser, live_server, owner):
    page = signed_in_page(browser, owner, live_server.url, PHONE)
    page.goto(f"{live_server.url}/", wait_until="load")
    menu = page.get_by_role("button", name="Menu")
    runs_link = page.locator(".topnav").get_by_role("link", name="Runs")
    expect(menu).to_be_visible()
    expect(menu).to_have_attribute("aria-expanded", "false")
    expect(runs_link).to_be_hidden()
    menu.click()
    expect(menu).to_have_attribute("aria-expanded", "true")
    expect(runs_link).to_be_visible()
    assert overflow(page)["scroll"] <= PHONE["width"]
    runs_link.click()
    expect(page).to_have_url(f"{live_server.url}/runs/")
    # Escape closes it again; on a wide screen there is no menu button, the links are there.
    page.get_by_role("button", name="Menu").click()
    page.keyboard.press("Escape")
    expect(page.get_by_role("button", name="Menu")).to_have_attribute("aria-expanded", "false")
    page.set_viewport_size(DESKTOP)
    expect(page.get_by_role("button", name="Menu")).to_be_hidden()
    expect(page.locator(".topnav").get_by_role("link", name="Runs")).to_be_visible()


CHART_PAGES = {
    "run": "#chart-reward .main-svg",
    "compare": ".js-plotly-plot .main-svg",
    "tier evaluation": "#tier-chart .main-svg",
}


def tier_evaluation(run: Run) -> str:
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
    return f"/tier-evaluations/{evaluation.pk}/"


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_the_chart_pages_log_no_console_error(browser, live_server, owner, run, viewport):
    page = signed_in_page(browser, owner, live_server.url, viewport)
    errors: list[str] = []
    # The test server speaks no websocket: the page says so once and polls instead (uvicorn does).
    page.on(
        "console",
        lambda message: (
            message.type == "error"
            and not message.text.startswith("WebSocket connection to")
            and errors.append(message.text)
        ),
    )
    page.on("pageerror", lambda error: errors.append(str(error)))
    paths = main_pages(run, owner) | {"tier evaluation": tier_evaluation(run)}
    for name, drawn in CHART_PAGES.items():
        page.goto(f"{live_server.url}{paths[name]}", wait_until="load")
        expect(page.locator(drawn).first).to_be_visible()
        page.locator(drawn).first.hover()  # the hover label and the mode bar draw on demand
    assert errors == []


@pytest.fixture
def served_static(settings) -> Iterator[str]:
    """The static files as `make up` serves them: collected (hashed names, .gz and .br copies, a
    manifest) and served by whitenoise inside Django, not by the test server's own static handler.
    Only the project's files are collected (the admin's and the API docs' would take a minute)."""
    settings.STATIC_ROOT = tempfile.mkdtemp(prefix="static-")
    call_command(
        "collectstatic",
        interactive=False,
        verbosity=0,
        ignore_patterns=["admin", "drf_spectacular_sidecar", "rest_framework"],
    )
    server = LiveServerThread("127.0.0.1", lambda app: app)  # no static handler: whitenoise serves
    server.daemon = True
    server.start()
    server.is_ready.wait()
    if server.error:
        raise server.error
    yield f"http://127.0.0.1:{server.port}"
    server.terminate()


def transferred(page: Page, url: str) -> dict[str, int]:
    """Bytes over the wire (headers and compressed bodies) of one visit, by URL (a URL asked for
    twice counts twice)."""
    session = page.context.new_cdp_session(page)
    session.send("Network.enable")
    urls: dict[str, str] = {}
    sizes: dict[str, int] = {}

    def finished(event: dict) -> None:
        name = urls.get(event["requestId"], "?")
        sizes[name] = sizes.get(name, 0) + int(event["encodedDataLength"])

    session.on(
        "Network.requestWillBeSent",
        lambda event: urls.__setitem__(event["requestId"], event["request"]["url"]),
    )
    session.on("Network.loadingFinished", finished)
    page.goto(url, wait_until="networkidle")
    expect(page.locator("#chart-reward .main-svg").first).to_be_visible()
    session.detach()
    return sizes


def test_the_run_page_is_light_on_a_first_visit_and_lighter_on_a_second(browser, served_static, owner, run):
    page = signed_in_page(browser, owner, served_static, DESKTOP)
    url = f"{served_static}/runs/{run.pk}/"
    first = transferred(page, url)
    assert sum(first.values()) < 1_500_000, first
    scripts = [name for name in first if "/static/vendor/plotly-basic" in name]
    fingerprinted = re.compile(r"\.[0-9a-f]{12}\.js$")
    assert scripts and all(fingerprinted.search(name) for name in scripts), scripts
    response = page.request.get(scripts[0], headers={"Accept-Encoding": "br, gzip"})
    assert response.headers["content-encoding"] in ("br", "gzip")
    assert "immutable" in response.headers["cache-control"]
    assert int(response.headers["cache-control"].split("max-age=")[1].split(",")[0]) >= 31_536_000
    second = transferred(page, url)
    assert sum(second.values()) < 100_000, second
    print(f"run page: first visit {sum(first.values())} B, second {sum(second.values())} B")

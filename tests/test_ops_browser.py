"""The operations page in headless Chromium (issue 26): it refreshes itself, so a worker that stops
beating turns "gone" on an open page, with no console error (CSP included)."""

import os

import pytest
from playwright.sync_api import expect

from ops.heartbeats import ALIVE_KEY, WorkerBeat, redis_client
from tests.conftest import make_project
from tests.test_ui_browser import browser, open_as  # noqa: F401 - fixtures

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # see tests/test_browser.py
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def heartbeats():
    client = redis_client()
    for key in client.scan_iter("flywheel:ops:*"):
        client.delete(key)
    yield client
    for key in client.scan_iter("flywheel:ops:*"):
        client.delete(key)


def test_an_open_operations_page_shows_a_worker_go_without_a_reload(
    open_as,  # noqa: F811
    django_user_model,
    heartbeats,
):
    owner = django_user_model.objects.create_user(username="ops-owner", password="pw-123456")
    make_project(owner, name="ops-project")
    name = "rollout@browser-host"
    WorkerBeat(name=name, queues=["rollout"], concurrency=2, pool="prefork", tasks=list).beat(heartbeats)

    page = open_as(owner, "/")
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.get_by_role("link", name="Operations").click()
    row = page.locator(f'#ops-workers tr[data-worker="{name}"]')
    expect(row).to_have_attribute("data-state", "alive")
    expect(row.locator(".badge")).to_have_text("alive")
    expect(page.locator('#ops-queues tr[data-queue="rollout"] td').nth(3)).to_have_text("1")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "on")

    heartbeats.delete(ALIVE_KEY.format(name=name))  # what a killed worker's silence does, at once
    expect(row).to_have_attribute("data-state", "gone")
    expect(row.locator(".badge")).to_have_text("gone")
    expect(page.locator('#ops-queues tr[data-queue="rollout"] .badge')).to_have_text("no worker")
    assert errors == []

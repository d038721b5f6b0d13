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
from tests.test_browser import CHROMIUM
from tests.test_live_browser import build_run

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
    expect(cell.locator(".main-svg").first).to_have_attribute(
        "width", str(round(cell.evaluate("node => node.clientWidth")))
    )


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

"""`make screenshots`: the run page, the compare page, a trajectory and a review queue on a desktop
(1,400×900) and a phone (390×844), light and dark, and the phone's open menu, written to
docs/screenshots/ (linked from the README).

Not part of `make test` (the file name does not match test_*.py): run it explicitly. It builds a
small made-up record (two runs with 40 steps of metrics, trajectories with steps and tokens, a
review queue) in the test database and drives headless Chromium over the live server.
"""

import math
import os
from pathlib import Path

import pytest
from django.test import Client
from playwright.sync_api import expect, sync_playwright

from reviews import services as review_services
from runs import lifecycle
from runs.models import Checkpoint, MetricPoint, Run, Trajectory, TrajectoryStep
from tests.test_browser import CHROMIUM
from tests.test_live_browser import build_run

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # see tests/test_browser.py
OUT = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
SIZES = {1400: 900, 390: 844}
SCHEMES = ("light", "dark")
STEPS = range(1, 41)


def curves(run: Run, shift: float) -> None:
    """Plausible training curves: reward rising with noise, KL growing, loss falling."""
    values = {
        "reward/mean": lambda s: min(
            1.0, 0.15 + shift + 0.6 * (1 - math.exp(-s / 14)) + 0.06 * math.sin(s * 1.7)
        ),
        "reward/min": lambda s: 0.0,
        "reward/max": lambda s: 1.0,
        "reward/std": lambda s: 0.3 - 0.004 * s,
        "reward/tests": lambda s: min(1.0, 0.1 + shift + 0.55 * (1 - math.exp(-s / 12))),
        "heldout/reward": lambda s: 0.2 + shift + 0.5 * (1 - math.exp(-s / 18)),
        "heldout/pass_rate": lambda s: 0.1 + shift + 0.45 * (1 - math.exp(-s / 18)),
        "train/pass_rate": lambda s: 0.12 + shift + 0.5 * (1 - math.exp(-s / 14)),
        "learner/kl": lambda s: 0.002 * s * (1 + shift),
        "learner/loss": lambda s: 0.9 * math.exp(-s / 20) + 0.05 * math.sin(s),
        "episodes/response_tokens": lambda s: 60 - 0.5 * s,
        "episodes/errored_rate": lambda s: 0.02 if s % 9 else 0.1,
    }
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, name=name, step=step, value=value(step))
        for step in STEPS
        for name, value in values.items()
    )
    Run.objects.filter(pk=run.pk).update(
        learner_step=40, policy_version=40, sandbox_cpu_seconds=812.4 + shift
    )


def trajectory(run: Run, index: int, text: str, reward: float) -> Trajectory:
    item = run.task_set_version.items.order_by("position")[index % 6]
    made = Trajectory.objects.create(
        run=run,
        item=item,
        policy_version=12,
        outcome="scored",
        reward=reward,
        advantage=reward - 0.5,
        completion_text=text,
        components={"exact": reward},
        learned_in_step=13,
        completion_tokens=6,
        step_count=1,
    )
    tokens = ["The", " answer", " is", " ", text[-2], "."]
    data = {
        "prompt": item.text,
        "completion": text,
        "tokens": tokens,
        "token_ids": list(range(100, 106)),
        "logprobs": [-0.05, -0.3, -0.1, -1.9, -0.6 if reward else -4.2, -0.02],
        "finish_reason": "stop",
        "reward": reward,
    }
    payload, size = TrajectoryStep.pack(data)
    TrajectoryStep.objects.create(trajectory=made, index=0, kind="completion", payload=payload, raw_size=size)
    return made


@pytest.mark.django_db(transaction=True)
def test_screenshots(live_server, django_user_model):
    owner = django_user_model.objects.create_user(username="ada", password="pw-123456")
    reviewer = django_user_model.objects.create_user(username="rev", password="pw-123456")
    first = build_run(owner, reviewer)
    second = lifecycle.run_create(
        request=lifecycle.run_request_from(first, name="lr-3e-6", hyperparameters={"group_size": 8}), by=owner
    )
    Run.objects.filter(pk=first.pk).update(status=Run.Status.SUCCEEDED)
    Run.objects.filter(pk=second.pk).update(status=Run.Status.RUNNING)
    curves(first, 0.0)
    curves(second, 0.08)
    for step in (10, 20, 30, 40):
        Checkpoint.objects.create(run=first, step=step, policy_version=step, path=f"ckpt-{step}")
    made = [
        trajectory(first, i, text, reward)
        for i, (text, reward) in enumerate(
            [
                ("The answer is 0.", 1.0),
                ("The answer is 2.", 1.0),
                ("The answer is 5.", 0.0),
                ("It is 6.", 1.0),
            ]
        )
    ]
    review_services.review_save(trajectory=made[0], by=owner, label="good")
    review_services.review_save(trajectory=made[2], by=reviewer, label="bad")
    queue = review_services.queue_create(run=first, name="low reward", filters={}, by=owner)
    client = Client()
    client.force_login(owner)
    cookie = {"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}
    pages = {
        "run": (f"/runs/{first.pk}/", "#chart-errored .main-svg"),
        "compare": (f"/runs/compare/?runs={first.pk},{second.pk}", "#compare-train-pass_rate .main-svg"),
        "trajectory": (f"/trajectories/{made[2].pk}/?queue={queue.pk}", "#replay-step .token"),
        "review-queue": (f"/review-queues/{queue.pk}/", "#queue-items"),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    for stale in OUT.glob("*.png"):  # sizes no longer taken must not linger beside the new ones
        stale.unlink()
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
        for width, height in SIZES.items():
            for scheme in SCHEMES:
                context = browser.new_context(
                    viewport={"width": width, "height": height}, color_scheme=scheme
                )
                context.add_cookies([cookie])
                page = context.new_page()
                page.set_default_timeout(20_000)
                for name, (path, ready) in pages.items():
                    page.goto(live_server.url + path)
                    expect(page.locator(ready).first).to_be_attached()
                    if name == "trajectory":  # the replay, its tokens coloured, under the review form
                        page.locator("#review").evaluate("node => window.scrollTo(0, node.offsetTop - 8)")
                    page.screenshot(path=str(OUT / f"{name}-{width}-{scheme}.png"))
                if width < 860:  # the navigation behind the phone's Menu button, opened
                    page.get_by_role("button", name="Menu").click()
                    expect(page.locator(".topnav")).to_be_visible()
                    page.screenshot(path=str(OUT / f"menu-{width}-{scheme}.png"))
                context.close()
        browser.close()
    assert len(list(OUT.glob("*.png"))) == 18

"""The live run page keeps every part that shows run state current (issue 26): the metrics table,
the Train-on-reviews card, the action buttons as the status changes, and event times that tick;
and it asks for the metrics once on load."""

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.test_browser import CHROMIUM

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)", allow_module_level=True)

from channels.testing import ChannelsLiveServerTestCase  # noqa: E402
from django.test import override_settings  # noqa: E402
from playwright.sync_api import expect  # noqa: E402

from runs import lifecycle  # noqa: E402
from runs.models import Checkpoint, MetricPoint, Run  # noqa: E402
from tests.conftest import make_user  # noqa: E402
from tests.test_browser import FAST_HASHERS, chromium_page, sign_in  # noqa: E402
from tests.test_live_browser import agent_trajectory, build_run, emit  # noqa: E402

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # see tests/test_browser.py

pytestmark = pytest.mark.browser
S = Run.Status

# Records, at each change of the status badge, whether a Resume button was on show then.
WATCH_STATUS = """() => {
  window.__seen = [];
  const badge = document.getElementById("run-status");
  new MutationObserver(() => {
    const resume = document.querySelector('#run-actions [data-action="resume"]');
    const shown = Boolean(resume && resume.offsetParent !== null);
    window.__seen.push([badge.textContent, shown]);
  }).observe(badge, { childList: true, characterData: true, subtree: true });
}"""


def metric_cells(page, name: str):
    return page.locator("#metrics tr", has_text=name).locator("td")


def checkpoint_saved(run: Run, step: int) -> None:
    Checkpoint.objects.create(run=run, step=step, policy_version=step, path=f"ckpt-{step}")
    lifecycle.run_event(run, "checkpoint", f"checkpoint at step {step}", data={"step": step})


@override_settings(PASSWORD_HASHERS=FAST_HASHERS)
class LiveRunPageTest(ChannelsLiveServerTestCase):
    def test_every_part_of_the_run_page_follows_the_run(self):
        owner = make_user("ada")
        run = build_run(owner)
        lifecycle.run_transition(run, allowed=(S.QUEUED,), to=S.PAUSED)
        metric_requests = []
        with chromium_page() as page:
            page.clock.install()
            page.on(
                "request",
                lambda request: metric_requests.append(request.url) if "/metrics" in request.url else None,
            )
            page.goto(f"{self.live_server_url}/runs/{run.pk}/")
            sign_in(page, "ada")
            expect(page.locator("#live-status")).to_have_text("live")
            assert len(metric_requests) == 1, metric_requests
            expect(page.locator("#train-on-reviews")).to_contain_text("No checkpoint yet")
            page.evaluate(WATCH_STATUS)
            with ThreadPoolExecutor(max_workers=1) as pool:
                pool.submit(emit, run, 3).result()
                page.clock.fast_forward(2500)  # the table is re-rendered at most every 2 s
                expect(metric_cells(page, "reward/mean").nth(2)).to_have_text("3")
                for step in (4, 8):
                    pool.submit(emit, run, step).result()
                page.clock.fast_forward(2500)
                row = metric_cells(page, "reward/mean")
                expect(row.nth(2)).to_have_text("8")
                expect(row.nth(5)).to_have_text("3")  # a count, as an integer
                expect(metric_cells(page, "reward/max").nth(1)).to_have_text("1")

                pool.submit(checkpoint_saved, run, 8).result()
                expect(page.locator("#checkpoints tr[data-step='8']")).to_be_visible()
                expect(page.locator("#train-on-reviews")).not_to_contain_text("No checkpoint yet")
                expect(page.locator("#train-on-reviews")).to_contain_text("checkpoint 8")

                # Resumed elsewhere: the status reads queued and no Resume button shows with it.
                expect(page.locator('#run-actions [data-action="resume"]')).to_be_visible()
                pool.submit(lifecycle.run_transition, run, allowed=(S.PAUSED,), to=S.QUEUED).result()
                expect(page.locator("#run-status")).to_have_text("queued")
                expect(page.locator('#run-actions [data-action="pause"]')).to_be_visible()
                expect(page.locator('#run-actions [data-action="resume"]')).to_have_count(0)
                seen = page.evaluate("window.__seen")
                assert ["queued", True] not in seen, seen

            # Event times read relative and keep ticking.
            first = page.locator("#events-body tr").first.locator("time")
            expect(first).to_have_text(re.compile(r"^(just now|[0-9] s ago)$"))  # the clock ran 5 s ahead
            page.clock.fast_forward(60_000)
            expect(first).to_have_text("1 min ago")
            page.clock.fast_forward(120_000)
            expect(first).to_have_text("3 min ago")
        assert len(metric_requests) == 1, metric_requests


def boxes_overlap(a: dict, b: dict) -> bool:
    return not (
        a["x"] + a["width"] <= b["x"]
        or b["x"] + b["width"] <= a["x"]
        or a["y"] + a["height"] <= b["y"]
        or b["y"] + b["height"] <= a["y"]
    )


@override_settings(PASSWORD_HASHERS=FAST_HASHERS)
class ChartsReadTest(ChannelsLiveServerTestCase):
    def test_compare_charts_are_grouped_titled_and_rates_read_as_percent(self):
        owner = make_user("ada")
        run = build_run(owner)
        values = {
            "zeta/odd_one": [1, 2],
            "learner/kl": [0.1, 0.2],
            "heldout/pass_rate": [0.438, 0.728],
            "reward/std": [0.1, 0.1],
            "reward/mean": [0.2, 0.4],
        }
        for name, points in values.items():
            for step, value in enumerate(points, start=1):
                MetricPoint.objects.create(run=run, step=step, name=name, value=value)
        trajectory = agent_trajectory(run)
        with chromium_page() as page:
            page.goto(f"{self.live_server_url}/runs/compare/?runs={run.pk}")
            sign_in(page, "ada")
            cells = page.locator("#compare-charts .chart-cell")
            expect(cells).to_have_count(5)
            order = [cells.nth(i).get_attribute("data-metric") for i in range(5)]
            assert order == ["reward/mean", "reward/std", "heldout/pass_rate", "learner/kl", "zeta/odd_one"]
            expect(page.locator("#compare-charts .chart-group")).to_have_text(
                ["Reward", "Held-out", "Learner", "Other"]
            )
            plot = page.locator("#compare-heldout-pass_rate")
            expect(plot).to_have_attribute("data-runs", "1")
            axis = page.evaluate(
                "document.getElementById('compare-heldout-pass_rate')._fullLayout.yaxis.tickformat"
            )
            assert axis == ".0%"
            ticks = page.locator("#compare-heldout-pass_rate .ytick text").all_text_contents()
            assert ticks == ["0%", "25%", "50%", "75%", "100%"], ticks
            title = plot.locator(".gtitle")
            expect(title).to_have_text("Held-out pass rate")
            button = page.locator("[data-metric='heldout/pass_rate'] .chart-full-toggle")
            assert not boxes_overlap(title.bounding_box(), button.bounding_box())

            # The dry-run's output column is wide enough to read code (not ~70 px).
            rule = run.reward_rule_version.rule
            page.goto(f"{self.live_server_url}/reward-rules/{rule.pk}/dry-run/")
            page.get_by_label("Items (JSONL)").fill(
                json.dumps({"id": "q1", "prompt": "1+1?", "reference": "2"})
            )
            code = "def add(a, b):\n    return a + b  # a long line of code that would wrap letter by letter"
            page.get_by_label("Samples (JSONL or a JSON array)").fill(json.dumps([code]))
            page.get_by_role("button", name="Score").click()
            output = page.locator("#dry-run-results .output-cell").first
            expect(output).to_be_visible()
            assert output.bounding_box()["width"] >= 380, output.bounding_box()
            expect(page.locator("#dry-run-results th").nth(0)).to_have_css("text-transform", "none")

            # The replay says it is loading while a step is on its way.
            held = []
            page.route("**/steps?index=0*", lambda route: held.append(route))
            page.goto(f"{self.live_server_url}/trajectories/{trajectory.pk}/")
            expect(page.locator("#replay-step .replay-loading")).to_have_text("Loading step 0…")
            expect(page.locator("#replay-step")).to_have_attribute("aria-busy", "true")
            page.wait_for_function("() => true")
            assert held, "the first step was asked for"
            held[0].continue_()
            expect(page.locator("#replay-step .observation")).to_have_text("Write add(a, b).")
            expect(page.locator("#replay-step")).not_to_have_attribute("aria-busy", "true")

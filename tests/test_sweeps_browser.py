"""The sweep page in headless Chromium: the parallel-coordinates chart draws one line per trial
that reported the objective (a stopped-early trial included, a trial without a figure left out),
and the best run is named with its figure and settings."""

# The fixtures imported are test parameters here, not redefinitions:
# ruff: noqa: F811

import os

import pytest
from playwright.sync_api import expect

from sweeps import driver
from sweeps.models import SweepTrial
from tests.run_fixtures import lab  # noqa: F401
from tests.test_sweeps import LR, finish, make_sweep, report, trials
from tests.test_ui_browser import browser, open_as  # noqa: F401

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # see tests/test_browser.py
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]


def test_the_sweep_chart_draws_a_line_per_trial_and_the_page_names_the_best_run(lab, open_as):
    sweep = make_sweep(
        lab,
        [{"name": LR, "values": [1e-4, 3e-4, 1e-3, 3e-3]}],
        concurrency=4,
        early_stopping="asha",
        min_steps=1,
        reduction_factor=2,
    )
    driver.sweep_advance(sweep_id=sweep.pk)
    first, best, stopped, silent = trials(sweep)
    report(stopped, {0: 0.1, 1: 0.2})
    finish(first, {0: 0.1, 1: 0.4, 4: 0.5})
    finish(best, {0: 0.1, 1: 0.6, 4: 0.75})
    driver.sweep_advance(sweep_id=sweep.pk)
    states = {t.number: t.state for t in trials(sweep)}
    assert states == {
        first.number: SweepTrial.State.COMPLETE,
        best.number: SweepTrial.State.COMPLETE,
        stopped.number: SweepTrial.State.PRUNED,
        silent.number: SweepTrial.State.RUNNING,  # no figure yet: no line
    }

    page = open_as(lab["owner"], f"/sweeps/{sweep.pk}/")
    chart = page.locator("#sweep-chart")
    expect(chart).to_have_attribute("data-trials", "3")
    # Plotly draws each scatter trace as a g.trace in the chart's scatter layer: one per trial.
    expect(chart.locator(".scatterlayer .trace")).to_have_count(3)
    names = page.evaluate("Array.from(document.getElementById('sweep-chart').data, (t) => t.name)")
    assert sorted(names) == sorted(f"trial {t.number}" for t in (first, best, stopped))
    axes = page.evaluate("document.getElementById('sweep-chart').layout.xaxis.ticktext")
    assert axes == [LR, "heldout/pass_rate"]

    panel = page.locator("#sweep-best")
    best.run.refresh_from_db()
    expect(panel.locator("a")).to_have_text(best.run.name)
    expect(panel.locator("a")).to_have_attribute("href", f"/runs/{best.run_id}/")
    expect(panel).to_contain_text("heldout/pass_rate 0.750 at step 4")
    expect(panel).to_contain_text(f"{LR} = {best.params[LR]}")
    expect(panel).to_contain_text("1 stopped early")

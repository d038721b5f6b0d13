"""The launch form shows the estimate before Launch is pressed (headless Chromium): what earlier
runs of the tier recorded, scaled to the form's settings, asked again when a setting changes."""

# The fixtures imported are test parameters here, not redefinitions:
# ruff: noqa: F811

import os

import pytest
from django.conf import settings
from playwright.sync_api import expect

from runs.models import Run
from tests.run_fixtures import lab  # noqa: F401
from tests.test_cost_estimates import recorded_run
from tests.test_ui_browser import browser, open_as  # noqa: F401

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # see tests/test_browser.py
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]


def test_the_launch_form_shows_the_estimate_and_follows_the_settings(lab, open_as):
    recorded_run(lab, batch=4, group=2, device=[36.0] * 4)  # 8 units a step: 4.5 device-seconds a unit
    page = open_as(lab["owner"], f"/projects/{lab['project'].pk}/runs/new/")
    page.select_option("#id_task_set_version", str(lab["version"].pk))
    page.select_option("#id_reward_rule_version", str(lab["rule"].versions.get().pk))
    page.select_option("#id_tier", str(lab["tier"].pk))
    page.fill("#id_max_steps", "100")
    page.fill("#id_hp_batch_size", "8")
    page.fill("#id_hp_group_size", "4")  # 32 units a step, 100 steps: 3,200 × 4.5 s = 4 device-hours
    page.locator("#id_hp_group_size").dispatch_event("change")
    estimate = page.locator("#estimate-text")
    expect(estimate).to_contain_text("4.0 device-hours (4.0–4.0)")
    expect(estimate).to_contain_text("scaled from 4 recorded steps of 1 earlier run(s)")
    page.fill("#id_hp_batch_size", "16")
    page.locator("#id_hp_batch_size").dispatch_event("change")
    expect(estimate).to_contain_text("8.0 device-hours")


def test_the_launch_form_says_what_it_needs_and_why_there_is_no_estimate(lab, open_as):
    page = open_as(lab["owner"], f"/projects/{lab['project'].pk}/runs/new/")
    estimate = page.locator("#estimate-text")
    expect(estimate).to_contain_text("Choose a task set version, a reward rule version and a tier")
    page.select_option("#id_task_set_version", str(lab["version"].pk))
    page.select_option("#id_reward_rule_version", str(lab["rule"].versions.get().pk))
    page.select_option("#id_tier", str(lab["tier"].pk))
    expect(estimate).to_contain_text("has recorded two steps yet")


def test_without_a_basis_the_form_offers_calibrate_and_follows_the_calibration(lab, open_as):
    page = open_as(lab["owner"], f"/projects/{lab['project'].pk}/runs/new/")
    page.select_option("#id_task_set_version", str(lab["version"].pk))
    page.select_option("#id_reward_rule_version", str(lab["rule"].versions.get().pk))
    page.select_option("#id_tier", str(lab["tier"].pk))
    estimate, button = page.locator("#estimate-text"), page.locator("#estimate-calibrate")
    expect(estimate).to_contain_text("has recorded two steps yet")
    expect(button).to_be_visible()
    button.click()
    steps = settings.FLYWHEEL_CALIBRATION_STEPS
    expect(estimate).to_contain_text(f"of tier {lab['tier'].name} (grpo) is queued, at step 0 of {steps}")
    run = Run.objects.get(calibration=True)  # launched by the click, and only once
    expect(estimate).to_contain_text(f"calibration run {run.pk} of tier")
    expect(button).to_be_hidden()
    assert (run.max_steps, run.created_by) == (steps, lab["owner"])

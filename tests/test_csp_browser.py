"""The Content-Security-Policy in a real browser: every kind of page loads with no violation, and
what its scripts draw (Plotly charts, the replay, the rule editor, the API docs) is there."""

import json
import os
from pathlib import Path

import pytest

from tests.test_browser import CHROMIUM

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)", allow_module_level=True)

from playwright.sync_api import expect  # noqa: E402

from runs.models import MetricPoint  # noqa: E402
from tests.conftest import make_user  # noqa: E402
from tests.test_browser import chromium_page, sign_in  # noqa: E402
from tests.test_live_browser import agent_trajectory, build_run  # noqa: E402

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # see tests/test_browser.py

pytestmark = pytest.mark.browser
# Registered before any page script runs (Playwright injects it outside the page's policy).
RECORD_VIOLATIONS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  const element = ((e.target && e.target.outerHTML) || "").slice(0, 80);
  window.__csp.push(`${e.violatedDirective} ${e.blockedURI} ${e.sample || ""} ${element}`);
});
"""


def violations(page) -> list[str]:
    return page.evaluate("window.__csp")


def test_every_kind_of_page_runs_under_the_policy_without_a_violation(live_server, transactional_db):
    owner = make_user("ada")
    owner.is_staff = owner.is_superuser = True
    owner.save()
    run = build_run(owner)
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, name=name, step=step, value=step / 10)
        for step in range(1, 6)
        for name in ("reward/mean", "reward/min", "reward/max")
    )
    trajectory = agent_trajectory(run)
    rule = run.reward_rule_version.rule

    with chromium_page() as page:
        page.add_init_script(RECORD_VIOLATIONS)
        response = page.goto(f"{live_server.url}/accounts/login/")
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "object-src 'none'" in policy
        assert "frame-ancestors 'none'" in policy and "unsafe-inline" not in policy
        sign_in(page, "ada")
        checks = [
            (f"/runs/{run.pk}/", "#chart-reward .main-svg"),
            (f"/runs/compare/?runs={run.pk}", ".js-plotly-plot .main-svg"),
            (f"/trajectories/{trajectory.pk}/", "#replay"),
            ("/playground/", "#playground"),
            (f"/reward-rules/{rule.pk}/edit/", "form"),
            ("/api/v1/docs/", ".swagger-ui .information-container"),
            ("/admin/", "#content"),
            ("/admin/auth/user/add/", "form"),
        ]
        for path, drawn in checks:
            page.goto(f"{live_server.url}{path}", wait_until="load")
            expect(page.locator(drawn).first).to_be_visible()
            assert violations(page) == [], (path, violations(page))
        # The nonce'd sheet is where Plotly's own rules went, and the page has no other inline style.
        page.goto(f"{live_server.url}/runs/{run.pk}/", wait_until="load")
        expect(page.locator("#chart-reward .main-svg").first).to_be_visible()
        rules = page.evaluate("document.getElementById('plotly.js-style-global').sheet.cssRules.length")
        assert rules > 10
        assert violations(page) == []


def test_an_injected_inline_script_is_refused_by_the_policy(live_server, transactional_db):
    make_user("ada")
    with chromium_page() as page:
        page.add_init_script(RECORD_VIOLATIONS)
        page.goto(f"{live_server.url}/accounts/login/")
        sign_in(page, "ada")
        # As if model output slipped into the page as markup: the policy, not only escaping, stops it.
        page.evaluate(
            """() => { const s = document.createElement("script");
                       s.textContent = "window.__ran = 1"; document.body.appendChild(s); }"""
        )
        assert page.evaluate("window.__ran") is None
        assert any(entry.startswith("script-src") for entry in violations(page)), json.dumps(violations(page))

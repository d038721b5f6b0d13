"""The playground in a real browser against the stack's web server: one prompt to a tier and a
checkpoint side by side, streamed, under the Content-Security-Policy; model output and names stay
text; the page lists only the caller's models."""

import os
from pathlib import Path

import pytest

from tests.test_browser import CHROMIUM

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)", allow_module_level=True)

from django.conf import settings  # noqa: E402
from django.test import Client  # noqa: E402
from playwright.sync_api import expect  # noqa: E402

from inference.decoding import decode, tier_prepare  # noqa: E402
from inference.policy import policy_load  # noqa: E402
from inference.settings import TierSettings  # noqa: E402
from runs.models import Run  # noqa: E402
from runs.run_store import policy_dir  # noqa: E402
from tests.conftest import make_user  # noqa: E402
from tests.run_harness import tiny_model, worker_env  # noqa: E402, F401  (a fixture)
from tests.serving_fixtures import STEP, trained_setup  # noqa: E402
from tests.test_browser import chromium_page  # noqa: E402
from tests.test_csp_browser import RECORD_VIOLATIONS, violations  # noqa: E402
from tests.web_server import WebServer  # noqa: E402

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # see tests/test_browser.py

pytestmark = pytest.mark.browser
HOSTILE = '<img src=x onerror="document.title=1">'
PROMPT = "add 3 to x"


def chat_completion(source, config: dict, max_new_tokens: int):
    settings = TierSettings.from_config(config).with_(temperature=0.0, max_new_tokens=max_new_tokens)
    tier = tier_prepare(policy_load(source), settings)
    return decode(tier, [tier.prompt_text(PROMPT)], settings)[0]


def test_the_playground_streams_one_prompt_to_a_tier_and_a_checkpoint_side_by_side(
    transactional_db,
    tiny_model,  # noqa: F811
    tmp_path,
):
    setup = trained_setup(tiny_model)
    run, tier, owner = setup["run"], setup["tier"], setup["owner"]
    Run.objects.filter(pk=run.pk).update(name=HOSTILE)  # a name is untrusted text too
    checkpoint_id, tier_id = f"run-{run.pk}-step-{STEP}", f"tier-{tier.pk}"
    browser = Client()
    browser.force_login(owner)  # the server's hasher is not the tests' fast one: sign in by session
    expected = {
        tier_id: chat_completion(tiny_model, run.tier_config, 8),
        checkpoint_id: chat_completion(policy_dir(run.pk, STEP), run.tier_config, 8),
    }
    assert expected[tier_id].text != expected[checkpoint_id].text

    with WebServer(worker_env(), tmp_path / "web.log") as server, chromium_page() as page:
        page.add_init_script(RECORD_VIOLATIONS)
        cookie = browser.cookies[settings.SESSION_COOKIE_NAME].value
        page.context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": cookie, "url": server.url}])
        page.goto(f"{server.url}/playground/", wait_until="load")
        expect(page.get_by_role("heading", name="Playground")).to_be_visible()
        expect(page.get_by_label(f"{HOSTILE} @ step {STEP} {checkpoint_id}")).to_be_checked()
        expect(page.get_by_label(f"rollout {tier_id}")).to_be_checked()
        page.get_by_label("Prompt", exact=True).fill(PROMPT)
        page.get_by_label("Max tokens").fill("8")
        page.get_by_label("Temperature").fill("0")
        page.get_by_role("button", name="Send to each").click()
        for model, completion in expected.items():
            pane = page.locator(f'.playground-pane[data-model="{model}"]')
            expect(pane).to_have_attribute("data-finished", completion.finish_reason, timeout=60_000)
            assert pane.locator(".pane-output").text_content() == completion.text
            expect(pane.locator(".pane-status")).to_contain_text(f"{len(completion.token_ids)} tokens")
        checkpoint_pane = page.locator(f'.playground-pane[data-model="{checkpoint_id}"]')
        expect(checkpoint_pane.locator(".pane-name")).to_have_text(f"{HOSTILE} @ step {STEP}")
        assert page.locator(".playground-pane img").count() == 0
        assert page.title() != "1"
        assert violations(page) == []
        page.screenshot(path=str(tmp_path / "playground.png"), full_page=True)


def test_the_playground_lists_only_the_callers_models(transactional_db, tiny_model):  # noqa: F811
    setup = trained_setup(tiny_model)
    outsider = make_user("playground-outsider")
    client = Client()
    client.force_login(outsider)
    body = client.get("/playground/").content.decode()
    assert f"tier-{setup['tier'].pk}" not in body
    assert "No tier or checkpoint to try yet" in body
    client.force_login(setup["owner"])
    body = client.get(f"/playground/?models=tier-{setup['tier'].pk}").content.decode()
    assert f'value="tier-{setup["tier"].pk}" data-name="rollout" checked' in body
    assert f'value="run-{setup["run"].pk}-step-{STEP}" data-name="Adder GRPO @ step {STEP}">' in body
    assert Client().get("/playground/").status_code == 302  # signed out: to the sign-in page

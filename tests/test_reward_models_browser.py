"""A reward-model version's page in headless Chromium follows its training live: it polls the
version's progress and shows each new step's epoch and loss, held-out pair accuracy at each epoch's
end, the restarts, and the chart; when the training ends it shows the final accuracies."""

import os

import pytest
from playwright.sync_api import expect

from projects import services as project_services
from reward_models.models import RewardModel, RewardModelVersion
from tests.conftest import make_project
from tests.test_ui_browser import browser, open_as, owner

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # see tests/test_browser.py
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
__all__ = ["browser", "open_as", "owner"]


def step(number: int, loss: float, heldout: float | None = None, restart: int = 0) -> dict:
    entry = {"step": number, "epoch": number / 4, "loss": loss, "accuracy": 0.5, "margin": 0.1}
    entry["restart"] = restart
    return entry | ({"heldout_accuracy": heldout} if heldout is not None else {})


def test_the_version_page_follows_a_training_live_to_its_end(owner, open_as):
    project = make_project(owner)
    task_set = project_services.task_set_create(project=project, name="pairs", by=owner)
    line = b'{"id": "a", "kind": "answer", "prompt": "p", "reference": "r"}\n'
    pairs = project_services.task_set_import(
        task_set=task_set, stream=[line], file_format="jsonl", by=owner
    ).version
    reward_model = RewardModel.objects.create(project=project, name="prefs")
    version = RewardModelVersion.objects.create(
        reward_model=reward_model,
        number=1,
        task_set_version=pairs,
        status="running",
        hyperparameters={"epochs": 2, "batch_size": 8},
        step=3,
        steps=8,
        train_pairs=32,
        heldout_pairs=8,
        base_heldout_accuracy=0.5,
        history=[step(1, 0.69), step(2, 0.61), step(3, 0.55)],
    )
    page = open_as(owner, f"/reward-model-versions/{version.pk}/")
    expect(page.locator("#progress-loss")).to_have_text("0.5500")
    expect(page.locator("#progress-epoch")).to_have_text("0.75 of 2")
    expect(page.locator("#rm-chart .main-svg").first).to_be_visible()  # Plotly drew it

    # The learner writes on: an epoch ends (held-out accuracy), it dies and resumes there.
    history = version.history + [step(4, 0.41, heldout=0.625), step(5, 0.38, restart=1)]
    RewardModelVersion.objects.filter(pk=version.pk).update(
        step=5, history=history, restarts=1, checkpoint_step=4
    )
    expect(page.locator("#version-steps")).to_have_text("5 of 8")
    expect(page.locator("#progress-loss")).to_have_text("0.3800")
    expect(page.locator("#progress-heldout")).to_have_text("0.625")
    expect(page.locator("#progress-restarts")).to_have_text("1 (checkpoint at step 4)")

    history += [step(6, 0.3, restart=1), step(7, 0.2, restart=1), step(8, 0.1, heldout=0.875, restart=1)]
    RewardModelVersion.objects.filter(pk=version.pk).update(
        step=8, history=history, status="succeeded", heldout_accuracy=0.875, train_accuracy=1.0
    )
    expect(page.locator("#version-status")).to_have_text("succeeded")
    expect(page.locator("#heldout-accuracy")).to_have_text("0.875")  # the page reloaded at the end
    expect(page.locator("#progress-epoch")).to_have_text("2.00 of 2")

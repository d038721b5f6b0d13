"""The reward-models part of a run's page (runs/run_page.py): the versions its rewards used."""

from typing import Any

from django.http import HttpRequest

from reward_models import selectors
from runs.models import Run


def run_reward_models_section(request: HttpRequest, run: Run) -> dict[str, Any]:
    return {"reward_model_uses": selectors.uses_of_run(run=run)}

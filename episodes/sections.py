"""The run page's episodes card (registered with runs.run_page): for a run whose episodes agents
outside Flywheel play, the model they call and how many episodes are in each state."""

from typing import Any

from django.http import HttpRequest

from episodes import selectors
from runs.learners import plays_external
from runs.models import Run


def run_episodes_section(request: HttpRequest, run: Run) -> dict[str, Any]:
    if not plays_external(run.method):
        return {}
    return {"run_episodes": {"model": f"run-{run.pk}", "counts": selectors.episode_counts(run=run)}}

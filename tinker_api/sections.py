"""The run page's Tinker card (registered with runs.run_page): for a run that is a Tinker API
model, the session driving it, its requests by state, the weights it saved, by path, and its
samples, recorded as traces for reviewers."""

from typing import Any

from django.http import HttpRequest

from runs.models import Run
from tinker_api import selectors


def run_tinker_section(request: HttpRequest, run: Run) -> dict[str, Any]:
    if run.method != "tinker":
        return {}
    model = selectors.model_of_run(run=run)
    if model is None:
        return {}
    return {
        "run_tinker": {
            "model": model,
            "session": model.session,
            "requests": selectors.request_counts(model=model),
            "weights": list(selectors.weights_of(model=model)),
            "samples": selectors.samples_recorded(run=run),
        }
    }

"""The Train on reviews card of a run's page: `{% load reviews_tags %}{% train_on_reviews run %}`.

A tag of the reviews app, so the run page carries one line for it and the counts are computed here.
"""

from typing import Any

from django import template

from reviews import training
from runs import selectors as run_selectors
from runs.models import Run

register = template.Library()


@register.inclusion_tag("reviews/_train_on_reviews.html", takes_context=True)
def train_on_reviews(context: template.Context, run: Run) -> dict[str, Any]:
    checkpoint = run_selectors.checkpoint_default(run)
    return {
        "run": run,
        "can_edit": context.get("can_edit", False),
        "checkpoint": checkpoint,
        "counts": training.training_counts(run=run),
        "default_steps": training.DEFAULT_MAX_STEPS,
        "csrf_token": context.get("csrf_token"),
    }

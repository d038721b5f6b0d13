"""The Train on reviews card of a run's page: `{% load reviews_tags %}{% train_on_reviews run %}`,
and, on the page of a run Train on reviews made (or of its control), its result against the control.

A tag of the reviews app, so the run page carries one line for it and the counts are computed here.
"""

from typing import Any

from django import template

from reviews import results, selectors, training
from runs import selectors as run_selectors
from runs.models import Run

register = template.Library()


@register.inclusion_tag("reviews/_train_on_reviews.html", takes_context=True)
def train_on_reviews(context: template.Context, run: Run) -> dict[str, Any]:
    checkpoint = run_selectors.checkpoint_default(run)
    made_by = selectors.review_training_of(run.pk)
    result = results.review_training_result(made_by) if made_by else None
    figures = [("reviews run", result["run"]), ("control", result["control"])] if result else []
    return {
        # The result against the control, on the page of the reviews run and of its control.
        "result": result,
        "figures": [(label, row) for label, row in figures if row],
        "is_control": made_by is not None and made_by.control_id == run.pk,
        "run": run,
        "can_edit": context.get("can_edit", False),
        "checkpoint": checkpoint,
        "counts": training.training_counts(run=run),
        "default_steps": training.DEFAULT_MAX_STEPS,
        "csrf_token": context.get("csrf_token"),
    }

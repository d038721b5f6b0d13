"""The run page's cost panel (registered with runs.run_page): the run's money and units by kind,
and its budget. The chart over steps is the run's `cost/total` metric in its live charts."""

from typing import Any

from django.http import HttpRequest

from costs import selectors
from runs.models import Run


def run_cost_section(request: HttpRequest, run: Run) -> dict[str, Any]:
    return {"run_cost": selectors.run_cost(run=run)}

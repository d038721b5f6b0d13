"""The cost parts of the pages: the run page's panel (registered with runs.run_page: the run's
money and units by kind, and its budget; the chart over steps is its `cost/total` metric among the
live charts) and the project page's card (registered with projects.sections: this month per
user and per run, against the monthly budget)."""

from typing import Any

from django.http import HttpRequest
from django.utils import timezone

from costs import selectors
from projects.models import Project
from runs.models import Run


def run_cost_section(request: HttpRequest, run: Run) -> dict[str, Any]:
    return {"run_cost": selectors.run_cost(run=run)}


def project_cost_section(request: HttpRequest, project: Project) -> dict[str, Any]:
    since = selectors.month_start(timezone.now())
    return {"project_cost": selectors.project_costs(project=project, since=since)}

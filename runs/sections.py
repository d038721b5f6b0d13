"""The runs app's sections of the project pages (projects/sections.py): the project's runs table
and tiers, the demo's state, and on the home page the methods the learner has."""

from typing import Any

from django.http import HttpRequest
from django.urls import reverse

from projects.models import Project
from runs import runs_table, selectors
from runs.demo import DEMO_FUNCTIONS
from runs.learners import launch_choices

RUNS_ON_PROJECT_PAGE = 50


def project_runs_section(request: HttpRequest, project: Project) -> dict[str, Any]:
    table = runs_table.table_context(
        selectors.runs_of(project=project),
        request.GET,
        action=reverse("project-detail", args=[project.pk]),
        show_project=False,
        limit=RUNS_ON_PROJECT_PAGE,
        positions=selectors.queue_positions(project_ids=[project.pk]),
    )
    return {
        "table": table,
        "run_count": project.runs.count(),
        "tiers": project.tiers.order_by("name"),
        "has_demo": project.task_sets.filter(name=DEMO_FUNCTIONS).exists(),
    }


def home_methods_section(request: HttpRequest) -> dict[str, Any]:
    # The methods a launch may name, from the registry: the page names no method it lacks.
    return {"methods": ", ".join(label for _, label in launch_choices())}

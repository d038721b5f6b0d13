"""Sweep pages: a project's sweeps, and one sweep with its trials (params, state, objective, cost),
its best run, a parallel-coordinates chart of params against the objective and, across base
models, each model's lift and cost; a cancel button for launchers. Roles as in REST: reading
needs VIEW, cancelling EDIT. The project page links here through its sections."""

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from core.callers import caller
from core.exceptions import StateError
from core.roles import Permission
from projects import selectors as project_selectors
from projects.models import Project
from projects.selectors import page_access
from sweeps import selectors, services


def project_sweeps_section(request: HttpRequest, project: Project) -> dict[str, Any]:
    return {"sweep_count": selectors.sweeps_of(project_id=project.pk).count()}


@login_required
@require_GET
def sweep_list(request: HttpRequest, project_id: int) -> HttpResponse:
    project = project_selectors.project_for(user=caller(request), project_id=project_id)
    context = page_access(user=caller(request), project=project) | {
        "sweeps": selectors.sweeps_of(project_id=project.pk).select_related("created_by"),
    }
    return render(request, "sweeps/sweep_list.html", context)


@login_required
@require_GET
def sweep_detail(request: HttpRequest, sweep_id: int) -> HttpResponse:
    sweep = selectors.sweep_for(user=caller(request), sweep_id=sweep_id)
    summary = selectors.sweep_summary(sweep=sweep)
    names = [parameter["name"] for parameter in sweep.parameters]
    for row in summary["trials"]:
        row["param_values"] = [row["params"].get(name) for name in names]
    context = (
        page_access(user=caller(request), project=sweep.project)
        | summary
        | {
            "parameter_names": names,
            "chart": selectors.chart_of(sweep=sweep, rows=summary["trials"]),
        }
    )
    return render(request, "sweeps/sweep_detail.html", context)


@login_required
@require_POST
def sweep_cancel(request: HttpRequest, sweep_id: int) -> HttpResponse:
    sweep = selectors.sweep_for(user=caller(request), sweep_id=sweep_id, permission=Permission.EDIT)
    try:
        services.sweep_cancel(sweep=sweep)
    except StateError as refused:
        messages.error(request, str(refused))
    return redirect("sweep-detail", sweep_id=sweep.pk)

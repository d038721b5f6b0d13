"""Evaluation-suite pages: a project's suites (and a form to add one), a suite with its versions
and its evaluations (metrics in a table, newest first; forms to add a version and to evaluate),
and an evaluation with its figures per entry and its results per item, completions included
(escaped by the templates: model output is untrusted). Roles as in REST: reading needs VIEW,
creating and evaluating EDIT."""

import json
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from core.callers import caller
from core.roles import Permission
from evaluations import selectors, services
from projects import selectors as project_selectors
from projects.models import TaskSetVersion
from projects.selectors import page_access
from rewards.models import RewardRuleVersion
from runs.models import Checkpoint, Run
from tiers.models import Tier

RESULTS_PER_PAGE = 50


def metric_headers(ks: list[int]) -> list[str]:
    return [f"pass@{k}" for k in sorted({1, *ks})] + ["mean reward", "invalid-action rate", "mean length"]


def metric_row(figures: dict | None, ks: list[int]) -> list[float | None]:
    """The figures in the order of `metric_headers` (a template cannot read a key like pass@1)."""
    figures = figures or {}
    keys = [f"pass@{k}" for k in sorted({1, *ks})] + ["mean_reward", "invalid_action_rate", "mean_length"]
    return [figures.get(key) for key in keys]


def _refusal(error: ValidationError) -> str:
    if hasattr(error, "error_dict"):
        return "; ".join(f"{key}: {' '.join(values)}" for key, values in error.message_dict.items())
    return "; ".join(error.messages)


def _json_field(request: HttpRequest, name: str, default: Any) -> Any:
    raw = request.POST.get(name, "").strip()
    if not raw:
        return default
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ValidationError({name: f"is not JSON: {exc}"}) from None


@login_required
@require_GET
def suite_list(request: HttpRequest, project_id: int) -> HttpResponse:
    project = project_selectors.project_for(user=caller(request), project_id=project_id)
    context = page_access(user=caller(request), project=project) | {
        "suites": project.eval_suites.order_by("name").prefetch_related("versions"),
    }
    return render(request, "evaluations/suite_list.html", context)


@login_required
@require_POST
def suite_create(request: HttpRequest, project_id: int) -> HttpResponse:
    project = project_selectors.project_for(
        user=caller(request), project_id=project_id, permission=Permission.EDIT
    )
    try:
        suite = services.suite_create(
            project=project,
            name=request.POST.get("name", ""),
            description=request.POST.get("description", ""),
            by=caller(request),
        )
    except ValidationError as error:
        messages.error(request, f"Not created: {_refusal(error)}")
        return redirect("eval-suite-list", project_id=project.pk)
    return redirect("eval-suite-detail", suite_id=suite.pk)


@login_required
@require_GET
def suite_detail(request: HttpRequest, suite_id: int) -> HttpResponse:
    suite = selectors.suite_for(user=caller(request), suite_id=suite_id)
    project = suite.project
    access = page_access(user=caller(request), project=project)
    context = access | {
        "suite": suite,
        "versions": selectors.versions_of(suite=suite),
        "evaluations": [
            (
                evaluation,
                metric_row((evaluation.metrics or {}).get("overall"), evaluation.suite_version.sampling["k"]),
            )
            for evaluation in selectors.evaluations_of(suite=suite)[:100]
        ],
        "metric_headers": metric_headers([]),
    }
    if access["can_edit"]:
        context |= {
            "task_set_versions": TaskSetVersion.objects.filter(task_set__project=project)
            .select_related("task_set")
            .order_by("-created_at")[:50],
            "rule_versions": RewardRuleVersion.objects.filter(rule__project=project)
            .select_related("rule")
            .order_by("-created_at")[:50],
            "runs": project.runs.order_by("-created_at")[:50],
            "tiers": project.tiers.order_by("name"),
        }
    return render(request, "evaluations/suite_detail.html", context)


@login_required
@require_POST
def suite_version_create(request: HttpRequest, suite_id: int) -> HttpResponse:
    suite = selectors.suite_for(user=caller(request), suite_id=suite_id, permission=Permission.EDIT)
    try:
        services.suite_version_create(
            suite=suite,
            entries=_json_field(request, "entries", None),
            sampling=_json_field(request, "sampling", None),
            note=request.POST.get("note", ""),
            by=caller(request),
        )
    except ValidationError as error:
        messages.error(request, f"No version added: {_refusal(error)}")
    return redirect("eval-suite-detail", suite_id=suite.pk)


def _target(request: HttpRequest, project_id: int) -> dict[str, Any]:
    """The target the form chose: `run:ID` (with `version`), `checkpoint:ID` or `tier:ID`."""
    kind, _, raw = request.POST.get("target", "").partition(":")
    models: dict[str, tuple[type[Run] | type[Checkpoint] | type[Tier], str]] = {
        "run": (Run, "project_id"),
        "checkpoint": (Checkpoint, "run__project_id"),
        "tier": (Tier, "project_id"),
    }
    if kind not in models or not raw.isdigit():
        raise ValidationError({"target": "choose a run, a checkpoint or a tier of this project"})
    model, field = models[kind]
    found = model.objects.filter(pk=int(raw), **{field: project_id}).first()
    if found is None:
        raise ValidationError({"target": f"no {kind} {raw} in this project"})
    target: dict[str, Any] = {kind: found}
    if kind == "run" and request.POST.get("version", "").strip():
        if not request.POST["version"].strip().isdigit():
            raise ValidationError({"version": "must be a policy version number"})
        target["version"] = int(request.POST["version"])
    return target


@login_required
@require_POST
def suite_evaluate(request: HttpRequest, suite_id: int) -> HttpResponse:
    suite = selectors.suite_for(user=caller(request), suite_id=suite_id, permission=Permission.EDIT)
    try:
        number = request.POST.get("suite_version", "").strip()
        version = selectors.version_of(suite=suite, number=int(number) if number.isdigit() else None)
        evaluation = services.suite_evaluate(
            suite_version=version, by=caller(request), **_target(request, suite.project_id)
        )
    except ValidationError as error:
        messages.error(request, f"Not evaluated: {_refusal(error)}")
        return redirect("eval-suite-detail", suite_id=suite.pk)
    return redirect("suite-evaluation-detail", evaluation_id=evaluation.pk)


@login_required
@require_GET
def evaluation_detail(request: HttpRequest, evaluation_id: int) -> HttpResponse:
    evaluation = selectors.evaluation_for(user=caller(request), evaluation_id=evaluation_id)
    page = Paginator(selectors.results_of(evaluation=evaluation), RESULTS_PER_PAGE).get_page(
        request.GET.get("page")
    )
    metrics = evaluation.metrics or {}
    ks = evaluation.suite_version.sampling.get("k", [1])
    context = page_access(user=caller(request), project=evaluation.project) | {
        "evaluation": evaluation,
        "suite": evaluation.suite_version.suite,
        "overall": metric_row(metrics.get("overall"), ks) if metrics.get("overall") else None,
        "overall_graders": (metrics.get("overall") or {}).get("graders", {}),
        "entries": [(entry, metric_row(entry, ks)) for entry in metrics.get("entries", [])],
        "metric_headers": metric_headers(ks),
        "page": page,
    }
    return render(request, "evaluations/evaluation_detail.html", context)

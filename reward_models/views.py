"""Reward-model pages: a project's reward models (and a form to add one), one model with its
versions (and a form to train the next), one version with its held-out pair accuracy, its training
curve (live while it trains: the page polls its progress) and the runs that used it. Roles as in
REST: reading needs VIEW, creating and training EDIT."""

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from core.callers import caller
from core.exceptions import StateError
from core.roles import Permission
from projects import selectors as project_selectors
from projects.models import TaskSetVersion
from projects.selectors import page_access
from reward_models import selectors, services
from reward_models.progress import version_progress
from tiers.models import Tier


def _refusal(error: ValidationError) -> str:
    if hasattr(error, "error_dict"):
        return "; ".join(f"{key}: {' '.join(values)}" for key, values in error.message_dict.items())
    return "; ".join(error.messages)


@login_required
@require_GET
def reward_model_list(request: HttpRequest, project_id: int) -> HttpResponse:
    project = project_selectors.project_for(user=caller(request), project_id=project_id)
    context = page_access(user=caller(request), project=project) | {
        "reward_models": project.reward_models.order_by("name").prefetch_related("versions"),
    }
    return render(request, "reward_models/reward_model_list.html", context)


@login_required
@require_POST
def reward_model_create(request: HttpRequest, project_id: int) -> HttpResponse:
    project = project_selectors.project_for(
        user=caller(request), project_id=project_id, permission=Permission.EDIT
    )
    try:
        reward_model = services.reward_model_create(
            project=project,
            name=request.POST.get("name", ""),
            description=request.POST.get("description", ""),
            by=caller(request),
        )
    except ValidationError as error:
        messages.error(request, f"Not created: {_refusal(error)}")
        return redirect("reward-model-list", project_id=project.pk)
    return redirect("reward-model-detail", reward_model_id=reward_model.pk)


def _pair_versions(project) -> list[TaskSetVersion]:
    """The project's task-set versions that hold preference pairs, newest first."""
    versions = TaskSetVersion.objects.filter(task_set__project=project).select_related("task_set")
    with_pairs = versions.filter(items__data__metadata__has_key="chosen").distinct()
    return list(with_pairs.order_by("-created_at")[:50])


@login_required
@require_GET
def reward_model_detail(request: HttpRequest, reward_model_id: int) -> HttpResponse:
    reward_model = selectors.reward_model_for(user=caller(request), reward_model_id=reward_model_id)
    project = reward_model.project
    access = page_access(user=caller(request), project=project)
    context = access | {
        "reward_model": reward_model,
        "versions": selectors.versions_of(reward_model=reward_model),
        "pair_versions": _pair_versions(project) if access["can_edit"] else [],
        "tiers": project.tiers.order_by("name") if access["can_edit"] else [],
    }
    return render(request, "reward_models/reward_model_detail.html", context)


@login_required
@require_POST
def reward_model_train(request: HttpRequest, reward_model_id: int) -> HttpResponse:
    reward_model = selectors.reward_model_for(
        user=caller(request), reward_model_id=reward_model_id, permission=Permission.EDIT
    )
    project = reward_model.project
    try:
        task_set_version = TaskSetVersion.objects.filter(
            pk=int(request.POST.get("task_set_version") or 0), task_set__project=project
        ).first()
        if task_set_version is None:
            raise ValidationError({"task_set_version": "choose a task-set version of this project"})
        tier = None
        if request.POST.get("tier"):
            tier = Tier.objects.filter(pk=int(request.POST["tier"]), project=project).first()
            if tier is None:
                raise ValidationError({"tier": "choose a tier of this project"})
        raw = request.POST.get("hyperparameters", "").strip() or "{}"
        try:
            hyper = json.loads(raw)
        except ValueError as exc:
            raise ValidationError({"hyperparameters": f"is not JSON: {exc}"}) from None
        if not isinstance(hyper, dict):
            raise ValidationError({"hyperparameters": "must be a JSON object"})
        version = services.reward_model_train(
            reward_model=reward_model,
            task_set_version=task_set_version,
            by=caller(request),
            base_model=request.POST.get("base_model", ""),
            tier=tier,
            hyperparameters=hyper,
        )
    except ValueError as error:  # ValidationError included; int() of a tampered form too
        text = _refusal(error) if isinstance(error, ValidationError) else str(error)
        messages.error(request, f"Not started: {text}")
        return redirect("reward-model-detail", reward_model_id=reward_model.pk)
    return redirect("reward-model-version", version_id=version.pk)


@login_required
@require_GET
def reward_model_version(request: HttpRequest, version_id: int) -> HttpResponse:
    version = selectors.version_for(user=caller(request), version_id=version_id)
    context = page_access(user=caller(request), project=version.reward_model.project) | {
        "version": version,
        "reward_model": version.reward_model,
        "runs": selectors.runs_using(version=version)[:50],
        "history": version.history[-200:],
        "progress": version_progress(version, since=version.step),
        "live": {
            "url": reverse("reward-model-version-progress", args=[version.pk]),
            "terminal": version.is_terminal,
        },
    }
    return render(request, "reward_models/version_detail.html", context)


@login_required
@require_GET
def reward_model_version_progress(request: HttpRequest, version_id: int) -> JsonResponse:
    """What the version's page polls while it trains (`?since=STEP`: only the steps after it)."""
    version = selectors.version_for(user=caller(request), version_id=version_id)
    try:
        since = max(0, int(request.GET.get("since", "0")))
    except ValueError:
        return JsonResponse({"error": {"param": "since", "message": "must be a step number"}}, status=400)
    return JsonResponse(version_progress(version, since=since))


@login_required
@require_POST
def reward_model_version_cancel(request: HttpRequest, version_id: int) -> HttpResponse:
    version = selectors.version_for(user=caller(request), version_id=version_id, permission=Permission.EDIT)
    try:
        services.reward_model_version_cancel(version=version)
    except StateError as error:
        messages.error(request, str(error))
    return redirect("reward-model-version", version_id=version.pk)

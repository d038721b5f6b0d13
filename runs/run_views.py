"""Run pages: the launch form, the run page with its actions and record, and a trajectory's steps.

Like runs.views: every object comes through `runs.selectors` (non-members 404, a role without the
permission 403), every change through `runs.lifecycle`. Model output is shown as escaped text.
"""

import json
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from runs import forms, lifecycle, selectors
from runs.lifecycle import RunRequest
from runs.models import Run, Trajectory
from runs.roles import Permission
from runs.services import StateError
from runs.views import _access

S = Run.Status
TRAJECTORIES_PER_PAGE = 25
STEPS_PER_PAGE = 20
RECENT = 50
# Which actions each status allows; the lifecycle has the last word (a race answers StateError).
ACTIONS = {
    "pause": (S.QUEUED, S.STARTING, S.RUNNING),
    "resume": (S.PAUSED,),
    "cancel": (S.QUEUED, S.STARTING, S.RUNNING, S.PAUSING, S.PAUSED),
    "retry": (S.FAILED, S.CANCELLED),
}
CHANGES = {
    "pause": lifecycle.run_pause,
    "resume": lifecycle.run_resume,
    "cancel": lifecycle.run_cancel,
    "retry": lifecycle.run_retry,
}


def _message(error: ValidationError) -> str:
    if hasattr(error, "error_dict"):
        return "; ".join(f"{key}: {' '.join(values)}" for key, values in error.message_dict.items())
    return "; ".join(error.messages)


# --- launch --------------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def run_create(request: HttpRequest, project_id: int) -> HttpResponse:
    project = selectors.project_for(user=request.user, project_id=project_id, permission=Permission.EDIT)
    form = forms.RunForm(request.POST if request.method == "POST" else None, project=project)
    if form.is_bound and form.is_valid():
        data = {key: value for key, value in form.cleaned_data.items() if not key.startswith("hp_")}
        try:
            run = lifecycle.run_create(request=RunRequest(project=project, **data), by=request.user)
        except ValidationError as exc:
            form.add_refusal(exc)
        else:
            messages.success(request, f"Run {run.name} queued.")
            return redirect("run-detail", run_id=run.pk)
    context = _access(request.user, project) | {"form": form, "hyperparameters": form.hyperparameter_rows()}
    return render(request, "runs/run_form.html", context)


# --- the run page --------------------------------------------------------------------------


def _config_rows(run: Run) -> list[tuple[str, list[tuple[str, Any]]]]:
    budgets = [
        ("max steps", run.max_steps),
        ("max wall seconds", run.max_wall_seconds or "no limit"),
        ("max sandbox CPU-seconds", run.max_sandbox_cpu_seconds or "no limit"),
        ("priority", run.priority),
    ]
    data = [
        ("task set version", str(run.task_set_version)),
        ("train on", run.train_split),
        ("evaluate on", run.eval_split),
        ("reward rule version", str(run.reward_rule_version)),
    ]
    tier = [(name, _shown(value)) for name, value in sorted(run.tier_config.items())]
    return [("Data", data), ("Budgets", budgets), ("Tier", tier)]


def _shown(value: Any) -> Any:
    """A setting as text: lists joined, empty values as None (shown as a dash)."""
    if isinstance(value, list):
        value = ", ".join(str(part) for part in value)
    return None if value in ("", None) else value


def _hyperparameter_rows(run: Run) -> list[dict[str, Any]]:
    return [
        {"name": name, "value": value, "auto": run.hyperparameters.get(name, "auto") == "auto"}
        for name, value in run.resolved.items()
    ]


@login_required
@require_GET
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = selectors.run_for(user=request.user, run_id=run_id)
    access = _access(request.user, run.project)
    outcome = request.GET.get("outcome", "")
    outcome = outcome if outcome in Trajectory.Outcome.values else ""
    trajectories = selectors.trajectories_filtered(
        run.trajectories.select_related("item").order_by("-created_at", "-pk"), outcome=outcome
    )
    actions = (
        [name for name, allowed in ACTIONS.items() if run.status in allowed] if access["can_edit"] else []
    )
    context = access | {
        "run": run,
        "actions": actions,
        "queue_position": lifecycle.queue_position(run),
        "config": _config_rows(run),
        "hyperparameters": _hyperparameter_rows(run),
        "diff": lifecycle.config_diff(run.parent, run) if run.parent else None,
        "events": selectors.events_of(run=run).order_by("-created_at", "-pk")[:RECENT],
        "checkpoints": run.checkpoints.order_by("-step")[:RECENT],
        "metrics": selectors.latest_metrics_of(run=run),
        "page": Paginator(trajectories, TRAJECTORIES_PER_PAGE).get_page(request.GET.get("page")),
        "outcome": outcome,
        "outcomes": Trajectory.Outcome.choices,
    }
    return render(request, "runs/run_detail.html", context)


def _change(request: HttpRequest, run_id: int, action: str) -> HttpResponse:
    run = selectors.run_for(user=request.user, run_id=run_id, permission=Permission.EDIT)
    try:
        run = CHANGES[action](run=run)
    except StateError as exc:
        messages.error(request, f"Not done: {exc}.")
    else:
        messages.success(request, f"Run {run.name} is {run.status}.")
    return redirect("run-detail", run_id=run.pk)


@login_required
@require_POST
def run_pause(request: HttpRequest, run_id: int) -> HttpResponse:
    return _change(request, run_id, "pause")


@login_required
@require_POST
def run_resume(request: HttpRequest, run_id: int) -> HttpResponse:
    return _change(request, run_id, "resume")


@login_required
@require_POST
def run_cancel(request: HttpRequest, run_id: int) -> HttpResponse:
    return _change(request, run_id, "cancel")


@login_required
@require_POST
def run_retry(request: HttpRequest, run_id: int) -> HttpResponse:
    return _change(request, run_id, "retry")


@login_required
@require_POST
def run_clone(request: HttpRequest, run_id: int) -> HttpResponse:
    run = selectors.run_for(user=request.user, run_id=run_id, permission=Permission.EDIT)
    try:
        clone = lifecycle.run_clone(run=run, by=request.user)
    except ValidationError as exc:
        messages.error(request, f"Not cloned: {_message(exc)}")
        return redirect("run-detail", run_id=run.pk)
    messages.success(request, f"Cloned as {clone.name}; queued.")
    return redirect("run-detail", run_id=clone.pk)


@login_required
@require_POST
def checkpoint_fork(request: HttpRequest, checkpoint_id: int) -> HttpResponse:
    checkpoint = selectors.checkpoint_for(
        user=request.user, checkpoint_id=checkpoint_id, permission=Permission.EDIT
    )
    try:
        fork = lifecycle.run_fork(checkpoint=checkpoint, by=request.user)
    except ValidationError as exc:
        messages.error(request, f"Not forked: {_message(exc)}")
        return redirect("run-detail", run_id=checkpoint.run_id)
    messages.success(request, f"Forked as {fork.name}; queued.")
    return redirect("run-detail", run_id=fork.pk)


# --- a trajectory --------------------------------------------------------------------------


@login_required
@require_GET
def trajectory_detail(request: HttpRequest, trajectory_id: int) -> HttpResponse:
    trajectory = selectors.trajectory_for(user=request.user, trajectory_id=trajectory_id)
    page = Paginator(selectors.steps_of(trajectory=trajectory), STEPS_PER_PAGE).get_page(
        request.GET.get("page")
    )
    # Only this page's steps are decompressed. The template escapes every string in them.
    steps = [(step, json.dumps(step.data(), indent=2, ensure_ascii=False)) for step in page]
    context = _access(request.user, trajectory.run.project) | {
        "run": trajectory.run,
        "trajectory": trajectory,
        "page": page,
        "steps": steps,
    }
    return render(request, "runs/run_trajectory.html", context)

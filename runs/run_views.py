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
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from reward_models import selectors as reward_model_selectors
from runs import forms, lifecycle, monitors, selectors
from runs.lifecycle import RunRequest
from runs.models import Run, Trajectory
from runs.roles import Permission, role_allows
from runs.services import StateError
from runs.views import _access

S = Run.Status
TRAJECTORIES_PER_PAGE = 25
STEPS_PER_PAGE = 20
RECENT = 50
LIVE_MAX_POINTS = 2000  # per series: the browser charts at most this many, min and max kept
# Which actions each status allows; the lifecycle has the last word (a race answers StateError).
ACTIONS = {
    "pause": (S.QUEUED, S.STARTING, S.RUNNING),
    "resume": (S.PAUSED,),
    "cancel": (S.QUEUED, S.STARTING, S.RUNNING, S.PAUSING, S.PAUSED),
    "retry": (S.FAILED, S.CANCELLED),
}
PAST = {"pause": "paused", "resume": "resumed", "cancel": "cancelled", "retry": "retried"}
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
        "alerts": selectors.events_of(run=run).filter(kind="alert").order_by("-pk")[:RECENT],
        "monitors": _monitor_rows(run),
        "monitor_actions": [
            {"name": name, "action": action, "help": monitors.MONITORS[name]}
            for name, action in monitors.actions_of(run).items()
        ],
        "live": _live_config(run),
        "reward_model_uses": reward_model_selectors.uses_of_run(run=run),
    }
    return render(request, "runs/run_detail.html", context)


def _monitor_rows(run: Run) -> list[dict[str, Any]]:
    values = monitors.thresholds_of(run)
    return [
        {"name": name, "value": values[name], "default": default, "help": monitors.HELP[name]}
        for name, default in monitors.DEFAULTS.items()
    ]


def _live_config(run: Run) -> dict[str, Any]:
    """What the run page's script needs: where to listen and where to re-fetch."""
    last_event = run.events.order_by("-pk").values_list("pk", flat=True).first() or 0
    last_trajectory = run.trajectories.order_by("-pk").values_list("pk", flat=True).first() or 0
    return {
        "run": run.pk,
        "ws": f"/ws/runs/{run.pk}/",
        "metrics": reverse("api-run-metrics", args=[run.pk]),
        "events": reverse("api-run-events", args=[run.pk]),
        "detail": reverse("api-run", args=[run.pk]),
        "trajectories": reverse("api-trajectories"),
        "trajectory_page": reverse("trajectory-detail", args=[0]).replace("/0/", "/{id}/"),
        "last_event": last_event,
        "last_trajectory": last_trajectory,
        "max_points": LIVE_MAX_POINTS,
        # What the page was rendered with: a change from it re-renders the run's header.
        "shown": _shown_state(run.status, run.learner_step, run.policy_version, run.sandbox_cpu_seconds),
    }


def _shown_state(*parts: Any) -> str:
    return "|".join(str(part) for part in parts)


@login_required
@require_POST
def run_monitors(request: HttpRequest, run_id: int) -> HttpResponse:
    run = selectors.run_for(user=request.user, run_id=run_id, permission=Permission.EDIT)
    changes: dict[str, float | None] = {}
    for name in monitors.DEFAULTS:
        raw = request.POST.get(name, "").strip()
        try:
            changes[name] = float(raw) if raw else None
        except ValueError:
            messages.error(request, f"Not saved: {name} must be a number.")
            return redirect("run-detail", run_id=run.pk)
    actions = {
        name: request.POST[f"action-{name}"] for name in monitors.MONITORS if f"action-{name}" in request.POST
    }
    try:
        monitors.run_monitors_set(run=run, changes=changes, actions=actions)
    except ValidationError as exc:
        messages.error(request, f"Not saved: {_message(exc)}")
    else:
        messages.success(request, "Alert thresholds saved.")
    return redirect(f"{reverse('run-detail', args=[run.pk])}#monitors")


def _change(request: HttpRequest, run_id: int, action: str) -> HttpResponse:
    run = selectors.run_for(user=request.user, run_id=run_id, permission=Permission.EDIT)
    try:
        run = CHANGES[action](run=run)
    except StateError:
        run.refresh_from_db(fields=["status"])
        messages.error(
            request, f"Not {PAST[action]}: run {run.name} is {run.status} now (the page was stale)."
        )
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
    access = _access(request.user, trajectory.run.project)
    queue = request.GET.get("queue", "")
    reviews = list(trajectory.reviews.select_related("reviewer").order_by("-updated_at"))
    context = access | {
        "run": trajectory.run,
        "trajectory": trajectory,
        "page": page,
        "steps": steps,
        "step_count": trajectory.steps.count(),
        "can_review": role_allows(access["role"], Permission.REVIEW),
        "reviews": reviews,
        "my_review": next((r for r in reviews if r.reviewer_id == request.user.pk), None),
        "labels": LABELS,
        "queue": int(queue) if queue.isdigit() else None,
        "replay": {
            "trajectory": trajectory.pk,
            "steps": reverse("api-trajectory-steps", args=[trajectory.pk]),
            "count": trajectory.steps.count(),
        },
    }
    return render(request, "runs/run_trajectory.html", context)


LABELS = [
    ("good", "Good"),
    ("bad", "Bad"),
    ("reward_hack", "Reward hack"),
    ("infrastructure_error", "Infrastructure error"),
]
FILTERS = {
    "outcome": str,
    "policy_version": int,
    "min_reward": float,
    "max_reward": float,
    "step": int,
    "task": str,
    "flag": str,
    "label": str,
}


def _trajectory_filters(request: HttpRequest) -> dict[str, Any]:
    """The browser's filters from the query string; a value that does not parse is ignored."""
    found: dict[str, Any] = {}
    for name, kind in FILTERS.items():
        raw = request.GET.get(name, "").strip()
        if raw:
            try:
                found[name] = kind(raw)
            except ValueError:
                continue
    if request.GET.get("flagged") in ("1", "0"):
        found["flagged"] = request.GET["flagged"] == "1"
    return found


@login_required
@require_GET
def trajectory_list(request: HttpRequest, run_id: int) -> HttpResponse:
    run = selectors.run_for(user=request.user, run_id=run_id)
    filters = _trajectory_filters(request)
    trajectories = selectors.trajectories_filtered(
        run.trajectories.select_related("item").prefetch_related("reviews").order_by("-pk"), **filters
    )
    page = Paginator(trajectories, TRAJECTORIES_PER_PAGE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = _access(request.user, run.project) | {
        "run": run,
        "page": page,
        "filters": filters,
        "raw": {name: request.GET.get(name, "") for name in [*FILTERS, "flagged"]},
        "query": query.urlencode(),
        "outcomes": Trajectory.Outcome.choices,
        "labels": [*LABELS, ("unreviewed", "Unreviewed")],
        "live": _live_config(run) | {"filtered": bool(filters)},
    }
    return render(request, "runs/trajectory_list.html", context)


@login_required
@require_GET
def trajectory_group(request: HttpRequest, trajectory_id: int) -> HttpResponse:
    trajectory = selectors.trajectory_for(user=request.user, trajectory_id=trajectory_id)
    group = list(selectors.group_of(trajectory=trajectory).select_related("item").prefetch_related("reviews"))
    access = _access(request.user, trajectory.run.project)
    context = access | {
        "run": trajectory.run,
        "trajectory": trajectory,
        "group": group,
        "components": sorted({name for member in group for name in member.components}),
        "can_review": role_allows(access["role"], Permission.REVIEW),
    }
    return render(request, "runs/trajectory_group.html", context)


# --- compare runs ---------------------------------------------------------------------------

COMPARE_MAX = 8


@login_required
@require_GET
def run_compare(request: HttpRequest) -> HttpResponse:
    """Several runs' metric overlaid, and their configurations with differences highlighted."""
    ids = []
    for part in request.GET.getlist("runs"):
        ids += [int(value) for value in part.split(",") if value.strip().isdigit()]
    ids = list(dict.fromkeys(ids))[:COMPARE_MAX]
    if not ids:
        raise Http404("name the runs to compare: ?runs=1,2")
    runs = [selectors.run_for(user=request.user, run_id=run_id) for run_id in ids]
    configs = [lifecycle.run_config(run) for run in runs]
    keys = sorted({key for config in configs for key in config})
    rows = [
        {
            "field": key,
            "values": [config.get(key) for config in configs],
            "differs": len({json.dumps(config.get(key), sort_keys=True, default=str) for config in configs})
            > 1,
        }
        for key in keys
    ]
    names = sorted(
        {name for run in runs for name in selectors.metric_names_of(run=run).values_list("name", flat=True)}
    )
    metric = request.GET.get("metric") or (
        "reward/mean" if "reward/mean" in names else (names[0] if names else "")
    )
    context = {
        "runs": runs,
        "rows": rows,
        "differing": sum(row["differs"] for row in rows),
        "names": names,
        "metric": metric,
        "compare": {
            "metric": metric,
            "max_points": LIVE_MAX_POINTS,
            "runs": [
                {"id": run.pk, "name": run.name, "metrics": reverse("api-run-metrics", args=[run.pk])}
                for run in runs
            ],
        },
        "ids": ",".join(str(run.pk) for run in runs),
    }
    return render(request, "runs/run_compare.html", context)

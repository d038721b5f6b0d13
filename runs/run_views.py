"""Run pages: the launch form, the run page with its actions and record, and a trajectory's steps.

Like runs.views: every object comes through `runs.selectors` (non-members 404, a role without the
permission 403), every change through `runs.lifecycle`. Model output is shown as escaped text.
"""

import json
import os
from typing import Any, TypedDict

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.callers import caller
from core.exceptions import StateError
from core.roles import Permission, role_allows
from projects import selectors as project_selectors
from projects.selectors import page_access
from runs import (
    forms,
    lifecycle,
    monitor_settings,
    monitors,
    outcomes,
    run_page,
    runs_table,
    scheduling,
    selectors,
)
from runs.demo import demo_project_for, demo_run_launch
from runs.lifecycle import RunRequest
from runs.models import Run, Trajectory

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
    project = project_selectors.project_for(
        user=caller(request), project_id=project_id, permission=Permission.EDIT
    )
    form = forms.RunForm(request.POST if request.method == "POST" else None, project=project)
    if form.is_bound and form.is_valid():
        data = {key: value for key, value in form.cleaned_data.items() if not key.startswith("hp_")}
        try:
            run = lifecycle.run_create(request=RunRequest(project=project, **data), by=caller(request))
        except ValidationError as exc:
            form.add_refusal(exc)
        else:
            messages.success(request, f"Run {run.name} queued.")
            return redirect("run-detail", run_id=run.pk)
    elif form.is_bound:
        _add_lifecycle_problems(form, project)
    context = page_access(user=caller(request), project=project) | {
        "form": form,
        "hyperparameters": form.hyperparameter_rows(),
    }
    return render(request, "runs/run_form.html", context)


def _add_lifecycle_problems(form: forms.RunForm, project) -> None:
    """A form refused for one field is still checked by the lifecycle, so one submission names
    every problem REST would (group_size=1 beside an empty name), each once."""
    data = form.cleaned_data
    if not all(data.get(name) for name in ("task_set_version", "reward_rule_version", "tier")):
        return
    request = RunRequest(
        project=project,
        name=data.get("name") or "-",  # an empty name is already reported by the form
        task_set_version=data["task_set_version"],
        reward_rule_version=data["reward_rule_version"],
        tier=data["tier"],
        method=data.get("method") or Run.Method.GRPO,
        hyperparameters=data.get("hyperparameters") or {},
        max_steps=data["max_steps"] if data.get("max_steps") is not None else 1,
        max_wall_seconds=data.get("max_wall_seconds"),
        max_sandbox_cpu_seconds=data.get("max_sandbox_cpu_seconds"),
        budget_money=data.get("budget_money"),
        budget_device_hours=data.get("budget_device_hours"),
        train_split=data.get("train_split") or "train",
        eval_split=data.get("eval_split") or "heldout",
    )
    _resolved, problems = lifecycle.run_problems(request)
    already = set(form.errors)
    fresh = {key: message for key, message in problems.items() if _form_field(key) not in already}
    if fresh:
        form.add_refusal(ValidationError(fresh))


def _form_field(key: str) -> str:
    head, _, rest = key.partition(".")
    return f"hp_{rest}" if head == "hyperparameters" else head


# --- the run page --------------------------------------------------------------------------


def _config_rows(run: Run) -> list[tuple[str, list[tuple[str, Any]]]]:
    budgets = [
        ("max steps", run.max_steps),
        ("max wall seconds", run.max_wall_seconds or "no limit"),
        ("max sandbox CPU-seconds", run.max_sandbox_cpu_seconds or "no limit"),
        ("budget (money)", run.budget_money if run.budget_money is not None else "no limit"),
        ("budget (device-hours)", run.budget_device_hours or "no limit"),
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
    run = selectors.run_for(user=caller(request), run_id=run_id)
    access = page_access(user=caller(request), project=run.project)
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
        "queue_reason": scheduling.queue_reason(run),
        "config": _config_rows(run),
        "hyperparameters": _hyperparameter_rows(run),
        "diff": lifecycle.config_diff(run.parent, run) if run.parent else None,
        "events": selectors.events_of(run=run).order_by("-created_at", "-pk")[:RECENT],
        "checkpoints": selectors.checkpoint_rows_of(run=run, limit=RECENT),
        "best_checkpoint": selectors.checkpoint_best(run),
        "best_metric": selectors.best_metric_of(run),
        "metrics": selectors.latest_metrics_of(run=run),
        "heldout_trend": selectors.heldout_trend_of(run=run),
        "page": Paginator(trajectories, TRAJECTORIES_PER_PAGE).get_page(request.GET.get("page")),
        "outcome": outcome,
        "outcomes": Trajectory.Outcome.choices,
        "alerts": selectors.events_of(run=run).filter(kind="alert").order_by("-pk")[:RECENT],
        "monitors": _monitor_rows(run),
        "monitor_actions": [
            {"name": name, "action": action, "help": monitor_settings.MONITORS[name]}
            for name, action in monitors.actions_of(run).items()
        ],
        "live": _live_config(run),
    }
    context |= run_page.run_sections(request, run)
    return render(request, "runs/run_detail.html", context)


def _monitor_rows(run: Run) -> list[dict[str, Any]]:
    values = monitors.thresholds_of(run)
    return [
        {"name": name, "value": values[name], "default": default, "help": monitor_settings.HELP[name]}
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
        # Which buttons each status allows, so they follow a status change at once.
        "actions": {name: [str(status) for status in allowed] for name, allowed in ACTIONS.items()},
        # What the page was rendered with: a change from it re-renders the run's header.
        "shown": _shown_state(run.status, run.learner_step, run.policy_version, run.sandbox_cpu_seconds),
    }


def _shown_state(*parts: Any) -> str:
    return "|".join(str(part) for part in parts)


@login_required
@require_POST
def run_monitors(request: HttpRequest, run_id: int) -> HttpResponse:
    run = selectors.run_for(user=caller(request), run_id=run_id, permission=Permission.EDIT)
    changes: dict[str, float | None] = {}
    for name in monitors.DEFAULTS:
        raw = request.POST.get(name, "").strip()
        try:
            changes[name] = float(raw) if raw else None
        except ValueError:
            messages.error(request, f"Not saved: {name} must be a number.")
            return redirect("run-detail", run_id=run.pk)
    actions = {
        name: request.POST[f"action-{name}"]
        for name in monitor_settings.MONITORS
        if f"action-{name}" in request.POST
    }
    try:
        monitors.run_monitors_set(run=run, changes=changes, actions=actions)
    except ValidationError as exc:
        messages.error(request, f"Not saved: {_message(exc)}")
    else:
        messages.success(request, "Alert thresholds saved.")
    return redirect(f"{reverse('run-detail', args=[run.pk])}#monitors")


def _change(request: HttpRequest, run_id: int, action: str) -> HttpResponse:
    run = selectors.run_for(user=caller(request), run_id=run_id, permission=Permission.EDIT)
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
    run = selectors.run_for(user=caller(request), run_id=run_id, permission=Permission.EDIT)
    try:
        clone = lifecycle.run_clone(run=run, by=caller(request))
    except ValidationError as exc:
        messages.error(request, f"Not cloned: {_message(exc)}")
        return redirect("run-detail", run_id=run.pk)
    messages.success(request, f"Cloned as {clone.name}; queued.")
    return redirect("run-detail", run_id=clone.pk)


@login_required
@require_POST
def checkpoint_fork(request: HttpRequest, checkpoint_id: int) -> HttpResponse:
    checkpoint = selectors.checkpoint_for(
        user=caller(request), checkpoint_id=checkpoint_id, permission=Permission.EDIT
    )
    try:
        fork = lifecycle.run_fork(checkpoint=checkpoint, by=caller(request))
    except ValidationError as exc:
        messages.error(request, f"Not forked: {_message(exc)}")
        return redirect("run-detail", run_id=checkpoint.run_id)
    messages.success(request, f"Forked as {fork.name}; queued.")
    return redirect("run-detail", run_id=fork.pk)


# --- a trajectory --------------------------------------------------------------------------


def compact_json(value: Any, indent: str = "") -> str:
    """JSON indented for reading, with lists of plain values (token ids, logprobs) on one line
    rather than one value a line.

    >>> print(compact_json({"ids": [1, 2, 3], "a": {"b": "c"}}))
    {
      "ids": [1, 2, 3],
      "a": {
        "b": "c"
      }
    }
    """
    inner = indent + "  "
    if isinstance(value, dict) and value:
        rows = [
            f"{inner}{json.dumps(str(k), ensure_ascii=False)}: {compact_json(v, inner)}"
            for k, v in value.items()
        ]
        return "{\n" + ",\n".join(rows) + f"\n{indent}}}"
    if isinstance(value, list) and value and any(isinstance(v, dict | list) for v in value):
        rows = [f"{inner}{compact_json(v, inner)}" for v in value]
        return "[\n" + ",\n".join(rows) + f"\n{indent}]"
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


@login_required
@require_GET
def trajectory_detail(request: HttpRequest, trajectory_id: int) -> HttpResponse:
    trajectory = selectors.trajectory_for(user=caller(request), trajectory_id=trajectory_id)
    page = Paginator(selectors.steps_of(trajectory=trajectory), STEPS_PER_PAGE).get_page(
        request.GET.get("page")
    )
    # Only this page's steps are decompressed. The template escapes every string in them.
    steps = [(step, compact_json(step.data())) for step in page]
    access = page_access(user=caller(request), project=trajectory.run.project)
    queue = request.GET.get("queue", "")
    reviews = list(trajectory.reviews.select_related("reviewer").order_by("-updated_at"))
    context = access | {
        "run": trajectory.run,
        "trajectory": trajectory,
        "page": page,
        "steps": steps,
        "step_count": trajectory.steps.count(),
        "tests": selectors.test_results_of(trajectory=trajectory),
        "can_review": role_allows(access["role"], Permission.REVIEW),
        "reviews": reviews,
        "my_review": next((r for r in reviews if r.reviewer_id == caller(request).pk), None),
        "labels": LABELS,
        "queue": int(queue) if queue.isdigit() else None,
        "next_url": _next_url(trajectory, int(queue) if queue.isdigit() else None, caller(request)),
        "disagree": len({review.label for review in reviews}) > 1,
        "replay": {
            "trajectory": trajectory.pk,
            "steps": reverse("api-trajectory-steps", args=[trajectory.pk]),
            "count": trajectory.steps.count(),
        },
    }
    return render(request, "runs/run_trajectory.html", context)


def _next_url(trajectory: Trajectory, queue_id: int | None, user: User) -> str | None:
    """Where "next" goes: the queue's next open item after this one, or else the run's next older
    trajectory."""
    if queue_id is not None:
        return run_page.queue_next(trajectory, queue_id, user)
    older = (
        trajectory.run.trajectories.filter(pk__lt=trajectory.pk).order_by("-pk").values_list("pk", flat=True)
    )
    target = older.first()
    return reverse("trajectory-detail", args=[target]) if target else None


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


FILTER_EXPECTS = {int: "a whole number", float: "a number", str: "text"}


def _trajectory_filters(request: HttpRequest) -> tuple[dict[str, Any], list[str]]:
    """The browser's filters from the query string, and a message for each value that does not
    parse (naming the filter and what it expects): a bad filter is never silently ignored."""
    found: dict[str, Any] = {}
    errors: list[str] = []
    for name, kind in FILTERS.items():
        raw = request.GET.get(name, "").strip()
        if raw:
            try:
                found[name] = kind(raw)
            except ValueError:
                errors.append(
                    f"{FILTER_LABELS[name]}: {raw!r} is not {FILTER_EXPECTS[kind]}; filter not applied"
                )
    if request.GET.get("flagged") in ("1", "0"):
        found["flagged"] = request.GET["flagged"] == "1"
    return found, errors


FILTER_LABELS = {
    "outcome": "Outcome",
    "policy_version": "Policy",
    "min_reward": "Reward ≥",
    "max_reward": "Reward ≤",
    "step": "Step",
    "task": "Task",
    "flag": "Flag",
    "label": "Label",
}


def _searched(trajectories, *, task: str | None, text: str) -> Any:
    """The page's looser matches than REST's: a task id by part, and text in prompt or output."""
    if task:
        trajectories = trajectories.filter(item__external_id__icontains=task)
    if text:
        trajectories = trajectories.filter(Q(completion_text__icontains=text) | Q(item__text__icontains=text))
    return trajectories


def shared_prefix(texts: list[str]) -> int:
    """How many leading characters all `texts` share, cut back to a word boundary (0 when fewer
    than two differ): what a preview skips so that rows show where the prompts differ.

    >>> shared_prefix(["Solve this. What is 1 + 1?", "Solve this. What is 2 + 2?"])
    20
    >>> shared_prefix(["same", "same"]), shared_prefix(["a"])
    (0, 0)
    """
    distinct = list(dict.fromkeys(texts))
    if len(distinct) < 2:
        return 0
    shared = len(os.path.commonprefix(distinct))
    if shared == min(len(text) for text in distinct):
        return 0  # one prompt is the start of another: nothing to skip
    while shared and not distinct[0][shared - 1].isspace():
        shared -= 1
    return shared


PREVIEW_SAMPLE = 20  # task items read to find the prefix every prompt shares


def _prompt_skip(run: Run, trajectories: list[Trajectory]) -> int:
    """How many leading characters the rows' prompt previews skip, so that they start where the
    prompts differ: the instruction they share (0 when that is too short to be worth skipping)."""
    sample = list(
        run.task_set_version.items.order_by("position").values_list("text", flat=True)[:PREVIEW_SAMPLE]
    )
    skip = shared_prefix(sample + [t.item.text for t in trajectories])
    return skip if skip >= 12 else 0


@login_required
@require_GET
def trajectory_list(request: HttpRequest, run_id: int) -> HttpResponse:
    run = selectors.run_for(user=caller(request), run_id=run_id)
    filters, filter_errors = _trajectory_filters(request)
    text = request.GET.get("q", "").strip()
    trajectories = _searched(
        selectors.trajectories_filtered(
            run.trajectories.select_related("item").prefetch_related("reviews__reviewer").order_by("-pk"),
            **(filters | {"task": None}),
        ),
        task=filters.get("task"),
        text=text,
    )
    page = Paginator(trajectories, TRAJECTORIES_PER_PAGE).get_page(request.GET.get("page"))
    skip = _prompt_skip(run, list(page))
    query = request.GET.copy()
    query.pop("page", None)
    context = page_access(user=caller(request), project=run.project) | {
        "run": run,
        "page": page,
        "preview_skip": skip,
        "filters": filters,
        "raw": {name: request.GET.get(name, "") for name in [*FILTERS, "flagged", "q"]},
        "filter_errors": filter_errors,
        "task_ids": run.task_set_version.items.order_by("position").values_list("external_id", flat=True)[
            :500
        ],
        "query": query.urlencode(),
        "outcomes": Trajectory.Outcome.choices,
        "labels": [*LABELS, ("unreviewed", "Unreviewed")],
        "review_labels": LABELS,
        "can_review": role_allows(
            page_access(user=caller(request), project=run.project)["role"], Permission.REVIEW
        ),
        # Rows that arrive live skip the same shared prompt prefix as the rendered ones.
        "live": _live_config(run) | {"filtered": bool(filters or text), "preview_skip": skip},
    }
    return render(request, "runs/trajectory_list.html", context)


@login_required
@require_GET
def trajectory_group(request: HttpRequest, trajectory_id: int) -> HttpResponse:
    trajectory = selectors.trajectory_for(user=caller(request), trajectory_id=trajectory_id)
    group = list(selectors.group_of(trajectory=trajectory).select_related("item").prefetch_related("reviews"))
    access = page_access(user=caller(request), project=trajectory.run.project)
    run_page.group_mark(group, trajectory)
    context = access | {
        "run": trajectory.run,
        "trajectory": trajectory,
        "group": group,
        "components": sorted({name for member in group for name in member.components}),
        "can_review": role_allows(access["role"], Permission.REVIEW),
    }
    return render(request, "runs/trajectory_group.html", context)


# --- the runs page ------------------------------------------------------------------------

RUNS_PAGE_LIMIT = 200


@login_required
@require_GET
def run_list(request: HttpRequest) -> HttpResponse:
    """Every run of the caller's projects in one table: sort, filter, search, tick to compare."""
    projects = list(project_selectors.projects_of(user=caller(request)).order_by("name"))
    project_ids = [project.pk for project in projects]
    chosen = request.GET.get("project", "")
    if chosen.isdigit() and int(chosen) in project_ids:
        project_ids = [int(chosen)]
    table = runs_table.table_context(
        Run.objects.filter(project_id__in=project_ids),
        request.GET,
        action=reverse("run-list"),
        show_project=True,
        limit=RUNS_PAGE_LIMIT,
        positions=selectors.queue_positions(project_ids=project_ids),
    )
    context = {
        "table": table,
        "projects": projects,
        "project_filter": chosen if len(project_ids) == 1 else "",
    }
    return render(request, "runs/run_list.html", context)


# --- the queue page ------------------------------------------------------------------------


@login_required
@require_GET
def run_queue(request: HttpRequest) -> HttpResponse:
    """The caller's projects with active or queued runs: each project's quotas and what its runs
    hold, and its queue in the order runs start, each waiting run saying why."""
    projects = {project.pk: project for project in project_selectors.projects_of(user=caller(request))}
    overview = scheduling.queue_overview(projects)
    mine = scheduling.held_now()[1].get(caller(request).pk, scheduling.Held())
    context = {
        "queues": [(projects[entry.project_id], entry) for entry in overview],
        "mine": mine,
        "user_max_active_runs": settings.FLYWHEEL_USER_MAX_ACTIVE_RUNS,
        "user_max_gpu_workers": settings.FLYWHEEL_USER_MAX_GPU_WORKERS,
    }
    return render(request, "runs/run_queue.html", context)


# --- compare runs ---------------------------------------------------------------------------

COMPARE_MAX = 8


# The compare page's groups, in the order a person looks: reward, held-out, the rest.
METRIC_GROUPS = (
    ("Reward", lambda n: n.startswith("reward/")),
    ("Held-out", lambda n: n.startswith("heldout/")),
    ("Pass rate", lambda n: "pass_rate" in n),
    ("Learner", lambda n: n.startswith("learner/")),
    ("Episodes", lambda n: n.startswith(("episodes/", "dropped/"))),
    ("Time and throughput", lambda n: n.startswith(("time/", "throughput/"))),
    ("Cost", lambda n: n.startswith("cost/")),
)
FIRST_IN_GROUP = ("reward/mean", "heldout/pass_rate", "heldout/reward")
TITLES = {
    "reward/mean": "Reward (mean)",
    "heldout/pass_rate": "Held-out pass rate",
    "heldout/reward": "Held-out reward",
    "train/pass_rate": "Train pass rate",
    "learner/kl": "KL divergence",
    "learner/loss": "Loss",
    "learner/mfu": "Model FLOPs utilisation (MFU)",
    "learner/peak_memory_mb": "Peak memory per step (MiB)",
    "episodes/errored_rate": "Errored-episode rate",
    "throughput/tokens_per_s": "Tokens per second",
    "cost/total": "Cost so far",
    "cost/device_hours": "Device-hours so far",
}


def metric_group(name: str) -> str:
    return next((title for title, belongs in METRIC_GROUPS if belongs(name)), "Other")


def metric_order(names: set[str]) -> list[str]:
    """Reward first, then held-out, pass rates, learner, episodes, time, others; within a group
    the headline metric first, then by name.

    >>> metric_order({"learner/kl", "heldout/pass_rate", "reward/std", "reward/mean", "a/b"})
    ['reward/mean', 'reward/std', 'heldout/pass_rate', 'learner/kl', 'a/b']
    """
    groups = [title for title, _ in METRIC_GROUPS] + ["Other"]
    return sorted(names, key=lambda n: (groups.index(metric_group(n)), n not in FIRST_IN_GROUP, n))


def metric_title(name: str) -> str:
    """A metric's name as a chart title.

    >>> metric_title("heldout/pass_rate"), metric_title("episodes/response_tokens")
    ('Held-out pass rate', 'Episodes · response tokens')
    """
    if name in TITLES:
        return TITLES[name]
    head, _, rest = name.partition("/")
    words = [part.replace("_", " ") for part in (head, *rest.split("/")) if part]
    head_words = "Held-out" if words and words[0] == "heldout" else words[0].capitalize() if words else name
    return " · ".join([head_words, *words[1:]])


def is_rate(name: str) -> bool:
    """Whether a metric is a fraction of 0 to 1 (drawn on a percent axis)."""
    return "pass_rate" in name or name.endswith(("_rate", "/accuracy", "clip_fraction", "/mfu"))


def _compare_ids(request: HttpRequest) -> tuple[list[int], list[str]]:
    """The run ids asked for (?runs=1,2 or ?runs=1&runs=2), and a message for each part that is
    not an id."""
    ids: list[int] = []
    errors: list[str] = []
    for part in request.GET.getlist("runs"):
        for value in part.split(","):
            value = value.strip()
            if value.isdigit():
                ids.append(int(value))
            elif value:
                errors.append(f"{value!r} is not a run id (run ids are whole numbers)")
    ids = list(dict.fromkeys(ids))
    if len(ids) > COMPARE_MAX:
        errors.append(f"at most {COMPARE_MAX} runs are compared at once; the first {COMPARE_MAX} are shown")
    return ids[:COMPARE_MAX], errors


def _visible_runs(user: User, ids: list[int]) -> tuple[list[Run], list[str]]:
    """The runs among `ids` the user may see, and an error for each other one. A run of a project
    the user is not a member of reads as missing: its existence is not disclosed."""
    runs, errors = [], []
    for run_id in ids:
        try:
            runs.append(selectors.run_for(user=user, run_id=run_id))
        except (Http404, PermissionDenied):
            errors.append(f"run {run_id} does not exist, or is in a project you are not a member of")
    return runs, errors


HELDOUT_ROWS = 200  # items listed per pair on the compare page (the API lists every one)


def _heldout_pairs(runs: list[Run], change: str, kind: str) -> list[dict[str, Any]]:
    """The first run (the baseline: a control, a parent) against each other run, item by item on
    the held-out items both evaluated, each at its newest evaluated version."""
    if len(runs) < 2:
        return []
    base = runs[0]
    base_step = outcomes.last_evaluated_step(base.pk)
    pairs = []
    for run in runs[1:]:
        step = outcomes.last_evaluated_step(run.pk)
        if base_step is None or step is None:
            pairs.append({"base": base, "run": run, "missing": True})
            continue
        comparison = outcomes.heldout_item_comparison(
            before=(base.pk, base_step),
            after=(run.pk, step),
            change=change if change in outcomes.CHANGES else "",
            kind=kind,
        )
        pairs.append(
            {"base": base, "run": run, "base_step": base_step, "step": step, "missing": False}
            | {"summary": comparison["summary"], "items": comparison["items"][:HELDOUT_ROWS]}
            | {"listed": len(comparison["items"])}
        )
    return pairs


class ConfigRow(TypedDict):
    field: str
    values: list[Any]  # each run's value of the setting
    differs: bool


@login_required
@require_GET
def run_compare(request: HttpRequest) -> HttpResponse:
    """Several runs: every metric overlaid, one chart each, and their configurations with the
    settings that differ shown (the identical ones on request)."""
    ids, errors = _compare_ids(request)
    runs, missing = _visible_runs(caller(request), ids)
    errors += missing
    if not ids:
        errors.append("name the runs to compare: tick them in the runs table, or ?runs=1,2")
    configs = [lifecycle.run_config(run) for run in runs]
    keys = sorted({key for config in configs for key in config})
    rows: list[ConfigRow] = [
        {
            "field": key,
            "values": [config.get(key) for config in configs],
            "differs": len({json.dumps(config.get(key), sort_keys=True, default=str) for config in configs})
            > 1,
        }
        for key in keys
    ]
    show_all = request.GET.get("all") == "1"
    names = metric_order(
        {name for run in runs for name in selectors.metric_names_of(run=run).values_list("name", flat=True)}
    )
    query = request.GET.copy()
    query.pop("all", None)
    context = {
        "heldout_pairs": _heldout_pairs(runs, request.GET.get("change", ""), request.GET.get("kind", "")),
        "changes": outcomes.CHANGES,
        "runs": runs,
        "errors": errors,
        "rows": [row for row in rows if row["differs"] or show_all],
        "differing": sum(row["differs"] for row in rows),
        "identical": sum(not row["differs"] for row in rows),
        "setting_count": len(rows),
        "show_all": show_all,
        "base_query": query.urlencode(),
        "names": names,
        "compare": {
            "names": names,
            "charts": [
                {"name": name, "title": metric_title(name), "group": group, "percent": is_rate(name)}
                for name, group in ((name, metric_group(name)) for name in names)
            ],
            "max_points": LIVE_MAX_POINTS,
            "runs": [
                {"id": run.pk, "name": run.name, "metrics": reverse("api-run-metrics", args=[run.pk])}
                for run in runs
            ],
        },
        "ids": ",".join(str(run.pk) for run in runs),
    }
    return render(request, "runs/run_compare.html", context, status=200 if runs or not ids else 404)


# --- the demo --------------------------------------------------------------------------------


@login_required
@require_POST
def demo_run(request: HttpRequest, project_id: int) -> HttpResponse:
    project = project_selectors.project_for(
        user=caller(request), project_id=project_id, permission=Permission.EDIT
    )
    try:
        run = demo_run_launch(project=project, by=caller(request))
    except ValidationError as exc:
        messages.error(request, _message(exc))
        return redirect("project-detail", project_id=project.pk)
    messages.success(request, f"Launched {run.name}: it trains the tiny base model with GRPO.")
    return redirect("run-detail", run_id=run.pk)


@login_required
@require_POST
def demo_start(request: HttpRequest) -> HttpResponse:
    """The home page's one click: the demo project (the shared one if the user may launch in it,
    else their own copy, made now) and its GRPO demo run."""
    try:
        project = demo_project_for(user=caller(request))
        run = demo_run_launch(project=project, by=caller(request))
    except ValidationError as exc:
        messages.error(request, f"The demo run was not launched: {_message(exc)}")
        return redirect("project-list")
    messages.success(
        request, f"Launched {run.name} in {project.name}: it trains the tiny base model with GRPO."
    )
    return redirect("run-detail", run_id=run.pk)

"""Trace pages: the project's traces (searched, filtered, selected and promoted to a task set, or
queued for review) and one trace with its review. Roles as in REST: reading needs VIEW, labelling
REVIEW, promoting EDIT. Model output and user text are shown as escaped text."""

from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from core.callers import caller
from core.roles import Permission, role_allows
from projects import selectors as project_selectors
from projects.selectors import page_access
from traces import selectors, services
from traces.serializers import TraceFilterSerializer

TRACES_PER_PAGE = 50
LABELS = (
    ("good", "good"),
    ("bad", "bad"),
    ("reward_hack", "reward hack"),
    ("infrastructure_error", "infrastructure error"),
)


def _refusal(error: ValidationError) -> str:
    if hasattr(error, "error_dict"):
        return "; ".join(f"{key}: {' '.join(values)}" for key, values in error.message_dict.items())
    return "; ".join(error.messages)


def _filters(data) -> tuple[dict, dict, list[str]]:
    """(validated filters, the raw values to show back, problems) from a query string."""
    raw = {name: data.get(name, "").strip() for name in selectors.FILTERS}
    form = TraceFilterSerializer(data={name: value for name, value in raw.items() if value})
    if form.is_valid():
        return dict(form.validated_data), raw, []
    problems = [f"{name}: {' '.join(map(str, errors))}" for name, errors in form.errors.items()]
    return {}, raw, problems


@login_required
@require_GET
def trace_list(request: HttpRequest, project_id: int) -> HttpResponse:
    project = project_selectors.project_for(user=caller(request), project_id=project_id)
    filters, raw, problems = _filters(request.GET)
    traces = selectors.traces_filtered(
        project.traces.select_related("tier").prefetch_related("reviews").order_by("-created_at", "-pk"),
        **filters,
    )
    access = page_access(user=caller(request), project=project)
    context = access | {
        "page": Paginator(traces, TRACES_PER_PAGE).get_page(request.GET.get("page")),
        "raw": raw,
        "filtered": any(raw.values()),
        "problems": problems,
        "query": urlencode({name: value for name, value in raw.items() if value}),
        "models": selectors.models_of(project_id=project.pk),
        "labels": LABELS,
        "can_review": role_allows(access["role"], Permission.REVIEW),
        "task_sets": project.task_sets.order_by("name") if access["can_edit"] else [],
        # Review queues over this project's traces (the reviews app's, through the reverse relation).
        "queues": project.review_queues.filter(source="traces").order_by("-created_at")[:20],
    }
    return render(request, "traces/trace_list.html", context)


@login_required
@require_POST
def trace_promote(request: HttpRequest, project_id: int) -> HttpResponse:
    """The selected traces (or every one the filters match) to a new task-set version."""
    project = project_selectors.project_for(
        user=caller(request), project_id=project_id, permission=Permission.EDIT
    )
    traces = project.traces.prefetch_related("reviews").order_by("pk")
    if request.POST.get("scope") == "matching":
        filters, _, problems = _filters(request.POST)
        if problems:
            messages.error(request, f"Not promoted: {'; '.join(problems)}")
            return redirect("trace-list", project_id=project.pk)
        traces = selectors.traces_filtered(traces, **filters)
    else:
        ids = [int(value) for value in request.POST.getlist("traces") if value.isdigit()]
        if not ids:
            messages.error(request, "Not promoted: select some traces first.")
            return redirect("trace-list", project_id=project.pk)
        traces = traces.filter(pk__in=ids)
    task_set = None
    if request.POST.get("task_set", "").isdigit():
        task_set = project.task_sets.filter(pk=int(request.POST["task_set"])).first()
    try:
        promotion = services.traces_promote(
            project=project,
            traces=list(traces[: services.PROMOTE_MAX + 1]),
            by=caller(request),
            task_set=task_set,
            task_set_name=request.POST.get("task_set_name", "")[:100],
        )
    except ValidationError as exc:
        messages.error(request, f"Not promoted: {_refusal(exc)}")
        return redirect("trace-list", project_id=project.pk)
    counts, version = promotion.counts, promotion.version
    skipped = counts["skipped"]["no_reference"] + counts["skipped"]["no_prompt"]
    messages.success(
        request,
        f"{version}: {counts['answer_items']} items from {counts['traces']} traces "
        f"({counts['preference_pairs']} with a preference pair), {counts['kept_items']} kept from the "
        f"previous version, {skipped} traces skipped (no answer to learn from).",
    )
    return redirect("version-detail", task_set_id=version.task_set_id, number=version.number)


@login_required
@require_GET
def trace_detail(request: HttpRequest, trace_id: int) -> HttpResponse:
    trace = selectors.trace_for(user=caller(request), trace_id=trace_id)
    access = page_access(user=caller(request), project=trace.project)
    reviews = list(trace.reviews.select_related("reviewer").order_by("pk"))
    queue = request.GET.get("queue", "")
    context = access | {
        "trace": trace,
        "reviews": reviews,
        "my_review": next((r for r in reviews if r.reviewer_id == caller(request).pk), None),
        "can_review": role_allows(access["role"], Permission.REVIEW),
        "labels": LABELS,
        "queue": int(queue) if queue.isdigit() else None,
    }
    return render(request, "traces/trace_detail.html", context)

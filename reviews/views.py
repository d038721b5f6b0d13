"""Review pages: label a trajectory, prefer one of two, review queues (create, assign, work
through), and downloads of reviewed data. Roles as in REST: label and prefer need REVIEW, assign
needs EDIT, reading and exporting need VIEW."""

from urllib.parse import urlsplit

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.callers import caller
from core.exceptions import StateError
from core.roles import Permission, role_allows
from projects import selectors as project_selectors
from projects.models import Membership
from projects.selectors import page_access
from reviews import exports, selectors, services, training
from reviews.api import export_response, labels_response
from reviews.models import Review
from runs import selectors as run_selectors
from traces import selectors as trace_selectors
from traces.serializers import TraceFilterSerializer

FILTER_FIELDS = ("outcome", "policy_version", "min_reward", "max_reward", "step", "task", "flagged", "label")
NUMBERS = {"policy_version": int, "step": int, "min_reward": float, "max_reward": float}


def _refusal(error: ValidationError) -> str:
    if hasattr(error, "error_dict"):
        return "; ".join(f"{key}: {' '.join(values)}" for key, values in error.message_dict.items())
    return "; ".join(error.messages)


def _back(request: HttpRequest, fallback: str) -> HttpResponse:
    target = request.POST.get("next", "")
    # Only paths on this site: never an open redirect.
    return redirect(target if target.startswith("/") and not target.startswith("//") else fallback)


@login_required
@require_POST
def trajectory_review(request: HttpRequest, trajectory_id: int) -> HttpResponse:
    user = caller(request)
    trajectory = run_selectors.trajectory_for(
        user=user, trajectory_id=trajectory_id, permission=Permission.REVIEW
    )
    fallback = reverse("trajectory-detail", args=[trajectory.pk])
    try:
        services.review_save(
            trajectory=trajectory,
            by=user,
            label=request.POST.get("label", ""),
            comment=request.POST.get("comment", "")[:10_000],
        )
    except ValidationError as exc:
        messages.error(request, f"Not labelled: {_refusal(exc)}")
        return _back(request, fallback)
    messages.success(
        request, f"Trajectory {trajectory.pk} labelled {request.POST['label'].replace('_', ' ')}."
    )
    queue = request.POST.get("queue", "")
    if queue.isdigit():  # working through a queue: straight on to the next item
        return _next_in(request, selectors.queue_for(user=user, queue_id=int(queue)))
    return _back(request, fallback)


BULK_MAX = 500


@login_required
@require_POST
def trajectory_bulk_review(request: HttpRequest, run_id: int) -> HttpResponse:
    """One label for every ticked trajectory of the run (the trajectory browser's selection)."""
    user = caller(request)
    run = run_selectors.run_for(user=user, run_id=run_id, permission=Permission.REVIEW)
    fallback = reverse("trajectory-list", args=[run.pk])
    ids = [int(value) for value in request.POST.getlist("trajectory") if value.isdigit()][:BULK_MAX]
    trajectories = list(run.trajectories.filter(pk__in=ids).order_by("pk"))
    label = request.POST.get("label", "")
    try:
        count = services.review_save_many(
            trajectories=trajectories,
            by=user,
            label=label,
            comment=request.POST.get("comment", "")[:10_000],
        )
    except ValidationError as exc:
        messages.error(request, f"Not labelled: {_refusal(exc)}")
        return _back(request, fallback)
    noun = "trajectory" if count == 1 else "trajectories"
    messages.success(request, f"Labelled {count} {noun} {label.replace('_', ' ')}.")
    return _back(request, fallback)


def _next_in(request: HttpRequest, queue) -> HttpResponse:
    item = services.queue_next(queue=queue, user=caller(request))
    if item is None:
        messages.success(request, "Nothing left for you in this queue.")
        return redirect("review-queue-detail", queue_id=queue.pk)
    if item.trace_id is not None:
        return redirect(f"{reverse('trace-detail', args=[item.trace_id])}?queue={queue.pk}")
    return redirect(f"{reverse('trajectory-detail', args=[item.trajectory_id])}?queue={queue.pk}")


@login_required
@require_POST
def trace_review(request: HttpRequest, trace_id: int) -> HttpResponse:
    user = caller(request)
    trace = trace_selectors.trace_for(user=user, trace_id=trace_id, permission=Permission.REVIEW)
    fallback = reverse("trace-detail", args=[trace.pk])
    try:
        services.review_save(
            trace=trace,
            by=user,
            label=request.POST.get("label", ""),
            comment=request.POST.get("comment", "")[:10_000],
        )
    except ValidationError as exc:
        messages.error(request, f"Not labelled: {_refusal(exc)}")
        return _back(request, fallback)
    messages.success(
        request, f"Trace {trace.external_id} labelled {request.POST['label'].replace('_', ' ')}."
    )
    queue = request.POST.get("queue", "")
    if queue.isdigit():
        return _next_in(request, selectors.queue_for(user=user, queue_id=int(queue)))
    return _back(request, fallback)


@login_required
@require_POST
def trace_queue_create(request: HttpRequest, project_id: int) -> HttpResponse:
    """A review queue over the traces the traces page's filters select."""
    user = caller(request)
    project = project_selectors.project_for(user=user, project_id=project_id, permission=Permission.REVIEW)
    form = TraceFilterSerializer(
        data={k: v for k, v in request.POST.items() if v and k != "csrfmiddlewaretoken"}
    )
    if not form.is_valid():
        messages.error(request, f"Not created: {form.errors}")
        return redirect("trace-list", project_id=project.pk)
    filters = {k: v for k, v in form.validated_data.items() if k not in ("project",)}
    name = request.POST.get("name", "").strip()[:100] or "traces"
    queue = services.queue_create_over_traces(project=project, name=name, filters=filters, by=user)
    messages.success(request, f"Queue {queue.name} created with {queue.items.count()} traces.")
    return redirect("review-queue-detail", queue_id=queue.pk)


@login_required
@require_POST
def trajectory_prefer(request: HttpRequest, trajectory_id: int) -> HttpResponse:
    """This trajectory is better than `other` (or, with better=other, worse)."""
    user = caller(request)
    trajectory = run_selectors.trajectory_for(
        user=user, trajectory_id=trajectory_id, permission=Permission.REVIEW
    )
    fallback = reverse("trajectory-group", args=[trajectory.pk])
    other_id = request.POST.get("other", "")
    if not other_id.isdigit():
        messages.error(request, "Not recorded: choose the other trajectory.")
        return _back(request, fallback)
    other = run_selectors.trajectory_for(user=user, trajectory_id=int(other_id), permission=Permission.REVIEW)
    chosen, rejected = (other, trajectory) if request.POST.get("better") == "other" else (trajectory, other)
    try:
        services.preference_create(
            chosen=chosen, rejected=rejected, by=user, comment=request.POST.get("comment", "")
        )
    except ValidationError as exc:
        messages.error(request, f"Not recorded: {_refusal(exc)}")
        return _back(request, fallback)
    messages.success(request, f"Recorded: trajectory {chosen.pk} is better than {rejected.pk}.")
    return _back(request, fallback)


def _filters_from(data) -> dict:
    filters = {}
    for name in FILTER_FIELDS:
        value = data.get(name, "").strip()
        if not value:
            continue
        if name in NUMBERS:
            try:
                value = NUMBERS[name](value)
            except ValueError as exc:
                raise ValidationError({name: "must be a number"}) from exc
        if name == "flagged":
            value = value in ("1", "true", "yes")
        filters[name] = value
    return filters


@login_required
@require_http_methods(["GET", "POST"])
def queue_list(request: HttpRequest, run_id: int) -> HttpResponse:
    user = caller(request)
    permission = Permission.REVIEW if request.method == "POST" else Permission.VIEW
    run = run_selectors.run_for(user=user, run_id=run_id, permission=permission)
    if request.method == "POST":
        try:
            filters = services.queue_filters_clean(_filters_from(request.POST))
            matching = run_selectors.trajectories_filtered(run.trajectories.all(), **filters).count()
            if not matching:
                # An empty queue has nothing to review, now or later (its items are fixed here).
                total = run.trajectories.count()
                raise ValidationError(
                    f"no trajectory of this run matches these filters (0 of {total}); loosen them"
                )
            queue = services.queue_create(
                run=run,
                name=request.POST.get("name", "").strip()[:100] or "queue",
                filters=filters,
                by=user,
            )
        except ValidationError as exc:
            messages.error(request, f"Not created: {_refusal(exc)}")
        else:
            count = queue.items.count()
            messages.success(
                request, f"Queue {queue.name} created with {count} trajector{'y' if count == 1 else 'ies'}."
            )
            return redirect("review-queue-detail", queue_id=queue.pk)
    access = page_access(user=user, project=run.project)
    context = access | {
        "run": run,
        "queues": selectors.queues_for(user=user).filter(run=run).order_by("-created_at"),
        "can_review": role_allows(access["role"], Permission.REVIEW),
        "labels": Review.Label.choices,
        "outcomes": run.trajectories.model.Outcome.choices,
        "agreement": selectors.agreement_of(run=run),
        "label_names": dict(Review.Label.choices),
    }
    return render(request, "reviews/queue_list.html", context)


@login_required
@require_GET
def queue_detail(request: HttpRequest, queue_id: int) -> HttpResponse:
    user = caller(request)
    queue = selectors.queue_for(user=user, queue_id=queue_id)
    access = page_access(user=user, project=queue.project)
    reviewers = [
        m.user
        for m in Membership.objects.filter(project=queue.project).select_related("user")
        if role_allows(m.role, Permission.REVIEW)
    ]
    items = list(selectors.queue_items_of(queue=queue)[:500])
    context = access | {
        "run": queue.run,
        "queue": queue,
        "items": items,
        "reviewers": reviewers,
        "can_review": role_allows(access["role"], Permission.REVIEW),
        "mine_open": sum(1 for item in items if item.assignee_id == user.pk and item.done_at is None),
        # What "Review next" could give this reviewer: theirs, or an unassigned open item.
        "open_for_me": queue.items.filter(done_at__isnull=True)
        .filter(Q(assignee__isnull=True) | Q(assignee=user.pk))
        .exists(),
    }
    return render(request, "reviews/queue_detail.html", context)


@login_required
@require_POST
def queue_assign(request: HttpRequest, queue_id: int) -> HttpResponse:
    queue = selectors.queue_for(user=caller(request), queue_id=queue_id, permission=Permission.EDIT)
    ids = [int(value) for value in request.POST.getlist("reviewers") if value.isdigit()]
    try:
        count = services.queue_assign(
            queue=queue, reviewer_ids=ids, reassign=bool(request.POST.get("reassign"))
        )
    except ValidationError as exc:
        messages.error(request, f"Not assigned: {_refusal(exc)}")
    else:
        messages.success(request, f"Assigned {count} items.")
    return redirect("review-queue-detail", queue_id=queue.pk)


@login_required
@require_POST
def queue_next(request: HttpRequest, queue_id: int) -> HttpResponse:
    queue = selectors.queue_for(user=caller(request), queue_id=queue_id, permission=Permission.REVIEW)
    return _next_in(request, queue)


@login_required
@require_GET
def run_labels_export(
    request: HttpRequest, run_id: int, extension: str
) -> HttpResponse | StreamingHttpResponse:
    run = run_selectors.run_for(user=caller(request), run_id=run_id)
    if extension not in ("csv", "jsonl"):
        raise Http404("labels export as csv or jsonl")
    if not run.trajectories.filter(reviews__isnull=False).exists():
        messages.warning(
            request, "No labels or comments to export: nobody has reviewed this run's trajectories yet."
        )
        return _back_to_page(request, run)
    return labels_response(request, run, extension)


def _back_to_page(request: HttpRequest, run) -> HttpResponse:
    """The page the export link was on (a path of this site), else the run's page."""
    referer = urlsplit(request.META.get("HTTP_REFERER", ""))
    if (
        referer.netloc == request.get_host()
        and referer.path.startswith("/")
        and not referer.path.startswith("//")
    ):
        return redirect(referer.path)
    return redirect("run-detail", run_id=run.pk)


@login_required
@require_GET
def run_export(request: HttpRequest, run_id: int, export_format: str) -> HttpResponse | StreamingHttpResponse:
    run = run_selectors.run_for(user=caller(request), run_id=run_id)
    if export_format not in exports.FORMATS:
        raise Http404(f"no export format {export_format}; known: {', '.join(exports.FORMATS)}")
    why = exports.empty_reason(run=run, export_format=export_format)
    if why:
        # Not a silent 0-byte file: back to the page, saying why there is nothing to export.
        messages.warning(request, why)
        return _back_to_page(request, run)
    return export_response(request, run, export_format)


@login_required
@require_POST
def train_on_reviews(request: HttpRequest, run_id: int) -> HttpResponse:
    """The run page's Train on reviews: a new version and a run on it, then that run's page."""
    user = caller(request)
    run = run_selectors.run_for(user=user, run_id=run_id, permission=Permission.EDIT)
    steps = request.POST.get("max_steps", "")
    try:
        if steps and (not steps.isdigit() or not 1 <= int(steps) <= 100_000):
            raise ValidationError({"max_steps": "must be a whole number from 1 to 100000"})
        result = training.train_on_reviews(
            run=run,
            by=user,
            method=request.POST.get("method", ""),
            max_steps=int(steps) if steps else None,
        )
    except (ValidationError, StateError) as exc:
        reason = _refusal(exc) if isinstance(exc, ValidationError) else str(exc)
        messages.error(request, f"Not launched: {reason}")
        return redirect("run-detail", run_id=run.pk)
    counts, version = result.counts, result.version
    what = (
        f"{counts['examples']} good completions"
        if "examples" in counts
        else f"{counts['pairs']} preference pairs ({counts['from_preferences']} chosen, "
        f"{counts['from_labels']} from labels)"
    )
    messages.success(
        request,
        f"{version} holds {what} and {counts['heldout_items']} held-out items; "
        f"run {result.run.name} starts from {run.name}'s checkpoint {result.checkpoint.step}, "
        f"beside its control {result.control.name} (the same checkpoint, the same steps, no reviews).",
    )
    return redirect("run-detail", run_id=result.run.pk)

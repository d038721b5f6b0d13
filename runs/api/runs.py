"""Runs over REST: launch, clone and fork; pause, resume, cancel and retry; and the record a run
leaves (events, metrics, trajectories with their steps, checkpoints). Thin, like runs.api.views:
selectors enforce the role, runs.lifecycle decides what may change."""

from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import serializers
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from core.api import NewestFirstCursorPagination, error_body, idempotent
from core.callers import caller
from core.roles import Permission
from core.schema import ErrorSerializer
from core.streaming import streamed_bytes
from core.views import ApiView
from projects import selectors as project_selectors
from projects.models import Project, TaskSetVersion
from rewards.models import RewardRuleVersion
from runs import checkpoint_exports, lifecycle, monitor_settings, monitors, outcomes, scheduling, selectors
from runs.api import run_serializers as s
from runs.lifecycle import RunRequest
from runs.models import Run
from tiers.models import Tier


class OldestFirstPagination(NewestFirstCursorPagination):
    ordering = ("id",)


class StepOrderPagination(NewestFirstCursorPagination):
    ordering = ("index",)


REFERENCES = {
    "task_set_version": (TaskSetVersion.objects.select_related("task_set"), "task_set__project"),
    "reward_rule_version": (RewardRuleVersion.objects.select_related("rule"), "rule__project"),
    "tier": (Tier.objects.all(), "project"),
}


def references(project: Project, data: dict[str, Any]) -> dict[str, Any]:
    """`data` with the ids of versions and tiers replaced by those objects of `project`; an id
    that names none of them is refused by field, all at once."""
    resolved, problems = dict(data), {}
    for field, (queryset, project_path) in REFERENCES.items():
        if field not in data:
            continue
        found = queryset.filter(pk=data[field], **{project_path: project}).first()
        if found is None:
            label = field.replace("_", " ")
            problems[field] = f"no {label} {data[field]} in project {project.name}"
        resolved[field] = found
    if problems:
        raise ValidationError(problems)
    return resolved


def overrides_for(parent: Run, data: dict[str, Any]) -> dict[str, Any]:
    """A clone's or fork's changes; hyperparameters merge over the parent's submitted ones."""
    overrides = references(parent.project, data)
    if "hyperparameters" in overrides:
        overrides["hyperparameters"] = parent.hyperparameters | overrides["hyperparameters"]
    return overrides


def created(run: Run) -> Response:
    return Response(s.RunDetailSerializer(run).data, status=201)


# --- runs ----------------------------------------------------------------------------------

RUN_CONFIGURATION = ("tier_config", "hyperparameters", "resolved", "monitors", "monitor_actions")


class RunListView(ApiView):
    @extend_schema(
        parameters=[s.RunFilterSerializer],
        responses=s.RunSerializer(many=True),
        summary="The runs of the caller's projects, newest first",
    )
    def get(self, request: Request) -> Response:
        filters = self.query(s.RunFilterSerializer)
        # The run's configuration (JSON a list never shows) is left in the database: a page of
        # runs decoded five JSON documents a run for nothing.
        runs = selectors.runs_for(user=caller(request)).defer(*RUN_CONFIGURATION)
        if (project := filters.get("project")) is not None:
            runs = runs.filter(project_id=project)
        if status := filters.get("status"):
            runs = runs.filter(status=status)
        paginator = NewestFirstCursorPagination()
        page = paginator.paginate_queryset(runs, request, view=self) or []  # None only without a page size
        positions = selectors.queue_positions(project_ids=sorted({run.project_id for run in page}))
        reasons = scheduling.queue_reasons(list(page))
        context = {"queue_positions": positions, "queue_reasons": reasons}
        data = s.RunSerializer(page, many=True, context=context).data
        return paginator.get_paginated_response(data)

    @extend_schema(
        request=s.RunCreateSerializer,
        responses={201: s.RunDetailSerializer},
        summary="Launch a run; one that would fail at its first step answers 400 naming every reason",
    )
    @idempotent
    def post(self, request: Request) -> Response:
        data = self.validated(s.RunCreateSerializer)
        project = project_selectors.project_for(
            user=caller(request), project_id=data.pop("project"), permission=Permission.EDIT
        )
        run_request = RunRequest(project=project, **references(project, data))
        return created(lifecycle.run_create(request=run_request, by=caller(request)))


class RunDetailView(ApiView):
    @extend_schema(
        responses=s.RunDetailSerializer,
        summary="A run: status, error, resolved configuration, progress, and its diff against a parent",
    )
    def get(self, request: Request, id: int) -> Response:
        return Response(s.RunDetailSerializer(selectors.run_for(user=caller(request), run_id=id)).data)


class RunActionView(ApiView):
    """POST runs/{id}/<action>: a state that does not allow it answers 409 and changes nothing."""

    change: Callable[..., Run]

    @extend_schema(request=None, responses=s.RunDetailSerializer)
    def post(self, request: Request, id: int) -> Response:
        run = selectors.run_for(user=caller(request), run_id=id, permission=Permission.EDIT)
        return Response(s.RunDetailSerializer(type(self).change(run=run)).data)


@extend_schema_view(
    post=extend_schema(summary="Pause: a queued run at once, a running one after its current step")
)
class RunPauseView(RunActionView):
    change = lifecycle.run_pause


@extend_schema_view(post=extend_schema(summary="Resume a paused run: it queues again"))
class RunResumeView(RunActionView):
    change = lifecycle.run_resume


@extend_schema_view(post=extend_schema(summary="Cancel: a queued or paused run at once, else when it stops"))
class RunCancelView(RunActionView):
    change = lifecycle.run_cancel


@extend_schema_view(post=extend_schema(summary="Retry a failed or cancelled run from its last checkpoint"))
class RunRetryView(RunActionView):
    change = lifecycle.run_retry


class RunCloneView(ApiView):
    @extend_schema(
        request=s.RunOverridesSerializer,
        responses={201: s.RunDetailSerializer},
        summary="A new run with this one's configuration and any changes; shows its diff",
    )
    @idempotent
    def post(self, request: Request, id: int) -> Response:
        run = selectors.run_for(user=caller(request), run_id=id, permission=Permission.EDIT)
        overrides = overrides_for(run, self.validated(s.RunOverridesSerializer))
        return created(lifecycle.run_clone(run=run, by=caller(request), **overrides))


class CheckpointForkView(ApiView):
    @extend_schema(
        request=s.RunOverridesSerializer,
        responses={201: s.RunDetailSerializer},
        summary="A new run that starts from this checkpoint's weights, with any changes; shows its diff",
    )
    @idempotent
    def post(self, request: Request, id: int) -> Response:
        checkpoint = selectors.checkpoint_for(
            user=caller(request), checkpoint_id=id, permission=Permission.EDIT
        )
        overrides = overrides_for(checkpoint.run, self.validated(s.RunOverridesSerializer))
        return created(lifecycle.run_fork(checkpoint=checkpoint, by=caller(request), **overrides))


# --- the record ----------------------------------------------------------------------------


class RunEventListView(ApiView):
    @extend_schema(
        parameters=[s.EventFilterSerializer],
        responses=s.RunEventSerializer(many=True),
        summary="Events, newest first; with `since`, those after that id, oldest first",
    )
    def get(self, request: Request, id: int) -> Response:
        run = selectors.run_for(user=caller(request), run_id=id)
        filters = self.query(s.EventFilterSerializer)
        events = selectors.events_of(run=run, since=filters.get("since"), level=filters.get("level"))
        pagination = NewestFirstCursorPagination if filters.get("since") is None else OldestFirstPagination
        return self.paginated(events, s.RunEventSerializer, pagination)


class RunMetricsView(ApiView):
    @extend_schema(
        parameters=[s.MetricFilterSerializer],
        responses=s.RunMetricsSerializer,
        summary="Metric points grouped by name; `max_points` downsamples and keeps min and max",
    )
    def get(self, request: Request, id: int) -> Response:
        run = selectors.run_for(user=caller(request), run_id=id)
        filters = self.query(s.MetricFilterSerializer)
        series = selectors.metric_series_of(
            run=run,
            names=filters.get("name"),
            since_step=filters.get("since_step"),
            max_points=filters.get("max_points"),
        )
        shown = {step for one in series for step, _ in one["points"]}
        axes = selectors.step_axes_of(run=run, steps=shown)
        return Response(s.RunMetricsSerializer({"run": run.pk, "metrics": series, "axes": axes}).data)


class HeldOutCompareView(ApiView):
    @extend_schema(
        parameters=[s.HeldOutCompareQuerySerializer],
        responses={200: s.HeldOutCompareSerializer, 404: ErrorSerializer, 409: ErrorSerializer},
        summary="Held-out results item by item against another run or this run's start, with a "
        "paired bootstrap interval on the change",
    )
    def get(self, request: Request, id: int) -> Response:
        query = self.query(s.HeldOutCompareQuerySerializer)  # a bad query is named before any lookup
        run = selectors.run_for(user=caller(request), run_id=id)
        other = selectors.run_for(user=caller(request), run_id=query.get("against", run.pk))
        step = query.get("step", outcomes.last_evaluated_step(run.pk))
        default_against = 0 if other.pk == run.pk else outcomes.last_evaluated_step(other.pk)
        against_step = query.get("against_step", default_against)
        if step is None or against_step is None:
            missing = "this run" if step is None else f"run {other.pk}"
            message = f"{missing} has no held-out results item by item yet"
            return Response(error_body(409, message, "against", code="not_evaluated"), status=409)
        comparison = outcomes.heldout_item_comparison(
            before=(other.pk, against_step),
            after=(run.pk, step),
            metric=query["metric"],
            change=query.get("change", ""),
            kind=query.get("kind", ""),
            descending=query["sort"] == "-change",
        )
        body = {"run": run.pk, "step": step, "against": other.pk, "against_step": against_step} | comparison
        return Response(s.HeldOutCompareSerializer(body).data)


class TrajectoryListView(ApiView):
    @extend_schema(
        parameters=[s.TrajectoryFilterSerializer],
        responses=s.TrajectorySerializer(many=True),
        summary="Trajectories of the caller's projects, newest first",
    )
    def get(self, request: Request) -> Response:
        filters = self.query(s.TrajectoryFilterSerializer)
        trajectories = selectors.trajectories_filtered(
            selectors.trajectories_for(user=caller(request)).prefetch_related("reviews"), **filters
        )
        return self.paginated(trajectories, s.TrajectorySerializer)


class TrajectoryGroupView(ApiView):
    pagination_class = None  # a group is one batch's few samples: a plain list, and declared so

    @extend_schema(
        responses=s.TrajectoryDetailSerializer(many=True),
        summary="Every completion for the same prompt in the same batch, in sample order",
    )
    def get(self, request: Request, id: int) -> Response:
        trajectory = selectors.trajectory_for(user=caller(request), trajectory_id=id)
        group = selectors.group_of(trajectory=trajectory).select_related("item").prefetch_related("reviews")
        return Response(s.TrajectoryDetailSerializer(group, many=True).data)


class RunMonitorsView(ApiView):
    @extend_schema(responses=s.RunMonitorsSerializer, summary="The run's alert thresholds")
    def get(self, request: Request, id: int) -> Response:
        return Response(monitors_data(selectors.run_for(user=caller(request), run_id=id)))

    @extend_schema(
        request=s.RunMonitorsInputSerializer,
        responses=s.RunMonitorsSerializer,
        summary="Change alert thresholds and what each monitor does: alert, or pause the run (owners and "
        "launchers)",
    )
    def patch(self, request: Request, id: int) -> Response:
        run = selectors.run_for(user=caller(request), run_id=id, permission=Permission.EDIT)
        data = self.validated(s.RunMonitorsInputSerializer)
        run = monitors.run_monitors_set(run=run, changes=data["thresholds"], actions=data["actions"])
        return Response(monitors_data(run))


def monitors_data(run: Run) -> dict[str, Any]:
    values = monitors.thresholds_of(run)
    rows = [
        {"name": name, "value": values[name], "default": default, "help": monitor_settings.HELP[name]}
        for name, default in monitors.DEFAULTS.items()
    ]
    actions = [
        {"monitor": name, "action": action, "help": monitor_settings.MONITORS[name]}
        for name, action in monitors.actions_of(run).items()
    ]
    return {"run": run.pk, "thresholds": rows, "actions": actions}


class TrajectoryDetailView(ApiView):
    @extend_schema(responses=s.TrajectoryDetailSerializer)
    def get(self, request: Request, id: int) -> Response:
        trajectory = selectors.trajectory_for(user=caller(request), trajectory_id=id)
        return Response(s.TrajectoryDetailSerializer(trajectory).data)


class TrajectoryStepListView(ApiView):
    @extend_schema(
        parameters=[s.StepFilterSerializer],
        responses=s.TrajectoryStepSerializer(many=True),
        summary="The steps in order, each decompressed; `index` opens one without reading the rest",
    )
    def get(self, request: Request, id: int) -> Response:
        trajectory = selectors.trajectory_for(user=caller(request), trajectory_id=id)
        index = self.query(s.StepFilterSerializer).get("index")
        steps = selectors.steps_of(trajectory=trajectory, index=index)
        return self.paginated(steps, s.TrajectoryStepSerializer, StepOrderPagination)


class CheckpointListView(ApiView):
    @extend_schema(
        parameters=[s.CheckpointFilterSerializer],
        responses=s.CheckpointSerializer(many=True),
        summary="Checkpoints of the caller's projects, newest first",
    )
    def get(self, request: Request) -> Response:
        checkpoints = selectors.checkpoints_for(user=caller(request))
        if (run := self.query(s.CheckpointFilterSerializer).get("run")) is not None:
            checkpoints = checkpoints.filter(run_id=run)
        return self.paginated(checkpoints, s.CheckpointSerializer)


class CheckpointDetailView(ApiView):
    @extend_schema(responses=s.CheckpointSerializer)
    def get(self, request: Request, id: int) -> Response:
        checkpoint = selectors.checkpoint_for(user=caller(request), checkpoint_id=id)
        return Response(s.CheckpointSerializer(checkpoint).data)


class GzipRenderer(BaseRenderer):
    """Lets a client ask for the archive by `Accept`; errors stay JSON."""

    media_type = "application/gzip"
    format = "tar.gz"

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        return data if isinstance(data, bytes) else b""


class ZipRenderer(GzipRenderer):
    media_type = "application/zip"
    format = "zip"


class CheckpointExportQuerySerializer(serializers.Serializer):
    archive = serializers.ChoiceField(
        choices=list(checkpoint_exports.ARCHIVES), default="tar.gz", help_text="The archive's format"
    )
    weights = serializers.ChoiceField(
        choices=list(checkpoint_exports.WEIGHTS),
        default="full",
        help_text="full: all weights (a LoRA run's adapter merged into its base); adapter: a LoRA run's "
        "peft adapter as it is",
    )


class CheckpointExportView(ApiView):
    renderer_classes = [JSONRenderer, GzipRenderer, ZipRenderer]

    @extend_schema(
        parameters=[CheckpointExportQuerySerializer],
        responses={
            (200, "application/gzip"): OpenApiResponse(
                OpenApiTypes.BINARY, description="A save_pretrained folder with a model card (README.md)"
            ),
            (200, "application/zip"): OpenApiResponse(OpenApiTypes.BINARY, description="The same, as a zip"),
            (409, "application/json"): OpenApiResponse(
                ErrorSerializer,
                description="The export cannot be made: weights=adapter of a full-weight run, or "
                "weights no longer on disk",
            ),
        },
        summary="Download a checkpoint as a save_pretrained folder with a model card, streamed",
    )
    def get(self, request: Request, id: int, step: int) -> StreamingHttpResponse | Response:
        query = self.query(CheckpointExportQuerySerializer)
        checkpoint = selectors.checkpoint_of_run_for(user=caller(request), run_id=id, step=step)
        try:
            plan = checkpoint_exports.export_plan(checkpoint, query["weights"])
        except checkpoint_exports.ExportError as exc:
            return Response(error_body(409, str(exc), "weights"), status=409)
        archive = query["archive"]
        chunks = checkpoint_exports.archive_chunks(plan.entries, plan.name, archive)
        response = StreamingHttpResponse(
            streamed_bytes(request._request, chunks), content_type=checkpoint_exports.ARCHIVES[archive]
        )
        response["Content-Disposition"] = f'attachment; filename="{plan.name}.{archive}"'
        return response

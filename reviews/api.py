"""Reviews over REST (see shared API.md): labels, preferences, review queues with assignment and
next-item, and exports. Thin: selectors check the role, services the rules."""

import re

from django.http import StreamingHttpResponse
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from core.api import idempotent
from core.callers import caller
from core.roles import Permission
from core.schema import NO_CONTENT
from core.streaming import streamed
from core.views import ApiView
from projects import selectors as project_selectors
from projects.api import NdjsonRenderer
from reviews import exports, results, selectors, services, training
from reviews import serializers as s
from reviews.models import ReviewQueue
from runs import selectors as run_selectors
from runs.api.runs import StepOrderPagination
from runs.models import Trajectory
from traces import selectors as trace_selectors
from traces.models import Trace

# What an export wrote and skipped, in headers: the body is the file itself.
LINES_HEADER = "Flywheel-Export-Lines"
SKIPPED_HEADER = "Flywheel-Export-Skipped"


class PositionPagination(StepOrderPagination):
    ordering = ("position",)


class ReviewListView(ApiView):
    @extend_schema(
        parameters=[s.ReviewFilterSerializer],
        responses=s.ReviewSerializer(many=True),
        summary="Labels on the caller's projects' trajectories, newest first",
    )
    def get(self, request: Request) -> Response:
        filters = self.query(s.ReviewFilterSerializer)
        reviews = selectors.reviews_for(user=caller(request))
        wanted = {
            "trajectory__run_id": filters.get("run"),
            "trajectory_id": filters.get("trajectory"),
            "trace_id": filters.get("trace"),
            "label": filters.get("label"),
            "reviewer_id": filters.get("reviewer"),
        }
        reviews = reviews.filter(**{key: value for key, value in wanted.items() if value is not None})
        return self.paginated(reviews, s.ReviewSerializer)

    @extend_schema(
        request=s.ReviewInputSerializer,
        responses={201: s.ReviewSerializer},
        summary="Label a trajectory or a trace (reviewers); the caller's earlier label on it is replaced",
    )
    @idempotent
    def post(self, request: Request) -> Response:
        data = self.validated(s.ReviewInputSerializer)
        user = caller(request)
        trace: Trace | None = None
        trajectory: Trajectory | None = None
        if "trace" in data:
            trace = trace_selectors.trace_for(user=user, trace_id=data["trace"], permission=Permission.REVIEW)
        else:
            trajectory = run_selectors.trajectory_for(
                user=user, trajectory_id=data["trajectory"], permission=Permission.REVIEW
            )
        review = services.review_save(
            trajectory=trajectory, trace=trace, by=user, label=data["label"], comment=data["comment"]
        )
        return Response(s.ReviewSerializer(review).data, status=201)


class ReviewDetailView(ApiView):
    @extend_schema(responses=s.ReviewSerializer)
    def get(self, request: Request, id: int) -> Response:
        return Response(s.ReviewSerializer(selectors.review_for(user=caller(request), review_id=id)).data)

    @extend_schema(responses=NO_CONTENT, summary="Withdraw a label (its reviewer, or an owner)")
    def delete(self, request: Request, id: int) -> Response:
        user = caller(request)
        review = selectors.review_for(user=user, review_id=id, permission=Permission.REVIEW)
        if review.reviewer_id != user.pk:
            review = selectors.review_for(user=user, review_id=id, permission=Permission.MANAGE)
        services.review_delete(review=review)
        return Response(status=204)


class ReviewExportView(ApiView):
    renderer_classes = [JSONRenderer, NdjsonRenderer]

    @extend_schema(
        parameters=[s.ExportQuerySerializer],
        responses={
            (200, "application/x-ndjson"): OpenApiResponse(
                OpenApiTypes.STR,
                description="One JSON object a line: SFT items or DPO pairs, ready to import as a task set "
                "(or, for kind=labels, one review: its label and comment). "
                f"{LINES_HEADER} says how many lines; {SKIPPED_HEADER} how many records were left out "
                "and why (empty, identical, duplicate, multi_step)",
            )
        },
        summary="Download a run's reviewed data as SFT JSONL or DPO pairs",
    )
    def get(self, request: Request) -> StreamingHttpResponse:
        query = self.query(s.ExportQuerySerializer)
        run = run_selectors.run_for(user=caller(request), run_id=query["run"])
        return export_response(request, run, query["kind"])


def export_response(request, run, export_format: str) -> StreamingHttpResponse:
    if export_format == exports.LABELS_FORMAT:
        return labels_response(request, run, "jsonl")
    lines, export = exports.export_build(run=run, export_format=export_format)
    raw = getattr(request, "_request", request)
    response = StreamingHttpResponse(streamed(raw, iter(lines)), content_type="application/x-ndjson")
    response["Content-Disposition"] = f'attachment; filename="{_file_stem(run)}-{export_format}.jsonl"'
    response[LINES_HEADER] = str(len(lines))
    response[SKIPPED_HEADER] = ", ".join(f"{reason}={count}" for reason, count in export.counts().items())
    return response


def _file_stem(run) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", run.name).strip("-") or "run"


def labels_response(request, run, extension: str) -> StreamingHttpResponse:
    """Every label and comment on the run's trajectories, as JSONL or CSV."""
    rows = exports.review_rows(run)
    csv_wanted = extension == "csv"
    lines = exports.review_csv(rows) if csv_wanted else exports.review_jsonl(rows)
    raw = getattr(request, "_request", request)
    content_type = "text/csv; charset=utf-8" if csv_wanted else "application/x-ndjson"
    response = StreamingHttpResponse(streamed(raw, iter(lines)), content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{_file_stem(run)}-labels.{extension}"'
    response[LINES_HEADER] = str(len(rows))
    return response


class PreferenceListView(ApiView):
    @extend_schema(
        parameters=[s.RunScopeSerializer],
        responses=s.PreferenceSerializer(many=True),
        summary="Pairwise preferences, newest first",
    )
    def get(self, request: Request) -> Response:
        preferences = selectors.preferences_for(user=caller(request))
        if (run := self.query(s.RunScopeSerializer).get("run")) is not None:
            preferences = preferences.filter(run_id=run)
        return self.paginated(preferences, s.PreferenceSerializer)

    @extend_schema(
        request=s.PreferenceInputSerializer,
        responses={201: s.PreferenceSerializer},
        summary="Choose the better of two trajectories for the same prompt (reviewers)",
    )
    @idempotent
    def post(self, request: Request) -> Response:
        user = caller(request)
        data = self.validated(s.PreferenceInputSerializer)
        chosen, rejected = (
            run_selectors.trajectory_for(user=user, trajectory_id=data[key], permission=Permission.REVIEW)
            for key in ("chosen", "rejected")
        )
        preference = services.preference_create(
            chosen=chosen, rejected=rejected, by=user, comment=data["comment"]
        )
        return Response(s.PreferenceSerializer(preference).data, status=201)


class QueueListView(ApiView):
    @extend_schema(
        parameters=[s.QueueScopeSerializer],
        responses=s.ReviewQueueSerializer(many=True),
        summary="Review queues with their progress, newest first",
    )
    def get(self, request: Request) -> Response:
        queues = selectors.queues_for(user=caller(request))
        scope = self.query(s.QueueScopeSerializer)
        if (run := scope.get("run")) is not None:
            queues = queues.filter(run_id=run)
        if (project := scope.get("project")) is not None:
            queues = queues.filter(project_id=project)
        if source := scope.get("source"):
            queues = queues.filter(source=source)
        return self.paginated(queues, s.ReviewQueueSerializer)

    @extend_schema(
        request=s.QueueInputSerializer,
        responses={201: s.ReviewQueueSerializer},
        summary="A queue of a run's trajectories, or a project's traces, matching the filters, oldest "
        "first (reviewers)",
    )
    @idempotent
    def post(self, request: Request) -> Response:
        user = caller(request)
        data = self.validated(s.QueueInputSerializer)
        if data["source"] == ReviewQueue.Source.TRACES:
            project = project_selectors.project_for(
                user=user, project_id=data["project"], permission=Permission.REVIEW
            )
            queue = services.queue_create_over_traces(
                project=project,
                name=data["name"],
                filters=dict(data["trace_filters"]),
                by=user,
                limit=data.get("limit"),
            )
        else:
            run = run_selectors.run_for(user=user, run_id=data["run"], permission=Permission.REVIEW)
            queue = services.queue_create(
                run=run,
                name=data["name"],
                filters=dict(data["filters"]),
                by=user,
                limit=data.get("limit"),
            )
        queue = selectors.queue_for(user=user, queue_id=queue.pk)
        return Response(s.ReviewQueueSerializer(queue).data, status=201)


class QueueDetailView(ApiView):
    @extend_schema(responses=s.ReviewQueueSerializer)
    def get(self, request: Request, id: int) -> Response:
        return Response(s.ReviewQueueSerializer(selectors.queue_for(user=caller(request), queue_id=id)).data)


class QueueItemListView(ApiView):
    @extend_schema(responses=s.QueueItemSerializer(many=True), summary="The queue's items in order")
    def get(self, request: Request, id: int) -> Response:
        queue = selectors.queue_for(user=caller(request), queue_id=id)
        return self.paginated(
            selectors.queue_items_of(queue=queue), s.QueueItemSerializer, PositionPagination
        )


class QueueAssignView(ApiView):
    @extend_schema(
        request=s.AssignInputSerializer,
        responses=s.AssignResultSerializer,
        summary="Deal the queue's open items to reviewers in turn (owners and launchers)",
    )
    def post(self, request: Request, id: int) -> Response:
        queue = selectors.queue_for(user=caller(request), queue_id=id, permission=Permission.EDIT)
        data = self.validated(s.AssignInputSerializer)
        count = services.queue_assign(queue=queue, reviewer_ids=data["reviewers"], reassign=data["reassign"])
        return Response({"assigned": count})


class QueueNextView(ApiView):
    @extend_schema(
        request=None,
        responses={200: s.QueueItemSerializer, 204: OpenApiResponse(description="Nothing left for you")},
        summary="The caller's next unreviewed item: assigned to them, else an unassigned one they claim",
    )
    def post(self, request: Request, id: int) -> Response:
        user = caller(request)
        queue = selectors.queue_for(user=user, queue_id=id, permission=Permission.REVIEW)
        item = services.queue_next(queue=queue, user=user)
        if item is None:
            return Response(status=204)
        return Response(s.QueueItemSerializer(item).data)


class TrainOnReviewsView(ApiView):
    @extend_schema(
        responses=s.TrainingPreviewSerializer,
        summary="What Train on reviews would make of the run's reviews, for SFT and for DPO",
    )
    def get(self, request: Request, id: int) -> Response:
        run = run_selectors.run_for(user=caller(request), run_id=id)
        checkpoint = run_selectors.checkpoint_default(run)
        counts = training.training_counts(run=run)
        return Response({"run": run.pk, "checkpoint": checkpoint.pk if checkpoint else None, **counts})

    @extend_schema(
        request=s.TrainOnReviewsInputSerializer,
        responses={201: s.TrainOnReviewsSerializer},
        summary="A new task-set version from the run's labels and preferences, an SFT or DPO run "
        "on it from the run's final checkpoint, and its control: that checkpoint continued for the same "
        "steps by the run's own method and settings, without the reviews (owners and launchers)",
    )
    @idempotent
    def post(self, request: Request, id: int) -> Response:
        user = caller(request)
        run = run_selectors.run_for(user=user, run_id=id, permission=Permission.EDIT)
        data = self.validated(s.TrainOnReviewsInputSerializer)
        result = training.train_on_reviews(run=run, by=user, **data)
        return Response(s.TrainOnReviewsSerializer(train_on_reviews_data(result)).data, status=201)


def train_on_reviews_data(result: training.TrainOnReviews) -> dict:
    version = result.version
    return {
        "run": result.run,
        "parent": result.run.parent_id,
        "checkpoint": result.run.parent_checkpoint_id,
        "task_set_version": {
            "id": version.pk,
            "task_set": version.task_set_id,
            "task_set_name": version.task_set.name,
            "number": version.number,
            "item_count": version.item_count,
            "split_counts": version.split_counts,
            "created": result.version_created,
        },
        "counts": result.counts,
        "compare_url": f"{reverse('run-compare')}?runs={result.run.pk},{result.run.parent_id}",
        "control": result.control,
        "training": result.training.pk,
        "result_url": reverse("api-review-training", kwargs={"id": result.training.pk}),
    }


class ReviewTrainingView(ApiView):
    @extend_schema(
        responses=s.ReviewTrainingSerializer,
        summary="The result of a Train on reviews: the reviews run's held-out lift over its control "
        "(paired, with the interval), beside each run's own figure against the parent checkpoint",
    )
    def get(self, request: Request, id: int) -> Response:
        training = selectors.review_training_for(user=caller(request), training_id=id)
        return Response(s.ReviewTrainingSerializer(results.review_training_result(training)).data)

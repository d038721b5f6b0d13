"""Traces over REST: report batches of traces (idempotent per trace id), list and search them, read
and delete one, and promote a selection to a task-set version. Thin: selectors check the role,
services the rules."""

from django.core.exceptions import ValidationError
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from core.api import idempotent
from core.callers import caller
from core.roles import Permission
from core.schema import NO_CONTENT
from core.views import ApiView
from projects import selectors as project_selectors
from traces import ingest, selectors, services
from traces import serializers as s


class TraceListView(ApiView):
    @extend_schema(
        parameters=[s.TraceFilterSerializer],
        responses=s.TraceSerializer(many=True),
        summary="Traces of the caller's projects, newest first, searched and filtered",
    )
    def get(self, request: Request) -> Response:
        filters = dict(self.query(s.TraceFilterSerializer))
        traces = selectors.traces_for(user=caller(request)).prefetch_related("reviews")
        if (project := filters.pop("project", None)) is not None:
            traces = traces.filter(project_id=project)
        return self.paginated(selectors.traces_filtered(traces, **filters), s.TraceSerializer)

    @extend_schema(
        request=s.TraceBatchInputSerializer,
        responses={200: s.IngestResultSerializer},
        summary="Report a batch of traces (owners and launchers): each id is created, or updated with "
        "the fields it carries; the same report again changes nothing",
    )
    @idempotent
    def post(self, request: Request) -> Response:
        data = self.validated(s.TraceBatchInputSerializer)
        project = project_selectors.project_for(
            user=caller(request), project_id=data["project"], permission=Permission.EDIT
        )
        result = ingest.traces_ingest(project=project, reports=data["traces"])
        body = {
            "project": project.pk,
            "received": result.received,
            "created": result.created,
            "updated": result.updated,
            "unchanged": result.unchanged,
            "traces": result.traces,
        }
        return Response(s.IngestResultSerializer(body).data)


class TraceDetailView(ApiView):
    @extend_schema(responses=s.TraceSerializer)
    def get(self, request: Request, id: int) -> Response:
        return Response(s.TraceSerializer(selectors.trace_for(user=caller(request), trace_id=id)).data)

    @extend_schema(responses=NO_CONTENT, summary="Delete a trace and its reviews (owners and launchers)")
    def delete(self, request: Request, id: int) -> Response:
        services.trace_delete(
            trace=selectors.trace_for(user=caller(request), trace_id=id, permission=Permission.EDIT)
        )
        return Response(status=204)


class TracePromoteView(ApiView):
    @extend_schema(
        request=s.TracePromoteInputSerializer,
        responses={201: s.PromotionSerializer},
        summary="Turn traces into training data: a new task-set version with an answer item per "
        "correction or good trace, preference pairs for thumbs-down corrections (owners and launchers)",
    )
    @idempotent
    def post(self, request: Request) -> Response:
        data = self.validated(s.TracePromoteInputSerializer)
        project = project_selectors.project_for(
            user=caller(request), project_id=data["project"], permission=Permission.EDIT
        )
        traces = project.traces.prefetch_related("reviews").order_by("pk")
        if "traces" in data:
            traces = traces.filter(pk__in=data["traces"])
            missing = sorted(set(data["traces"]) - set(traces.values_list("pk", flat=True)))
            if missing:
                shown = ", ".join(map(str, missing[:10]))
                raise ValidationError({"traces": f"no trace {shown} in project {project.name}"})
        else:
            filters = {key: value for key, value in data["filters"].items() if key != "project"}
            traces = selectors.traces_filtered(traces, **filters)
        task_set = None
        if "task_set" in data:
            task_set = project.task_sets.filter(pk=data["task_set"]).first()
            if task_set is None:
                raise ValidationError(
                    {"task_set": f"no task set {data['task_set']} in project {project.name}"}
                )
        promotion = services.traces_promote(
            project=project,
            traces=list(traces[: services.PROMOTE_MAX + 1]),
            by=caller(request),
            task_set=task_set,
            task_set_name=data.get("task_set_name", ""),
            split=data.get("split", "train"),
        )
        version = promotion.version
        body = {
            "task_set": version.task_set_id,
            "task_set_version": version.pk,
            "number": version.number,
            "item_count": version.item_count,
            "split_counts": version.split_counts,
            "created": promotion.created,
            "counts": promotion.counts,
        }
        return Response(s.PromotionSerializer(body).data, status=201)

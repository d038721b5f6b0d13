"""Evaluation suites over REST: list and create suites, read one with its versions, add a version,
evaluate a version on a target (a run's policy version, a checkpoint, a tier as it is), and read an
evaluation with its figures and its results per item. Thin: selectors check the role (VIEW to
read, EDIT to create and evaluate), services the rules."""

from django.core.exceptions import ValidationError
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from core.api import NewestFirstCursorPagination, error_body, idempotent
from core.callers import caller
from core.roles import Permission
from core.schema import ErrorSerializer
from core.views import ApiView
from evaluations import selectors, services
from evaluations import serializers as s
from projects import selectors as project_selectors
from projects.serializers import ProjectFilterSerializer
from runs.models import Checkpoint, Run
from tiers.models import Tier


class ResultsInOrderPagination(NewestFirstCursorPagination):
    ordering: tuple[str, ...] = ("id",)  # entry by entry, items in file order: the order they were written


class SuiteListView(ApiView):
    @extend_schema(parameters=[ProjectFilterSerializer], responses=s.SuiteSerializer(many=True))
    def get(self, request: Request) -> Response:
        suites = selectors.suites_for(user=caller(request))
        if (project := self.query(ProjectFilterSerializer).get("project")) is not None:
            suites = suites.filter(project_id=project)
        return self.paginated(suites, s.SuiteSerializer)

    @extend_schema(
        request=s.SuiteCreateSerializer,
        responses={201: s.SuiteDetailSerializer},
        summary="Create an evaluation suite (owners and launchers); with entries, its version 1 too",
    )
    @idempotent
    def post(self, request: Request) -> Response:
        data = self.validated(s.SuiteCreateSerializer)
        project = project_selectors.project_for(
            user=caller(request), project_id=data.pop("project"), permission=Permission.EDIT
        )
        suite = services.suite_create(project=project, by=caller(request), **data)
        return Response(s.SuiteDetailSerializer(suite).data, status=201)


class SuiteDetailView(ApiView):
    @extend_schema(responses=s.SuiteDetailSerializer, summary="A suite with its versions, newest first")
    def get(self, request: Request, id: int) -> Response:
        suite = selectors.suite_for(user=caller(request), suite_id=id)
        data = s.SuiteSerializer(suite).data
        data["versions"] = s.SuiteVersionSerializer(selectors.versions_of(suite=suite), many=True).data
        return Response(data)


class SuiteVersionCreateView(ApiView):
    @extend_schema(
        request=s.SuiteVersionCreateSerializer,
        responses={201: s.SuiteVersionSerializer},
        summary="Add a version (owners and launchers): versions never change, so a change is a new one",
    )
    @idempotent
    def post(self, request: Request, id: int) -> Response:
        suite = selectors.suite_for(user=caller(request), suite_id=id, permission=Permission.EDIT)
        data = self.validated(s.SuiteVersionCreateSerializer)
        version = services.suite_version_create(suite=suite, by=caller(request), **data)
        return Response(s.SuiteVersionSerializer(version).data, status=201)


def _of_project(model, pk: int | None, project_field: str, project_id: int, name: str):
    if pk is None:
        return None
    found = model.objects.filter(pk=pk, **{project_field: project_id}).first()
    if found is None:
        raise ValidationError({name: f"no {name} {pk} in this project"})
    return found


class SuiteEvaluateView(ApiView):
    @extend_schema(
        request=s.EvaluateSerializer,
        responses={201: s.SuiteEvaluationSerializer},
        summary="Evaluate a suite version (default the newest) on one target: a run's policy version "
        "(run, version), a checkpoint, or a tier as it is (owners and launchers); queued on the eval queue",
    )
    @idempotent
    def post(self, request: Request, id: int) -> Response:
        suite = selectors.suite_for(user=caller(request), suite_id=id, permission=Permission.EDIT)
        data = self.validated(s.EvaluateSerializer)
        version = selectors.version_of(suite=suite, number=data.get("suite_version"))
        project_id = suite.project_id
        evaluation = services.suite_evaluate(
            suite_version=version,
            by=caller(request),
            run=_of_project(Run, data.get("run"), "project_id", project_id, "run"),
            version=data.get("version"),
            checkpoint=_of_project(
                Checkpoint, data.get("checkpoint"), "run__project_id", project_id, "checkpoint"
            ),
            tier=_of_project(Tier, data.get("tier"), "project_id", project_id, "tier"),
        )
        return Response(s.SuiteEvaluationSerializer(evaluation).data, status=201)


class SuiteEvaluationDetailView(ApiView):
    @extend_schema(
        responses=s.SuiteEvaluationSerializer,
        summary="An evaluation: its status and figures, overall and per entry",
    )
    def get(self, request: Request, id: int) -> Response:
        evaluation = selectors.evaluation_for(user=caller(request), evaluation_id=id)
        return Response(s.SuiteEvaluationSerializer(evaluation).data)


class SuiteEvaluationResultsView(ApiView):
    @extend_schema(
        parameters=[s.ResultFilterSerializer],
        responses=s.SuiteResultSerializer(many=True),
        summary="An evaluation's results per item (entry by entry): samples, passes, figures and the "
        "first completions",
    )
    def get(self, request: Request, id: int) -> Response:
        evaluation = selectors.evaluation_for(user=caller(request), evaluation_id=id)
        entry = self.query(s.ResultFilterSerializer).get("entry")
        results = selectors.results_of(evaluation=evaluation, entry=entry)
        return self.paginated(results, s.SuiteResultSerializer, pagination=ResultsInOrderPagination)


class SuiteEvaluationCompareView(ApiView):
    @extend_schema(
        parameters=[s.ComparisonQuerySerializer],
        responses={200: s.ComparisonSerializer, 404: ErrorSerializer, 409: ErrorSerializer},
        summary="This evaluation against another of the same suite version, item by item, with a "
        "paired bootstrap interval on the change in pass rate",
    )
    def get(self, request: Request, id: int) -> Response:
        query = self.query(s.ComparisonQuerySerializer)  # a bad query is named before any lookup
        after = selectors.evaluation_for(user=caller(request), evaluation_id=id)
        before = selectors.evaluation_for(user=caller(request), evaluation_id=query["against"])
        if before.suite_version_id != after.suite_version_id:
            message = "compare evaluations of the same suite version (the same items, rules and sampling)"
            return Response(error_body(409, message, "against", code="different_suites"), status=409)
        comparison = selectors.evaluation_comparison(
            before=before, after=after, change=query.get("change", ""), kind=query.get("kind", "")
        )
        return Response(s.ComparisonSerializer(comparison).data)

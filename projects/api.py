"""The REST API of projects, members, tokens and the task library. Thin views: check the input,
ask a selector (which enforces the role) or call a service, serialize the result. Non-members get
404, members whose role does not allow the action 403."""

import json
import re
from typing import Any

from django.http import Http404, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, PolymorphicProxySerializer, extend_schema
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from core.api import NewestFirstCursorPagination, error_body, idempotent
from core.callers import caller
from core.roles import Permission
from core.schema import NO_CONTENT
from core.streaming import streamed
from core.views import ApiView
from projects import selectors, services
from projects import serializers as s
from projects.services import ImportReport
from projects.stub_checks import version_verify
from projects.task_format import resolve_format


class ItemsInFileOrderPagination(NewestFirstCursorPagination):
    ordering = ("position",)


class NewestItemsPagination(NewestFirstCursorPagination):
    # Items of one import share their created_at; the id orders them without ties.
    ordering = ("-id",)


# --- the caller ----------------------------------------------------------------------------


class MeView(ApiView):
    @extend_schema(responses=s.MeSerializer, summary="The caller and their project roles")
    def get(self, request: Request) -> Response:
        user = caller(request)
        return Response(s.MeSerializer({"user": user, "roles": selectors.roles_of(user=user)}).data)


# --- projects and members ------------------------------------------------------------------


class ProjectListView(ApiView):
    @extend_schema(responses=s.ProjectSerializer(many=True), summary="The caller's projects")
    def get(self, request: Request) -> Response:
        return self.paginated(selectors.projects_of(user=caller(request)), s.ProjectSerializer)

    @extend_schema(
        request=s.ProjectInputSerializer,
        responses={201: s.ProjectSerializer},
        summary="Create a project; the caller becomes its owner",
    )
    @idempotent
    def post(self, request: Request) -> Response:
        project = services.project_create(by=caller(request), **self.validated(s.ProjectInputSerializer))
        return Response(s.ProjectSerializer(project).data, status=201)


class ProjectDetailView(ApiView):
    @extend_schema(responses=s.ProjectSerializer)
    def get(self, request: Request, id: int) -> Response:
        project = selectors.project_for(user=caller(request), project_id=id)
        return Response(s.ProjectSerializer(project).data)

    @extend_schema(request=s.ProjectInputSerializer, responses=s.ProjectSerializer, summary="Rename (owners)")
    def patch(self, request: Request, id: int) -> Response:
        project = selectors.project_for(user=caller(request), project_id=id, permission=Permission.MANAGE)
        project = services.project_update(
            project=project, **self.validated(s.ProjectInputSerializer, partial=True)
        )
        return Response(s.ProjectSerializer(project).data)

    @extend_schema(responses=NO_CONTENT, summary="Delete the project and everything in it (owners)")
    def delete(self, request: Request, id: int) -> Response:
        project = selectors.project_for(user=caller(request), project_id=id, permission=Permission.MANAGE)
        services.project_delete(project=project)
        return Response(status=204)


class MemberListView(ApiView):
    @extend_schema(responses=s.MembershipSerializer(many=True))
    def get(self, request: Request, id: int) -> Response:
        project = selectors.project_for(user=caller(request), project_id=id)
        return self.paginated(selectors.memberships_of(project=project), s.MembershipSerializer)

    @extend_schema(
        request=s.MemberCreateSerializer, responses={201: s.MembershipSerializer}, summary="Add (owners)"
    )
    @idempotent
    def post(self, request: Request, id: int) -> Response:
        project = selectors.project_for(user=caller(request), project_id=id, permission=Permission.MANAGE)
        membership = services.member_add(project=project, **self.validated(s.MemberCreateSerializer))
        return Response(s.MembershipSerializer(membership).data, status=201)


class MemberDetailView(ApiView):
    def membership(self, request: Request, id: int, user_id: int):
        return selectors.membership_for(
            user=caller(request), project_id=id, user_id=user_id, permission=Permission.MANAGE
        )

    @extend_schema(
        request=s.MemberUpdateSerializer,
        responses=s.MembershipSerializer,
        summary="Change a role (owners); demoting the last owner answers 409",
    )
    def patch(self, request: Request, id: int, user_id: int) -> Response:
        membership = self.membership(request, id, user_id)
        membership = services.member_set_role(
            membership=membership, **self.validated(s.MemberUpdateSerializer)
        )
        return Response(s.MembershipSerializer(membership).data)

    @extend_schema(responses=NO_CONTENT, summary="Remove a member (owners); the last owner answers 409")
    def delete(self, request: Request, id: int, user_id: int) -> Response:
        services.member_remove(membership=self.membership(request, id, user_id))
        return Response(status=204)


# --- task sets -----------------------------------------------------------------------------


class TaskSetListView(ApiView):
    @extend_schema(parameters=[s.ProjectFilterSerializer], responses=s.TaskSetSerializer(many=True))
    def get(self, request: Request) -> Response:
        task_sets = selectors.task_sets_for(user=caller(request))
        if (project := self.query(s.ProjectFilterSerializer).get("project")) is not None:
            task_sets = task_sets.filter(project_id=project)
        return self.paginated(task_sets, s.TaskSetSerializer)

    @extend_schema(
        request={
            "application/json": s.TaskSetCreateSerializer,
            "multipart/form-data": s.TaskSetCreateImportSerializer,
        },
        responses={
            201: OpenApiResponse(
                s.TaskSetCreatedSerializer, description="Created; with a file, `version` is its first version"
            ),
            200: OpenApiResponse(s.DryRunSerializer, description="With a file and `dry_run`: the report"),
        },
        summary="Create a task set; with a file (multipart), the set and its first version together or, "
        "on any error, neither (400 names each line and field)",
    )
    @idempotent
    def post(self, request: Request) -> Response:
        user = caller(request)
        if "file" not in request.data:
            data = self.validated(s.TaskSetCreateSerializer)
            project = selectors.project_for(
                user=user, project_id=data.pop("project"), permission=Permission.EDIT
            )
            created = services.task_set_create(project=project, by=user, **data)
            return Response(s.TaskSetCreatedSerializer(created).data, status=201)
        data = self.validated(s.TaskSetCreateImportSerializer)
        project = selectors.project_for(user=user, project_id=data.pop("project"), permission=Permission.EDIT)
        upload = data.pop("file")
        file_format, preset = resolve_format(data.pop("format", None), upload.name)
        task_set, report = services.task_set_create_with_import(
            project=project,
            by=user,
            open_stream=lambda: _rewound(upload),  # validated, then imported: read twice
            file_format=file_format,
            preset=preset,
            source_name=upload.name,
            **data,
        )
        if data["dry_run"]:
            return Response(s.DryRunSerializer(report).data)
        if not report.ok:
            return file_errors_response(report)
        return Response(
            s.TaskSetCreatedSerializer(task_set, context={"version": report.version}).data, status=201
        )


def _rewound(upload):
    upload.seek(0)
    return upload  # iterated line by line; never read whole


class TaskSetDetailView(ApiView):
    @extend_schema(responses=s.TaskSetSerializer)
    def get(self, request: Request, id: int) -> Response:
        return Response(
            s.TaskSetSerializer(selectors.task_set_for(user=caller(request), task_set_id=id)).data
        )

    @extend_schema(request=s.TaskSetUpdateSerializer, responses=s.TaskSetSerializer)
    def patch(self, request: Request, id: int) -> Response:
        task_set = selectors.task_set_for(user=caller(request), task_set_id=id, permission=Permission.EDIT)
        data = self.validated(s.TaskSetUpdateSerializer, partial=True)
        return Response(s.TaskSetSerializer(services.task_set_update(task_set=task_set, **data)).data)


ImportOutcome = PolymorphicProxySerializer(
    component_name="ImportOutcome",
    serializers=[s.ImportResultSerializer, s.DryRunSerializer],
    resource_type_field_name=None,
)


class TaskSetImportView(ApiView):
    parser_classes = [MultiPartParser, FormParser]

    @extend_schema(
        request={"multipart/form-data": s.ImportInputSerializer},
        responses={
            201: OpenApiResponse(s.ImportResultSerializer, description="A new version"),
            200: OpenApiResponse(
                ImportOutcome,
                description="The latest version, unchanged (`created`: false); or a dry run's report",
            ),
        },
        summary="Import a JSONL or CSV file as a new version: all of it or, on any error, none",
    )
    @idempotent
    def post(self, request: Request, id: int) -> Response:
        user = caller(request)
        task_set = selectors.task_set_for(user=user, task_set_id=id, permission=Permission.EDIT)
        data = self.validated(s.ImportInputSerializer)
        upload = data["file"]
        file_format, preset = resolve_format(data.get("format"), upload.name)
        report = services.task_set_import(
            task_set=task_set,
            stream=upload,  # iterated line by line; never read whole
            file_format=file_format,
            preset=preset,
            by=user,
            source_name=upload.name,
            split_seed=data.get("split_seed"),
            heldout_fraction=data.get("heldout_fraction"),
            dry_run=data["dry_run"],
        )
        if data["dry_run"]:
            return Response(s.DryRunSerializer(report).data)
        references = None
        if report.ok and data["verify_references"]:
            version = report.version
            assert version is not None  # an import without errors has its version (new or the latest)
            references = version_verify(version=version).to_dict()
            version.refresh_from_db()  # its stub check ran too
        return import_response(report, references)


def import_response(report: ImportReport, references: dict | None = None) -> Response:
    if not report.ok:
        return file_errors_response(report)
    context = {"created": report.created, "references": references}
    data = s.ImportResultSerializer(report.version, context=context).data
    return Response(data, status=201 if report.created else 200)


def file_errors_response(report: ImportReport) -> Response:
    first = report.errors[0]
    more = f" (and {report.error_count - 1} more)" if report.error_count > 1 else ""
    body = error_body(400, f"nothing imported: {first}{more}", "file", [e.as_dict() for e in report.errors])
    body["error"]["error_count"] = report.error_count
    return Response(body, status=400)


# --- versions ------------------------------------------------------------------------------


class VersionListView(ApiView):
    @extend_schema(responses=s.VersionSerializer(many=True))
    def get(self, request: Request, id: int) -> Response:
        task_set = selectors.task_set_for(user=caller(request), task_set_id=id)
        return self.paginated(task_set.versions.all(), s.VersionSerializer)


class VersionDetailView(ApiView):
    @extend_schema(responses=s.VersionSerializer)
    def get(self, request: Request, id: int, number: int) -> Response:
        version = selectors.version_for(user=caller(request), task_set_id=id, number=number)
        return Response(s.VersionSerializer(version).data)


class NdjsonRenderer(BaseRenderer):
    """Lets a client ask for the export with `Accept: application/x-ndjson`; errors stay JSON."""

    media_type = "application/x-ndjson"
    format = "jsonl"

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        return b"" if data is None else json.dumps(data).encode()


class VersionExportView(ApiView):
    renderer_classes = [JSONRenderer, NdjsonRenderer]

    @extend_schema(
        responses={
            (200, "application/x-ndjson"): OpenApiResponse(
                OpenApiTypes.STR, description="One JSON item a line; importing it reproduces the version"
            )
        },
        summary="Download the version as JSONL",
    )
    def get(self, request: Request, id: int, number: int) -> StreamingHttpResponse:
        version = selectors.version_for(user=caller(request), task_set_id=id, number=number)
        lines = services.task_set_export_lines(version=version)
        response = StreamingHttpResponse(
            streamed(request._request, lines), content_type="application/x-ndjson"
        )
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", version.task_set.name).strip("-") or "task-set"
        response["Content-Disposition"] = f'attachment; filename="{name}-v{version.number}.jsonl"'
        return response


class VersionVerifyView(ApiView):
    @extend_schema(
        request=None,
        responses=s.ReferenceReportSerializer,
        summary="Verify references: run each code item's reference solution against its tests in the sandbox "
        "(and a stub of the solution, for items not stub-checked yet)",
    )
    def post(self, request: Request, id: int, number: int) -> Response:
        user = caller(request)
        selectors.task_set_for(user=user, task_set_id=id, permission=Permission.EDIT)
        version = selectors.version_for(user=user, task_set_id=id, number=number)
        report = version_verify(version=version)
        return Response(s.ReferenceReportSerializer(report.to_dict()).data)


class VersionSplitView(ApiView):
    @extend_schema(
        request=s.SplitSettingsSerializer,
        responses={
            201: OpenApiResponse(s.ImportResultSerializer, description="A new version with the new split"),
            200: OpenApiResponse(s.ImportResultSerializer, description="Same split as the latest version"),
        },
        summary="Re-split the version's items by seed and held-out fraction, as a new version",
    )
    @idempotent
    def post(self, request: Request, id: int, number: int) -> Response:
        user = caller(request)
        selectors.task_set_for(user=user, task_set_id=id, permission=Permission.EDIT)
        version = selectors.version_for(user=user, task_set_id=id, number=number)
        data = self.validated(s.SplitSettingsSerializer)
        return import_response(services.task_set_resplit(version=version, by=user, **data))


# --- task items ----------------------------------------------------------------------------


class TaskListView(ApiView):
    @extend_schema(
        parameters=[s.TaskFilterSerializer],
        responses=s.TaskItemSerializer(many=True),
        summary="Browse and search items: of one version in file order, else newest first",
    )
    def get(self, request: Request) -> Response:
        user = caller(request)
        filters = self.query(s.TaskFilterSerializer)
        wanted = {"split": filters.get("split"), "kind": filters.get("kind"), "query": filters.get("q")}
        if (version_id := filters.get("version")) is None:
            items = selectors.items_for(user=user, **wanted)
            return self.paginated(items, s.TaskItemSerializer, NewestItemsPagination)
        version = selectors.version_by_id_for(user=user, version_id=version_id)
        items = selectors.items_of(version=version, **wanted)
        return self.paginated(items, s.TaskItemSerializer, ItemsInFileOrderPagination)


class TaskDetailView(ApiView):
    @extend_schema(responses=s.TaskItemSerializer)
    def get(self, request: Request, id: int) -> Response:
        item = selectors.items_for(user=caller(request)).filter(pk=id).first()
        if item is None:
            raise Http404("no such task")
        return Response(s.TaskItemSerializer(item).data)


# --- tokens --------------------------------------------------------------------------------


class TokenListView(ApiView):
    @extend_schema(responses=s.ApiTokenSerializer(many=True), summary="The caller's tokens, revoked ones too")
    def get(self, request: Request) -> Response:
        return self.paginated(selectors.tokens_of(user=caller(request)), s.ApiTokenSerializer)

    @extend_schema(
        request=s.ApiTokenCreateSerializer,
        responses={201: s.ApiTokenCreatedSerializer},
        summary="Create a token; its secret is in `token`, this once",
    )
    @idempotent(secret_fields=("token",))
    def post(self, request: Request) -> Response:
        token, raw = services.api_token_create(
            user=caller(request), **self.validated(s.ApiTokenCreateSerializer)
        )
        return Response(s.ApiTokenCreatedSerializer(token, context={"raw_token": raw}).data, status=201)


class TokenDetailView(ApiView):
    @extend_schema(responses=NO_CONTENT, summary="Revoke one of the caller's tokens")
    def delete(self, request: Request, id: int) -> Response:
        token = selectors.tokens_of(user=caller(request)).filter(pk=id).first()
        if token is None:
            raise Http404("no such token")
        services.api_token_revoke(token=token)
        return Response(status=204)

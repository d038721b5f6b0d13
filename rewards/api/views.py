"""Thin REST views over rewards.selectors (which enforce the role) and rewards.services."""

from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from core.api import idempotent
from core.callers import caller
from core.roles import Permission
from core.schema import NO_CONTENT, ErrorSerializer
from core.views import ApiView
from projects import selectors as project_selectors
from projects.serializers import ProjectFilterSerializer
from rewards import selectors, services
from rewards.api import serializers as s
from rewards.models import RewardRule

# --- rules ---------------------------------------------------------------------------------


class RewardRuleListView(ApiView):
    @extend_schema(parameters=[ProjectFilterSerializer], responses=s.RewardRuleSerializer(many=True))
    def get(self, request: Request) -> Response:
        rules = selectors.reward_rules_for(user=caller(request))
        if (project := self.query(ProjectFilterSerializer).get("project")) is not None:
            rules = rules.filter(project_id=project)
        return self.paginated(rules, s.RewardRuleSerializer)

    @extend_schema(
        request=s.RewardRuleCreateSerializer,
        responses={201: s.RewardRuleSerializer},
        summary="Create a rule and its version 1; an invalid spec answers 400 naming each place",
    )
    @idempotent
    def post(self, request: Request) -> Response:
        user = caller(request)
        data = self.validated(s.RewardRuleCreateSerializer)
        project = project_selectors.project_for(
            user=user, project_id=data.pop("project"), permission=Permission.EDIT
        )
        rule = services.reward_rule_create(project=project, by=user, **data)
        return Response(s.RewardRuleSerializer(rule).data, status=201)


class RewardRuleDetailView(ApiView):
    @extend_schema(responses=s.RewardRuleSerializer)
    def get(self, request: Request, id: int) -> Response:
        return Response(
            s.RewardRuleSerializer(selectors.reward_rule_for(user=caller(request), rule_id=id)).data
        )

    @extend_schema(
        request=s.RewardRuleUpdateSerializer,
        responses=s.RewardRuleUpdatedSerializer,
        summary="Rename, describe, or give a new spec: a changed spec always creates a new version",
    )
    def patch(self, request: Request, id: int) -> Response:
        user = caller(request)
        rule = selectors.reward_rule_for(user=user, rule_id=id, permission=Permission.EDIT)
        data = self.validated(s.RewardRuleUpdateSerializer, partial=True)
        update = services.reward_rule_update(rule=rule, by=user, **data)
        context = {"version_created": update.version_created}
        return Response(s.RewardRuleUpdatedSerializer(update.rule, context=context).data)

    @extend_schema(responses=NO_CONTENT, summary="Delete a rule no run has used (else 409)")
    def delete(self, request: Request, id: int) -> Response:
        rule = selectors.reward_rule_for(user=caller(request), rule_id=id, permission=Permission.EDIT)
        services.reward_rule_delete(rule=rule)
        return Response(status=204)


class RewardRuleValidateView(ApiView):
    @extend_schema(
        request=s.SpecInputSerializer,
        responses=s.ValidationResultSerializer,
        summary="Check a spec without saving it (the editor calls this as you type)",
    )
    def post(self, request: Request) -> Response:
        problems = services.spec_problems(self.validated(s.SpecInputSerializer)["spec"])
        body = {"valid": not problems, "problems": [{"path": p.path, "message": p.message} for p in problems]}
        return Response(s.ValidationResultSerializer(body).data)


class RewardRuleImportOpenAIView(ApiView):
    @extend_schema(
        request=s.ImportOpenAISerializer,
        responses={201: s.RewardRuleSerializer},
        summary="Create a rule from OpenAI grader JSON, unchanged",
    )
    @idempotent
    def post(self, request: Request) -> Response:
        user = caller(request)
        data = self.validated(s.ImportOpenAISerializer)
        project = project_selectors.project_for(
            user=user, project_id=data.pop("project"), permission=Permission.EDIT
        )
        rule = services.reward_rule_import_openai(project=project, by=user, **data)
        return Response(s.RewardRuleSerializer(rule).data, status=201)


# --- versions ------------------------------------------------------------------------------


class RewardRuleVersionListView(ApiView):
    @extend_schema(responses=s.RewardRuleVersionSerializer(many=True))
    def get(self, request: Request, id: int) -> Response:
        rule = selectors.reward_rule_for(user=caller(request), rule_id=id)
        return self.paginated(selectors.versions_of(rule=rule), s.RewardRuleVersionSerializer)


class RewardRuleVersionDetailView(ApiView):
    @extend_schema(responses=s.RewardRuleVersionSerializer)
    def get(self, request: Request, id: int, number: int) -> Response:
        version = selectors.reward_rule_version_for(user=caller(request), rule_id=id, number=number)
        return Response(s.RewardRuleVersionSerializer(version).data)


class RewardRuleVersionOpenAIView(ApiView):
    @extend_schema(
        responses={
            200: OpenApiResponse(OpenApiTypes.OBJECT, description="The version as OpenAI grader JSON"),
            409: OpenApiResponse(ErrorSerializer, description="The rule uses graders or fields OpenAI lacks"),
        },
        summary="Export as OpenAI grader JSON; a rule using what OpenAI lacks answers 409 naming each place",
    )
    def get(self, request: Request, id: int, number: int) -> Response:
        version = selectors.reward_rule_version_for(user=caller(request), rule_id=id, number=number)
        return Response(services.reward_rule_export_openai(version=version))


def diff_versions(rule: RewardRule, query: dict) -> tuple:
    """The (old, new) versions a diff compares: `to` defaults to the latest, `from` to the one before."""
    latest = selectors.latest_version_of(rule=rule)
    new = selectors.version_of(rule=rule, number=query.get("to") or latest.number)
    old_number = query.get("from") or max(new.number - 1, 1)
    return selectors.version_of(rule=rule, number=old_number), new


class RewardRuleDiffView(ApiView):
    @extend_schema(
        parameters=[s.DiffQuerySerializer],
        responses=s.DiffSerializer,
        summary="A unified diff of two versions' specs (canonical pretty JSON)",
    )
    def get(self, request: Request, id: int) -> Response:
        rule = selectors.reward_rule_for(user=caller(request), rule_id=id)
        old, new = diff_versions(rule, self.query(s.DiffQuerySerializer))
        lines = services.reward_rule_diff(old=old, new=new)
        body = {
            "rule": rule.pk,
            "from": old.number,
            "to": new.number,
            "diff": "".join(f"{line}\n" for line in lines),
            "lines": [{"kind": services.diff_line_kind(line), "text": line} for line in lines],
        }
        return Response(s.DiffSerializer(body).data)


# --- dry-run -------------------------------------------------------------------------------


class RewardRuleDryRunView(ApiView):
    @extend_schema(
        request=s.DryRunInputSerializer,
        responses=s.DryRunResultSerializer,
        summary="Score items and samples with a version; stores nothing. Runs graders in sandboxes, "
        "so it needs the edit permission",
    )
    def post(self, request: Request, id: int) -> Response:
        user = caller(request)
        rule = selectors.reward_rule_for(user=user, rule_id=id, permission=Permission.EDIT)
        data = self.validated(s.DryRunInputSerializer)
        number = data.get("version")
        version = (
            selectors.latest_version_of(rule=rule)
            if number is None
            else selectors.version_of(rule=rule, number=number)
        )
        if "task_set_version" in data:
            try:
                task_set_version = project_selectors.version_by_id_for(
                    user=user, version_id=data["task_set_version"]
                )
            except Http404:
                raise Http404("no such task set version") from None
            items = services.task_items_for_dry_run(version=task_set_version, item_ids=data.get("item_ids"))
        else:
            items = services.pasted_items(data["items"])
        run = services.reward_rule_dry_run(version=version, items=items, samples=data["samples"])
        return Response(s.DryRunResultSerializer(run).data)

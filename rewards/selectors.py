"""Reads of reward rules, always through the caller's role (projects.selectors.require): a rule of a
project the user is not in is reported as absent (404), a role without the permission gets 403."""

from django.contrib.auth.models import User
from django.db.models import Count, Max, QuerySet
from django.http import Http404

from core.roles import Permission
from projects.models import Project, TaskSetVersion
from projects.selectors import require, visible_project_ids
from rewards.models import RewardRule, RewardRuleVersion


def _with_latest(rules: QuerySet[RewardRule]) -> QuerySet[RewardRule]:
    return rules.annotate(latest_number=Max("versions__number"), version_count=Count("versions"))


def reward_rules_for(*, user: User) -> QuerySet[RewardRule]:
    rules = RewardRule.objects.filter(project_id__in=visible_project_ids(user=user))
    return _with_latest(rules.select_related("project"))


def reward_rules_of(*, project: Project) -> QuerySet[RewardRule]:
    return _with_latest(project.reward_rules.all()).order_by("name")


def reward_rule_for(*, user: User, rule_id: int, permission: str = Permission.VIEW) -> RewardRule:
    rule = RewardRule.objects.select_related("project").filter(pk=rule_id).first()
    if rule is None:
        raise Http404("no such reward rule")
    require(user=user, project_id=rule.project_id, permission=permission)
    return rule


def versions_of(*, rule: RewardRule) -> QuerySet[RewardRuleVersion]:
    return rule.versions.select_related("created_by")


def latest_version_of(*, rule: RewardRule) -> RewardRuleVersion:
    # Every rule has one: version 1 is created with it (services.reward_rule_create).
    return rule.versions.select_related("rule").latest("number")


def version_of(*, rule: RewardRule, number: int) -> RewardRuleVersion:
    version = rule.versions.select_related("rule", "created_by").filter(number=number).first()
    if version is None:
        raise Http404(f"{rule.name} has no version {number}")
    return version


def reward_rule_version_for(
    *, user: User, rule_id: int, number: int, permission: str = Permission.VIEW
) -> RewardRuleVersion:
    return version_of(rule=reward_rule_for(user=user, rule_id=rule_id, permission=permission), number=number)


def task_set_versions_of(*, project: Project) -> QuerySet[TaskSetVersion]:
    """The task set versions a dry-run on this project's rules may pick items from."""
    return (
        TaskSetVersion.objects.filter(task_set__project=project)
        .select_related("task_set")
        .order_by("task_set__name", "-number")
    )

"""Reads of tiers and tier evaluations, always through the caller's role (projects.selectors): an
object of a project the user is not in is reported as absent (404), not forbidden."""

from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import Http404

from core.roles import Permission
from projects.selectors import require, visible_project_ids
from tiers.models import Tier, TierEvaluation


def tiers_for(*, user: User) -> QuerySet[Tier]:
    return Tier.objects.filter(project_id__in=visible_project_ids(user=user)).select_related("project")


def tier_for(*, user: User, tier_id: int, permission: str = Permission.VIEW) -> Tier:
    tier = Tier.objects.select_related("project").filter(pk=tier_id).first()
    if tier is None:
        raise Http404("no such tier")
    require(user=user, project_id=tier.project_id, permission=permission)
    return tier


def tier_evaluations_of(*, tier: Tier, limit: int = 50) -> list[TierEvaluation]:
    """The project's latest evaluations that measured the tier, newest first."""
    recent = TierEvaluation.objects.filter(project_id=tier.project_id).select_related("tier")[: limit * 4]
    return [
        evaluation
        for evaluation in recent
        if evaluation.tier_id == tier.pk or any(c.get("id") == tier.pk for c in evaluation.tier_configs)
    ][:limit]


def tier_evaluation_for(
    *, user: User, evaluation_id: int, permission: str = Permission.VIEW
) -> TierEvaluation:
    evaluation = (
        TierEvaluation.objects.select_related("project", "tier", "task_set_version__task_set", "run")
        .filter(pk=evaluation_id)
        .first()
    )
    if evaluation is None:
        raise Http404("no such tier evaluation")
    require(user=user, project_id=evaluation.project_id, permission=permission)
    return evaluation

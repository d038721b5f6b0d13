"""Reads of reward models, through the caller's role in their project (runs.selectors)."""

from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import Http404

from core.roles import Permission
from projects import selectors as project_selectors
from reward_models.models import RewardModel, RewardModelVersion, RunRewardModel
from runs.models import Run


def reward_models_for(*, user: User) -> QuerySet[RewardModel]:
    return RewardModel.objects.filter(project_id__in=project_selectors.visible_project_ids(user=user))


def reward_model_for(*, user: User, reward_model_id: int, permission: str = Permission.VIEW) -> RewardModel:
    reward_model = RewardModel.objects.select_related("project").filter(pk=reward_model_id).first()
    if reward_model is None:
        raise Http404("no such reward model")
    project_selectors.require(user=user, project_id=reward_model.project_id, permission=permission)
    return reward_model


def version_for(*, user: User, version_id: int, permission: str = Permission.VIEW) -> RewardModelVersion:
    version = (
        RewardModelVersion.objects.select_related("reward_model__project", "task_set_version__task_set")
        .filter(pk=version_id)
        .first()
    )
    if version is None:
        raise Http404("no such reward-model version")
    project_selectors.require(user=user, project_id=version.reward_model.project_id, permission=permission)
    return version


def version_of(*, reward_model: RewardModel, number: int) -> RewardModelVersion:
    version = reward_model.versions.select_related("reward_model").filter(number=number).first()
    if version is None:
        raise Http404(f"reward model {reward_model.name} has no version {number}")
    return version


def versions_of(*, reward_model: RewardModel) -> QuerySet[RewardModelVersion]:
    return reward_model.versions.select_related("task_set_version__task_set").order_by("-number")


def trained_version(*, project_id: int, name: str, number: int | None = None) -> RewardModelVersion | None:
    """The project's reward model `name` at version `number`, or its newest trained version."""
    versions = RewardModelVersion.objects.filter(
        reward_model__project_id=project_id,
        reward_model__name=name,
        status=RewardModelVersion.Status.SUCCEEDED,
    )
    if number is not None:
        versions = versions.filter(number=number)
    return versions.select_related("reward_model").order_by("-number").first()


def uses_of_run(*, run: Run) -> QuerySet[RunRewardModel]:
    """The reward-model versions a run's rewards used (for its page and REST)."""
    return run.reward_model_uses.select_related("version__reward_model").order_by("pk")


def runs_using(*, version: RewardModelVersion) -> QuerySet[Run]:
    return Run.objects.filter(reward_model_uses__version=version).order_by("-created_at")

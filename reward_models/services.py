"""Writes of reward models: create one, train a version on a task-set version's preference pairs
(queued, then trained by a learner process on the learner queue), cancel a training, delete.

Every check runs before anything is written: a training that would fail at its first step (no
pairs, pairs the learner cannot read, a base model that cannot be loaded here) is refused at submit
time, naming the field."""

from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from core.exceptions import StateError
from inference.model_sources import model_source_problem
from projects.models import Project, TaskSetVersion
from reward_models import hyperparameters, tasks
from reward_models.models import RewardModel, RewardModelVersion
from reward_models.store import checkpoint_discard
from runs.lifecycle import pair_problems
from tiers.models import Tier

S = RewardModelVersion.Status


def _check_name(project: Project, name: str, exclude_pk: int | None = None) -> str:
    others = RewardModel.objects.filter(project=project, name=name.strip() if name else "")
    if exclude_pk is not None:
        others = others.exclude(pk=exclude_pk)
    name = (name or "").strip()
    if not name:
        raise ValidationError({"name": "is required"})
    if len(name) > 100:
        raise ValidationError({"name": "at most 100 characters"})
    if others.exists():
        raise ValidationError({"name": f"this project already has a reward model named {name!r}"})
    return name


def reward_model_create(*, project: Project, name: str, by: User, description: str = "") -> RewardModel:
    name = _check_name(project, name)
    try:
        with transaction.atomic():
            return RewardModel.objects.create(
                project=project, name=name, description=description, created_by=by
            )
    except IntegrityError:  # created by a concurrent request between the check and the insert
        raise ValidationError({"name": f"this project already has a reward model named {name!r}"}) from None


def reward_model_delete(*, reward_model: RewardModel) -> None:
    if reward_model.versions.filter(status__in=RewardModelVersion.ACTIVE).exists():
        raise StateError(f"reward model {reward_model.name} is training; cancel its training first")
    if reward_model.versions.filter(run_uses__isnull=False).exists():
        raise StateError(f"runs used reward model {reward_model.name}; it is kept for their record")
    reward_model.delete()


def base_model_of(*, project: Project, base_model: str = "", tier: Tier | None = None) -> str:
    """The starting model: given as a path or hub id, or a tier's base model."""
    if tier is not None:
        if tier.project_id != project.pk:
            raise ValidationError({"tier": f"no tier {tier.pk} in project {project.name}"})
        return tier.base_model
    if not base_model.strip():
        raise ValidationError({"base_model": "give a base model (a local path or hub id) or a tier"})
    return base_model.strip()


def training_problems(
    *, version: TaskSetVersion, base_model: str, submitted: dict[str, Any]
) -> tuple[dict, dict]:
    """(resolved hyperparameters, problems by field)."""
    resolved, problems = hyperparameters.resolve(submitted or {})
    problems = {f"hyperparameters.{name}": problem for name, problem in problems.items()}
    pairs = pair_problems(version.items.all())
    if "method" in pairs:
        problems["task_set_version"] = (
            "a reward model trains on preference pairs: items whose metadata holds chosen and rejected "
            "(export reviews as dpo-task-set, promote traces with corrections, or import such a file)"
        )
    elif pairs:
        problems |= pairs
    if settings.FLYWHEEL_HUB_CHECK and (
        problem := model_source_problem(base_model, timeout=settings.FLYWHEEL_HUB_TIMEOUT_SECONDS)
    ):
        problems["base_model"] = problem
    return resolved, problems


@transaction.atomic
def reward_model_train(
    *,
    reward_model: RewardModel,
    task_set_version: TaskSetVersion,
    by: User,
    base_model: str = "",
    tier: Tier | None = None,
    hyperparameters: dict[str, Any] | None = None,
) -> RewardModelVersion:
    """A new version of the reward model, queued for training on the pairs of `task_set_version`."""
    project = reward_model.project
    if task_set_version.task_set.project_id != project.pk:
        raise ValidationError(
            {"task_set_version": f"no task-set version {task_set_version.pk} in project {project.name}"}
        )
    base = base_model_of(project=project, base_model=base_model, tier=tier)
    resolved, problems = training_problems(
        version=task_set_version, base_model=base, submitted=hyperparameters or {}
    )
    if problems:
        raise ValidationError(problems)
    locked = RewardModel.objects.select_for_update().get(pk=reward_model.pk)
    number = (locked.versions.aggregate(top=Max("number"))["top"] or 0) + 1
    version = RewardModelVersion.objects.create(
        reward_model=locked,
        number=number,
        task_set_version=task_set_version,
        base_model=base,
        hyperparameters=resolved,
        created_by=by,
    )
    transaction.on_commit(lambda: tasks.reward_model_train.delay(version.pk))
    return version


def reward_model_version_cancel(*, version: RewardModelVersion) -> RewardModelVersion:
    """A queued training ends at once; a running one at its learner's next step."""
    if RewardModelVersion.objects.filter(pk=version.pk, status=S.QUEUED).update(
        status=S.CANCELLED, finished_at=timezone.now()
    ):
        checkpoint_discard(version)  # one queued again after its host died has a checkpoint
        return RewardModelVersion.objects.get(pk=version.pk)
    if not RewardModelVersion.objects.filter(pk=version.pk, status=S.RUNNING).update(status=S.CANCELLING):
        version.refresh_from_db()
        raise StateError(
            f"version {version.number} is {version.status}; only queued or running training can be cancelled"
        )
    return RewardModelVersion.objects.get(pk=version.pk)

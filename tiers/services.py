"""Writes for tiers and tier evaluations: create, edit and delete a tier, and request an evaluation of
a checkpoint under several tiers (the task beside these, tiers/tasks.py, runs workers/tier_eval.py
on the eval queue). Views, REST, commands and the learner call these; reads go through
tiers.selectors."""

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction

from inference.model_sources import local_path_problem, model_source_problem
from inference.settings import TIER_FIELDS, model_reference_problem, tier_problems, tier_snapshot
from projects.models import Project, TaskItem, TaskSetVersion
from tiers import tasks
from tiers.models import Tier, TierEvaluation
from tiers.run_policies import RunPolicy

MAX_TIERS = 12

# --- tiers ---------------------------------------------------------------------------------


MODEL_FIELDS = ("base_model", "draft_model")


def _check_tier(
    project: Project,
    values: dict[str, Any],
    exclude_pk: int | None = None,
    models: Iterable[str] = MODEL_FIELDS,
) -> None:
    """Refuse settings that cannot run together, a taken name, and a hub model (among `models`,
    the fields being set) that cannot be loaded here."""
    problems = tier_problems(values)
    name = (values.get("name") or "").strip()
    taken = Tier.objects.filter(project=project, name=name)
    if exclude_pk is not None:
        taken = taken.exclude(pk=exclude_pk)
    if not name:
        problems["name"] = "is required"
    elif taken.exists():
        problems["name"] = f"this project already has a tier named {name!r}"
    # A local path must be a folder here (as a hub id must be on the hub): refused at once, not
    # at the first launch. Off with the hub check (FLYWHEEL_HUB_CHECK), as tests with made-up
    # models need.
    for field_name in models if settings.FLYWHEEL_HUB_CHECK else ():
        if field_name not in problems and values.get(field_name):
            if problem := local_path_problem(values[field_name]):
                problems[field_name] = problem
    for field_name in models if settings.FLYWHEEL_HUB_CHECK else ():
        if field_name not in problems and values.get(field_name):
            timeout = settings.FLYWHEEL_HUB_TIMEOUT_SECONDS
            if problem := model_source_problem(values[field_name], timeout=timeout):
                problems[field_name] = problem
    if problems:
        raise ValidationError(problems)


def tier_create(*, project: Project, by: User, **values: Any) -> Tier:
    unknown = set(values) - set(TIER_FIELDS)
    if unknown:
        raise ValidationError({name: "unknown tier setting" for name in sorted(unknown)})
    tier = Tier(project=project, created_by=by, **values)
    _check_tier(project, tier_snapshot(tier))
    tier.save()
    return tier


def tier_update(*, tier: Tier, **values: Any) -> Tier:
    unknown = set(values) - set(TIER_FIELDS)
    if unknown:
        raise ValidationError({name: "unknown tier setting" for name in sorted(unknown)})
    merged = tier_snapshot(tier) | values
    changed = [name for name in MODEL_FIELDS if name in values and values[name] != getattr(tier, name)]
    _check_tier(tier.project, merged, exclude_pk=tier.pk, models=changed)
    for name, value in values.items():
        setattr(tier, name, value)
    tier.save()
    return tier


def tier_delete(*, tier: Tier) -> None:
    tier.delete()


# --- tier evaluations ----------------------------------------------------------------------


def checkpoint_resolve(
    *, tier: Tier, checkpoint: str = "", policy: RunPolicy | None = None
) -> tuple[str, int | None, int | None]:
    """(path, run id, policy version) of what to evaluate: a run's policy version (resolved by
    runs, tiers/run_policies.py), a path or hub id, or the tier's own base model when neither is
    given."""
    if policy is not None:
        return policy.path, policy.run_id, policy.version
    checkpoint = (checkpoint or "").strip() or tier.base_model
    if (problem := model_reference_problem(checkpoint)) is not None:
        raise ValidationError({"checkpoint": problem})
    timeout = settings.FLYWHEEL_HUB_TIMEOUT_SECONDS
    if settings.FLYWHEEL_HUB_CHECK and (problem := model_source_problem(checkpoint, timeout=timeout)):
        raise ValidationError({"checkpoint": problem})
    return checkpoint, None, None


@transaction.atomic
def tier_evaluation_request(
    *,
    tier: Tier,
    by: User | None,
    task_set_version: TaskSetVersion,
    split: str = "heldout",
    compare: list[Tier] | None = None,
    checkpoint: str = "",
    policy: RunPolicy | None = None,
    limit: int | None = None,
) -> TierEvaluation:
    """Record the request and enqueue it on the eval queue once the transaction commits."""
    tiers = [tier] + [other for other in (compare or []) if other.pk != tier.pk]
    tiers = list({t.pk: t for t in tiers}.values())
    problems: dict[str, str] = {}
    if any(other.project_id != tier.project_id for other in tiers):
        problems["compare"] = "every tier compared must belong to the tier's project"
    if len(tiers) > MAX_TIERS:
        problems["compare"] = f"at most {MAX_TIERS} tiers in one evaluation"
    if task_set_version.task_set.project_id != tier.project_id:
        problems["task_set_version"] = "the task set belongs to another project"
    elif not TaskItem.objects.filter(version=task_set_version, split=split).exists():
        problems["split"] = f"the {split} split of {task_set_version} has no items"
    if problems:
        raise ValidationError(problems)
    path, run_id, version = checkpoint_resolve(tier=tier, checkpoint=checkpoint, policy=policy)
    evaluation = TierEvaluation.objects.create(
        project_id=tier.project_id,
        tier=tier,
        tier_configs=[{"id": t.pk} | tier_snapshot(t) for t in tiers],
        checkpoint=path,
        run_id=run_id,
        policy_version=version,
        task_set_version=task_set_version,
        split=split,
        limit=limit,
        created_by=by,
    )
    transaction.on_commit(lambda: _enqueue(evaluation.pk))
    return evaluation


def _enqueue(evaluation_id: int) -> None:
    tasks.tier_evaluate.delay(evaluation_id)

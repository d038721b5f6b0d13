"""Requesting tier evaluations: a checkpoint measured under several tiers (the task beside these,
runs/tasks.py, runs workers/tier_eval.py on the eval queue). Views, REST and the learner call these;
reads go through runs.selectors."""

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction

from inference.model_sources import model_source_problem
from inference.settings import model_reference_problem, tier_snapshot
from projects.models import TaskItem, TaskSetVersion
from runs import tasks
from runs.models import Run, Tier, TierEvaluation
from runs.run_store import policy_dir

MAX_TIERS = 12


def checkpoint_resolve(
    *, tier: Tier, checkpoint: str = "", run: Run | None = None, version: int | None = None
):
    """(path, run, version) of what to evaluate: a run's policy version, a path or hub id, or the
    tier's own base model when neither is given."""
    if run is not None:
        if run.project_id != tier.project_id:
            raise ValidationError({"run": "the run belongs to another project"})
        version = run.policy_version if version is None else version
        if version > run.policy_version:
            raise ValidationError(
                {"version": f"the run has published policy versions 0 to {run.policy_version}"}
            )
        if version == 0:  # version 0 is the run's starting point: its tier's base model
            return run.tier_config.get("base_model") or tier.base_model, run, 0
        return str(policy_dir(run.pk, version)), run, version
    if version is not None:
        raise ValidationError({"version": "a policy version needs a run"})
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
    by: AbstractBaseUser | None,
    task_set_version: TaskSetVersion,
    split: str = "heldout",
    compare: list[Tier] | None = None,
    checkpoint: str = "",
    run: Run | None = None,
    version: int | None = None,
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
    path, run, version = checkpoint_resolve(tier=tier, checkpoint=checkpoint, run=run, version=version)
    evaluation = TierEvaluation.objects.create(
        project_id=tier.project_id,
        tier=tier,
        tier_configs=[{"id": t.pk} | tier_snapshot(t) for t in tiers],
        checkpoint=path,
        run=run,
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


def run_final_evaluate(run_id: int) -> TierEvaluation | None:
    """Evaluate a finished run's final policy across every tier of its project, on its eval split.

    The learner calls this at the end of a run; a second call for the same version does nothing.
    """
    run = Run.objects.select_related("tier", "task_set_version").filter(pk=run_id).first()
    if run is None:
        return None
    tiers = list(Tier.objects.filter(project_id=run.project_id).order_by("name"))
    if not tiers:
        return None
    first = run.tier if run.tier is not None and run.tier in tiers else tiers[0]
    existing = TierEvaluation.objects.filter(run=run, policy_version=run.policy_version).first()
    if existing is not None:
        return existing
    try:
        return tier_evaluation_request(
            tier=first,
            by=None,
            task_set_version=run.task_set_version,
            split=run.eval_split,
            compare=[t for t in tiers if t.pk != first.pk],
            run=run,
            version=run.policy_version,
        )
    except ValidationError:
        return None

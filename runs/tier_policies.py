"""A run's policy versions under tiers: the resolver runs registers for tier evaluations
(tiers/run_policies.py; tiers sit below runs and import none of it), and the evaluation of a
finished run's final policy across its project's tiers, which the learner requests."""

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError

from runs import selectors
from runs.models import Run
from runs.run_store import policy_dir
from tiers import services as tier_services
from tiers.models import Tier, TierEvaluation
from tiers.run_policies import RunPolicy


def run_policy(*, user: User, tier: Tier, run_id: int, version: int | None) -> RunPolicy:
    """The policy version of a run the user may view (Http404 otherwise), to evaluate under `tier`."""
    return policy_of(run=selectors.run_for(user=user, run_id=run_id), tier=tier, version=version)


def policy_of(*, run: Run, tier: Tier, version: int | None) -> RunPolicy:
    """The run's policy version `version` (None: its newest); ValidationError for a run of another
    project than the tier's, or a version the run has not published."""
    if run.project_id != tier.project_id:
        raise ValidationError({"run": "the run belongs to another project"})
    version = run.policy_version if version is None else version
    if version > run.policy_version:
        raise ValidationError({"version": f"the run has published policy versions 0 to {run.policy_version}"})
    if version == 0:  # version 0 is the run's starting point: its tier's base model
        return RunPolicy(run_id=run.pk, version=0, path=run.tier_config.get("base_model") or tier.base_model)
    return RunPolicy(run_id=run.pk, version=version, path=str(policy_dir(run.pk, version)))


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
        return tier_services.tier_evaluation_request(
            tier=first,
            by=None,
            task_set_version=run.task_set_version,
            split=run.eval_split,
            compare=[t for t in tiers if t.pk != first.pk],
            policy=policy_of(run=run, tier=first, version=run.policy_version),
        )
    except ValidationError:
        return None

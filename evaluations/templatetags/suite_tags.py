"""The suite scores of a run's checkpoints, for the run page's checkpoint table. A template tag, so
that the runs app's page shows them without importing this app (which imports runs)."""

from django import template

from evaluations.models import SuiteEvaluation

register = template.Library()


@register.simple_tag
def checkpoint_suite_scores(run_id: int, version: int) -> list[dict]:
    """Each finished suite evaluation of the run's policy `version`: the suite, its version, its
    pass@1 and mean reward overall, newest first, one per suite version."""
    evaluations = (
        SuiteEvaluation.objects.filter(
            run_id=run_id, policy_version=version, status=SuiteEvaluation.Status.SUCCEEDED
        )
        .select_related("suite_version__suite")
        .order_by("-pk")
    )
    scores, seen = [], set()
    for evaluation in evaluations:
        if evaluation.suite_version_id in seen:
            continue
        seen.add(evaluation.suite_version_id)
        overall = (evaluation.metrics or {}).get("overall", {})
        scores.append(
            {
                "evaluation": evaluation.pk,
                "suite": evaluation.suite_version.suite.name,
                "version": evaluation.suite_version.number,
                "pass_at_1": overall.get("pass@1"),
                "mean_reward": overall.get("mean_reward"),
            }
        )
    return scores

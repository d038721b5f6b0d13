"""Reads of evaluation suites, through the caller's role in their project (runs.selectors)."""

from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import Http404

from core.roles import Permission
from evaluations.models import Suite, SuiteEvaluation, SuiteResult, SuiteVersion
from projects import selectors as project_selectors
from runs.outcomes import item_change, paired_compare, rows_chosen


def suites_for(*, user: User) -> QuerySet[Suite]:
    return Suite.objects.filter(project_id__in=project_selectors.visible_project_ids(user=user))


def suite_for(*, user: User, suite_id: int, permission: str = Permission.VIEW) -> Suite:
    suite = Suite.objects.select_related("project").filter(pk=suite_id).first()
    if suite is None:
        raise Http404("no such evaluation suite")
    project_selectors.require(user=user, project_id=suite.project_id, permission=permission)
    return suite


def versions_of(*, suite: Suite) -> QuerySet[SuiteVersion]:
    return suite.versions.prefetch_related(
        "entries__task_set_version__task_set", "entries__reward_rule_version__rule"
    ).order_by("-number")


def version_of(*, suite: Suite, number: int | None) -> SuiteVersion:
    """The suite's version `number`, or its newest."""
    versions = suite.versions.select_related("suite__project")
    version = versions.filter(number=number).first() if number else versions.order_by("-number").first()
    if version is None:
        raise Http404(
            f"suite {suite.name} has no version {number}" if number else f"suite {suite.name} has no version"
        )
    return version


def evaluations_of(*, suite: Suite) -> QuerySet[SuiteEvaluation]:
    """The suite's evaluations, newest first."""
    return (
        SuiteEvaluation.objects.filter(suite_version__suite=suite)
        .select_related("suite_version", "run", "tier")
        .order_by("-created_at", "-id")
    )


def evaluation_for(*, user: User, evaluation_id: int, permission: str = Permission.VIEW) -> SuiteEvaluation:
    evaluation = (
        SuiteEvaluation.objects.select_related("suite_version__suite", "project", "run", "tier")
        .filter(pk=evaluation_id)
        .first()
    )
    if evaluation is None:
        raise Http404("no such suite evaluation")
    project_selectors.require(user=user, project_id=evaluation.project_id, permission=permission)
    return evaluation


def results_of(*, evaluation: SuiteEvaluation, entry: int | None = None) -> QuerySet[SuiteResult]:
    results = evaluation.results.select_related("item")
    return results.filter(entry=entry) if entry is not None else results


def evaluation_comparison(
    *, before: SuiteEvaluation, after: SuiteEvaluation, change: str = "", kind: str = ""
) -> dict:
    """Two evaluations item by item on the items both measured (same suite entry, same item): each
    item's pass rate (passes / samples) before and after, the paired summary with its bootstrap
    interval (runs.outcomes), and the rows filtered by change and kind, largest gain first."""
    sides = [
        {(row.entry, row.item_id): row for row in results_of(evaluation=side) if row.samples}
        for side in (before, after)
    ]
    shared = sorted(set(sides[0]) & set(sides[1]))

    def rate(row: SuiteResult) -> float:
        return row.passes / row.samples

    summary = paired_compare(
        {key: rate(sides[0][key]) for key in shared}, {key: rate(sides[1][key]) for key in shared}
    )
    rows = []
    for key in shared:
        first, second = sides[0][key], sides[1][key]
        rows.append(
            {
                "entry": key[0],
                "item": key[1],
                "external_id": first.item.external_id,
                "kind": first.item.kind,
                "before": rate(first),
                "after": rate(second),
                "change": item_change(rate(first), rate(second)),
                "before_completions": first.completions,
                "after_completions": second.completions,
            }
        )
    chosen = rows_chosen(rows, change=change, kind=kind)
    return {"before": before.pk, "after": after.pk, "summary": summary.as_dict(), "items": chosen}

"""Writes of the review workflow: labels, preferences, queues, assignment and claiming the next item.

Callers pass objects they fetched through a selector, so the role is already checked; these check
the rules (same prompt, reviewers of the project) and notify the run's viewers after commit.
"""

from collections.abc import Iterable
from itertools import cycle
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from core import events
from core.roles import Permission, role_allows
from projects.models import Membership, Project
from reviews.models import Preference, QueueItem, Review, ReviewQueue
from runs import selectors
from runs.models import Run, Trajectory
from traces import selectors as trace_selectors
from traces.models import Trace

QUEUE_MAX_ITEMS = 10_000
QUEUE_FILTERS = {
    "outcome",
    "policy_version",
    "min_reward",
    "max_reward",
    "step",
    "task",
    "flagged",
    "flag",
    "label",
    "batch",
    "item",
}


def _announce(run_id: int, payload: dict[str, Any]) -> None:
    events.run_event(run_id, "review", payload)


@transaction.atomic
def review_save(
    *,
    by: User,
    label: str,
    comment: str = "",
    trajectory: Trajectory | None = None,
    trace: Trace | None = None,
) -> Review:
    """The reviewer's label for the trajectory or the trace (replacing theirs), and its queue
    items done."""
    if label not in Review.Label.values:
        raise ValidationError({"label": f"must be one of {', '.join(Review.Label.values)}"})
    if (trajectory is None) == (trace is None):
        raise ValidationError({"trajectory": "label one trajectory or one trace"})
    subject = {"trajectory": trajectory} if trajectory is not None else {"trace": trace}
    review, _ = Review.objects.update_or_create(
        **subject, reviewer=by, defaults={"label": label, "comment": comment}
    )
    open_items = QueueItem.objects.filter(**subject, done_at__isnull=True)
    open_items.filter(assignee=by).update(done_at=timezone.now())
    open_items.filter(assignee__isnull=True).update(done_at=timezone.now(), assignee=by)
    if trajectory is not None:
        _announce(trajectory.run_id, {"trajectory": trajectory.pk, "label": label, "review": review.pk})
    elif trace is not None:
        events.project_event(trace.project_id, "trace.review", {"trace": trace.pk, "label": label})
    return review


@transaction.atomic
def review_save_many(*, trajectories: Iterable[Trajectory], by: User, label: str, comment: str = "") -> int:
    """The same label (and comment) from one reviewer on each trajectory: a bulk labelling of a
    selection, all or nothing. Returns how many were labelled."""
    count = 0
    for trajectory in trajectories:
        review_save(trajectory=trajectory, by=by, label=label, comment=comment)
        count += 1
    if not count:
        raise ValidationError({"trajectories": "tick at least one trajectory to label"})
    return count


def review_delete(*, review: Review) -> None:
    if review.trace is not None:
        project_id, trace_id = review.trace.project_id, review.trace.pk
        review.delete()
        events.project_event(project_id, "trace.review", {"trace": trace_id, "label": None})
        return
    # A review is of exactly one trace or one trajectory (the model's check constraint).
    assert review.trajectory is not None
    run_id, trajectory_id = review.trajectory.run_id, review.trajectory.pk
    review.delete()
    _announce(run_id, {"trajectory": trajectory_id, "label": None})


@transaction.atomic
def preference_create(*, chosen: Trajectory, rejected: Trajectory, by: User, comment: str = "") -> Preference:
    """`chosen` over `rejected`: two different trajectories of one run for the same prompt."""
    if chosen.pk == rejected.pk:
        raise ValidationError({"rejected": "must be a different trajectory from chosen"})
    if chosen.run_id != rejected.run_id or chosen.item_id != rejected.item_id:
        raise ValidationError(
            {"rejected": f"must answer the same prompt in the same run as trajectory {chosen.pk}"}
        )
    Preference.objects.filter(chosen=rejected, rejected=chosen, reviewer=by).delete()  # changed mind
    preference, _ = Preference.objects.update_or_create(
        chosen=chosen, rejected=rejected, reviewer=by, defaults={"run_id": chosen.run_id, "comment": comment}
    )
    _announce(chosen.run_id, {"preference": preference.pk, "chosen": chosen.pk, "rejected": rejected.pk})
    return preference


def queue_filters_clean(filters: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(filters) - QUEUE_FILTERS)
    if unknown:
        raise ValidationError(
            {"filters": f"unknown filter {', '.join(unknown)}; known: {', '.join(sorted(QUEUE_FILTERS))}"}
        )
    return {key: value for key, value in filters.items() if value not in (None, "")}


@transaction.atomic
def queue_create(
    *, run: Run, name: str, filters: dict[str, Any], by: User, limit: int | None = None
) -> ReviewQueue:
    """A queue of the run's trajectories that match `filters`, oldest first."""
    filters = queue_filters_clean(filters)
    queue = ReviewQueue.objects.create(
        project_id=run.project_id, run=run, name=name, filters=filters, created_by=by
    )
    matching = selectors.trajectories_filtered(run.trajectories.all(), **filters).order_by("pk")
    ids = list(matching.values_list("pk", flat=True)[: min(limit or QUEUE_MAX_ITEMS, QUEUE_MAX_ITEMS)])
    QueueItem.objects.bulk_create(
        QueueItem(queue=queue, trajectory_id=trajectory_id, position=position)
        for position, trajectory_id in enumerate(ids)
    )
    return queue


@transaction.atomic
def queue_create_over_traces(
    *, project: Project, name: str, filters: dict[str, Any], by: User, limit: int | None = None
) -> ReviewQueue:
    """A queue of the project's traces that match `filters` (traces.selectors), oldest first."""
    filters = {key: value for key, value in filters.items() if value not in (None, "")}
    stored = {
        key: value.isoformat() if hasattr(value, "isoformat") else value for key, value in filters.items()
    }
    queue = ReviewQueue.objects.create(
        project=project, source=ReviewQueue.Source.TRACES, name=name, filters=stored, created_by=by
    )
    matching = trace_selectors.traces_filtered(project.traces.all(), **filters).order_by("pk")
    ids = list(matching.values_list("pk", flat=True)[: min(limit or QUEUE_MAX_ITEMS, QUEUE_MAX_ITEMS)])
    QueueItem.objects.bulk_create(
        QueueItem(queue=queue, trace_id=trace_id, position=position) for position, trace_id in enumerate(ids)
    )
    return queue


def _reviewers_of(queue: ReviewQueue, user_ids: Iterable[int]) -> list[User]:
    memberships = {
        m.user_id: m
        for m in Membership.objects.filter(project_id=queue.project_id, user_id__in=user_ids).select_related(
            "user"
        )
    }
    bad = [
        str(user_id)
        for user_id in user_ids
        if user_id not in memberships or not role_allows(memberships[user_id].role, Permission.REVIEW)
    ]
    if bad:
        raise ValidationError({"reviewers": f"not reviewers of this project: user {', '.join(bad)}"})
    return [memberships[user_id].user for user_id in user_ids]


@transaction.atomic
def queue_assign(*, queue: ReviewQueue, reviewer_ids: list[int], reassign: bool = False) -> int:
    """Deal the queue's open items to the reviewers in turn; unassigned ones only unless
    `reassign`. Answers how many items were assigned."""
    if not reviewer_ids:
        raise ValidationError({"reviewers": "name at least one reviewer"})
    reviewers = _reviewers_of(queue, list(dict.fromkeys(reviewer_ids)))
    items = queue.items.filter(done_at__isnull=True)
    if not reassign:
        items = items.filter(assignee__isnull=True)
    pairs = list(zip(items.order_by("position").values_list("pk", flat=True), cycle(reviewers), strict=False))
    for reviewer in reviewers:
        QueueItem.objects.filter(pk__in=[pk for pk, user in pairs if user == reviewer]).update(
            assignee=reviewer
        )
    return len(pairs)


def queue_next(*, queue: ReviewQueue, user: User) -> QueueItem | None:
    """The caller's next open item: one assigned to them, else an unassigned one they claim
    (a conditional update, so two reviewers never claim the same item)."""
    open_items = queue.items.filter(done_at__isnull=True).select_related("trajectory", "trace")
    mine = open_items.filter(assignee=user).first()
    if mine is not None:
        return mine
    for item in open_items.filter(assignee__isnull=True)[:20]:
        if QueueItem.objects.filter(pk=item.pk, assignee__isnull=True).update(assignee=user):
            item.assignee = user
            return item
    return None

"""Reads of the review workflow, through the caller's role in the run's project (runs.selectors)."""

from django.contrib.auth.models import User
from django.db.models import Count, Q, QuerySet
from django.http import Http404

from core.roles import Permission
from projects import selectors as project_selectors
from reviews.models import Preference, QueueItem, Review, ReviewQueue, ReviewTraining


def reviews_for(*, user: User) -> QuerySet[Review]:
    projects = project_selectors.visible_project_ids(user=user)
    return Review.objects.filter(
        Q(trajectory__run__project_id__in=projects) | Q(trace__project_id__in=projects)
    ).select_related("reviewer")


def review_for(*, user: User, review_id: int, permission: str = Permission.VIEW) -> Review:
    review = (
        Review.objects.select_related("trajectory__run", "trace", "reviewer").filter(pk=review_id).first()
    )
    if review is None:
        raise Http404("no such review")
    if review.trace is not None:
        project_id = review.trace.project_id
    else:
        # A review is of exactly one trace or one trajectory (the model's check constraint).
        assert review.trajectory is not None
        project_id = review.trajectory.run.project_id
    project_selectors.require(user=user, project_id=project_id, permission=permission)
    return review


def preferences_for(*, user: User) -> QuerySet[Preference]:
    projects = project_selectors.visible_project_ids(user=user)
    return Preference.objects.filter(run__project_id__in=projects).select_related("reviewer")


def queues_for(*, user: User) -> QuerySet[ReviewQueue]:
    projects = project_selectors.visible_project_ids(user=user)
    return ReviewQueue.objects.filter(project_id__in=projects).annotate(
        item_count=Count("items"), done_count=Count("items", filter=Q(items__done_at__isnull=False))
    )


def queue_for(*, user: User, queue_id: int, permission: str = Permission.VIEW) -> ReviewQueue:
    queue = queues_for(user=user).select_related("run", "project").filter(pk=queue_id).first()
    if queue is None:
        # Also when it exists in a project the caller is not in: absent, not forbidden.
        raise Http404("no such review queue")
    project_selectors.require(user=user, project_id=queue.project_id, permission=permission)
    return queue


def queue_items_of(*, queue: ReviewQueue) -> QuerySet[QueueItem]:
    return queue.items.select_related("trajectory__item", "trace", "assignee").order_by("position")


def labels_of(*, trajectory_ids: list[int]) -> dict[int, list[Review]]:
    """Each trajectory's reviews, for showing labels beside a page of trajectories."""
    found: dict[int, list[Review]] = {}
    for review in Review.objects.filter(trajectory_id__in=trajectory_ids).select_related("reviewer"):
        assert review.trajectory_id is not None  # selected by it
        found.setdefault(review.trajectory_id, []).append(review)
    return found


def agreement_of(*, run) -> dict:
    """How often reviewers agree where two or more labelled the same trajectory of the run:
    `shared` such trajectories, `agreeing` those with one label, `pairwise` the share of reviewer
    pairs on a trajectory that gave the same label, and up to 20 `disagreements` to look at."""
    by_trajectory: dict[int, list[tuple[str, str]]] = {}
    rows = (
        Review.objects.filter(trajectory__run=run)
        .order_by("trajectory_id", "reviewer__username")
        .values_list("trajectory_id", "reviewer__username", "label")
    )
    for trajectory_id, reviewer, label in rows:
        by_trajectory.setdefault(trajectory_id, []).append((reviewer, label))
    shared = {tid: labels for tid, labels in by_trajectory.items() if len(labels) > 1}
    pairs = same = 0
    for labels in shared.values():
        values = [label for _, label in labels]
        for i, first in enumerate(values):
            for second in values[i + 1 :]:
                pairs += 1
                same += first == second
    disagreements = [
        {"trajectory": tid, "labels": labels}
        for tid, labels in sorted(shared.items())
        if len({label for _, label in labels}) > 1
    ]
    return {
        "shared": len(shared),
        "agreeing": len(shared) - len(disagreements),
        "pairwise": same / pairs if pairs else None,
        "disagreements": disagreements[:20],
    }


def review_training_for(*, user: User, training_id: int, permission: str = Permission.VIEW) -> ReviewTraining:
    training = (
        ReviewTraining.objects.select_related("run", "control", "parent").filter(pk=training_id).first()
    )
    if training is None:
        raise Http404("no such Train on reviews")
    project_selectors.require(user=user, project_id=training.parent.project_id, permission=permission)
    return training


def review_training_of(run_id: int) -> ReviewTraining | None:
    """The Train on reviews `run` is the reviews run or the control of, if any."""
    return (
        ReviewTraining.objects.select_related("run", "control", "parent")
        .filter(Q(run_id=run_id) | Q(control_id=run_id))
        .first()
    )

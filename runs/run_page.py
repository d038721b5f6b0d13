"""The parts of the run pages that apps built on runs own: the reward-model versions a run used
(reward_models), the next item of a review queue and the preferences given in a group (reviews).
Each app registers its part in its AppConfig.ready, so the run views import none of those apps."""

from collections.abc import Callable
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.http import HttpRequest

from runs.models import Run, Trajectory

RunSection = Callable[[HttpRequest, Run], dict[str, Any]]
# (trajectory, queue id, user) -> the URL of the queue's next open item, or None at its end.
QueueNext = Callable[[Trajectory, int, "AbstractBaseUser | AnonymousUser"], str | None]

# (the group's trajectories, the page's trajectory) -> None: sets display attributes on the cards.
GroupMarker = Callable[[list[Trajectory], Trajectory], None]

RUN_PAGE: list[RunSection] = []
QUEUE_NEXT: list[QueueNext] = []
GROUP_MARKERS: list[GroupMarker] = []


def run_section_register(section: RunSection) -> None:
    if section not in RUN_PAGE:
        RUN_PAGE.append(section)


def queue_next_register(resolver: QueueNext) -> None:
    if resolver not in QUEUE_NEXT:
        QUEUE_NEXT.append(resolver)


def group_marker_register(marker: GroupMarker) -> None:
    if marker not in GROUP_MARKERS:
        GROUP_MARKERS.append(marker)


def group_mark(group: list[Trajectory], current: Trajectory) -> None:
    for marker in GROUP_MARKERS:
        marker(group, current)


def run_sections(request: HttpRequest, run: Run) -> dict[str, Any]:
    context: dict[str, Any] = {}
    for section in RUN_PAGE:
        context |= section(request, run)
    return context


def queue_next(trajectory: Trajectory, queue_id: int, user: "AbstractBaseUser | AnonymousUser") -> str | None:
    """The first registered answer; None when no app owns queues or the queue has no more."""
    for resolver in QUEUE_NEXT:
        url = resolver(trajectory, queue_id, user)
        if url is not None:
            return url
    return None

"""The reviews parts of the trajectory pages (runs/run_page.py): "next" walks a review queue, and a
group's cards show the preferences already given."""

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Q
from django.urls import reverse

from reviews.models import Preference, QueueItem
from runs.models import Trajectory


def queue_next_url(
    trajectory: Trajectory, queue_id: int, user: AbstractBaseUser | AnonymousUser
) -> str | None:
    """The queue's next open item after this trajectory's, for the user (theirs or unassigned)."""
    here = (
        QueueItem.objects.filter(queue_id=queue_id, trajectory=trajectory)
        .values_list("position", flat=True)
        .first()
    )
    after = QueueItem.objects.filter(
        queue_id=queue_id, done_at__isnull=True, trajectory__isnull=False, position__gt=here or 0
    ).exclude(trajectory=trajectory)
    item = after.filter(Q(assignee=user) | Q(assignee__isnull=True)).order_by("position").first()
    if item is None:
        return None
    return f"{reverse('trajectory-detail', args=[item.trajectory_id])}?queue={queue_id}"


def preferences_mark(group: list[Trajectory], current: Trajectory) -> None:
    """Each card's preferences already given, so a reviewer sees what is recorded: `won` and
    `lost` (the other trajectory's id and the reviewer), and `versus_current` (the chosen id,
    when a preference between it and the page's trajectory exists)."""
    ids = [member.pk for member in group]
    preferences = Preference.objects.filter(chosen_id__in=ids, rejected_id__in=ids).select_related("reviewer")
    won: dict[int, list[tuple[int, str]]] = {pk: [] for pk in ids}
    lost: dict[int, list[tuple[int, str]]] = {pk: [] for pk in ids}
    versus_current: dict[int, int | None] = dict.fromkeys(ids)
    for preference in preferences.order_by("pk"):
        who = preference.reviewer.get_username()
        won[preference.chosen_id].append((preference.rejected_id, who))
        lost[preference.rejected_id].append((preference.chosen_id, who))
        pair = {preference.chosen_id, preference.rejected_id}
        if current.pk in pair and len(pair) == 2:
            versus_current[(pair - {current.pk}).pop()] = preference.chosen_id
    for member in group:
        # Display attributes for the group's cards (runs/trajectory_group.html), not model fields:
        # set through the instance's namespace, since Trajectory declares no such attributes.
        vars(member).update(
            won=won[member.pk], lost=lost[member.pk], versus_current=versus_current[member.pk]
        )

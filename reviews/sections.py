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
    for member in group:
        member.won, member.lost, member.versus_current = [], [], None
    by_id = {member.pk: member for member in group}
    for preference in preferences.order_by("pk"):
        who = preference.reviewer.get_username()
        by_id[preference.chosen_id].won.append((preference.rejected_id, who))
        by_id[preference.rejected_id].lost.append((preference.chosen_id, who))
        pair = {preference.chosen_id, preference.rejected_id}
        if current.pk in pair and len(pair) == 2:
            other = by_id[(pair - {current.pk}).pop()]
            other.versus_current = preference.chosen_id

"""Project roles and what each may do: the one table that pages, REST and websockets consult."""

from django.db import models


class Role(models.TextChoices):
    OWNER = "owner", "Owner"
    LAUNCHER = "launcher", "Launcher"
    REVIEWER = "reviewer", "Reviewer"
    VIEWER = "viewer", "Viewer"


class Permission(models.TextChoices):
    VIEW = "view", "read everything in the project"
    REVIEW = "review", "annotate trajectories"
    EDIT = "edit", "create task sets, reward rules, tiers and launch runs"
    MANAGE = "manage", "manage members and the project itself"
    # Apart from MANAGE so that webhooks can be granted separately later: a webhook's URL and
    # secret reach outside Flywheel, and its deliveries carry every run's status.
    MANAGE_WEBHOOKS = "manage_webhooks", "manage the project's webhooks and see their deliveries"


ROLE_PERMISSIONS: dict[str, frozenset[str]] = {
    Role.OWNER: frozenset(
        {Permission.VIEW, Permission.REVIEW, Permission.EDIT, Permission.MANAGE, Permission.MANAGE_WEBHOOKS}
    ),
    Role.LAUNCHER: frozenset({Permission.VIEW, Permission.REVIEW, Permission.EDIT}),
    Role.REVIEWER: frozenset({Permission.VIEW, Permission.REVIEW}),
    Role.VIEWER: frozenset({Permission.VIEW}),
}


def role_allows(role: str | None, permission: str) -> bool:
    return role is not None and permission in ROLE_PERMISSIONS.get(role, frozenset())

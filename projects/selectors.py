"""Reads, always through the caller's role: what a user may see and do in which project.

Pages, REST and websockets all go through `project_for` and `role_of`, so a role means the same
everywhere. An object of a project the user is not in is reported as absent (404), not forbidden.
"""

from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q, QuerySet
from django.http import Http404

from core.roles import Permission, role_allows  # noqa: F401  (re-exported)
from projects.models import ApiToken, Membership, Project, TaskItem, TaskSet, TaskSetVersion


class NotAMember(Http404):
    pass


def role_of(*, user: User | AnonymousUser, project_id: int) -> str | None:
    if not user.is_authenticated:
        return None
    return Membership.objects.filter(project_id=project_id, user=user).values_list("role", flat=True).first()


def require(*, user: User | AnonymousUser, project_id: int, permission: str) -> str:
    """The user's role in the project, if it allows `permission`; 404 for non-members, else 403."""
    role = role_of(user=user, project_id=project_id)
    if role is None:
        raise NotAMember("no such object")
    if not role_allows(role, permission):
        raise PermissionDenied(
            f"your role in this project ({role}) does not allow this: {Permission(permission).label}"
        )
    return role


def project_for(*, user: User, project_id: int, permission: str = Permission.VIEW) -> Project:
    require(user=user, project_id=project_id, permission=permission)
    return Project.objects.get(pk=project_id)


def projects_of(*, user: User) -> QuerySet[Project]:
    return Project.objects.filter(memberships__user=user).annotate(
        task_set_count=Count("task_sets", distinct=True), tier_count=Count("tiers", distinct=True)
    )


def roles_of(*, user: User) -> QuerySet[Membership]:
    """The user's memberships, each with its project: what /me reports."""
    return Membership.objects.filter(user=user).select_related("project").order_by("project__name")


def memberships_of(*, project: Project) -> QuerySet[Membership]:
    return project.memberships.select_related("user").order_by("user__username")


def membership_for(*, user: User, project_id: int, user_id: int, permission: str) -> Membership:
    require(user=user, project_id=project_id, permission=permission)
    membership = (
        Membership.objects.select_related("user", "project")
        .filter(project_id=project_id, user_id=user_id)
        .first()
    )
    if membership is None:
        raise Http404("no such member")
    return membership


def visible_project_ids(*, user: User) -> QuerySet:
    return Membership.objects.filter(user=user).values("project_id")


def task_sets_for(*, user: User) -> QuerySet[TaskSet]:
    return TaskSet.objects.filter(project_id__in=visible_project_ids(user=user)).select_related("project")


def task_set_for(*, user: User, task_set_id: int, permission: str = Permission.VIEW) -> TaskSet:
    task_set = TaskSet.objects.select_related("project").filter(pk=task_set_id).first()
    if task_set is None:
        raise Http404("no such task set")
    require(user=user, project_id=task_set.project_id, permission=permission)
    return task_set


def version_for(*, user: User, task_set_id: int, number: int) -> TaskSetVersion:
    task_set = task_set_for(user=user, task_set_id=task_set_id)
    version = task_set.versions.filter(number=number).select_related("task_set").first()
    if version is None:
        raise Http404("no such version")
    return version


def grading_items_of(*, version: TaskSetVersion) -> list[dict]:
    """The version's items as graders see them (their data with id, kind and split, and what a
    stub passes once checked), in file order."""
    return [item.grading_dict() for item in version.items.order_by("position")]


def version_by_id_for(*, user: User, version_id: int) -> TaskSetVersion:
    version = TaskSetVersion.objects.select_related("task_set").filter(pk=version_id).first()
    if version is None:
        raise Http404("no such version")
    require(user=user, project_id=version.task_set.project_id, permission=Permission.VIEW)
    return version


def items_of(
    *, version: TaskSetVersion, split: str | None = None, kind: str | None = None, query: str | None = None
) -> QuerySet[TaskItem]:
    return _items_filtered(version.items.all(), split=split, kind=kind, query=query).order_by("position")


def _items_filtered(
    items: QuerySet[TaskItem], *, split: str | None, kind: str | None, query: str | None
) -> QuerySet[TaskItem]:
    if split:
        items = items.filter(split=split)
    if kind:
        items = items.filter(kind=kind)
    if query:
        items = items.filter(Q(text__icontains=query) | Q(external_id__icontains=query))
    return items


def items_for(
    *, user: User, split: str | None = None, kind: str | None = None, query: str | None = None
) -> QuerySet[TaskItem]:
    items = TaskItem.objects.filter(
        version__task_set__project_id__in=visible_project_ids(user=user), version__published=True
    )
    return _items_filtered(items, split=split, kind=kind, query=query)


def tokens_of(*, user: User) -> QuerySet[ApiToken]:
    return user.api_tokens.select_related("default_project").order_by("-created_at")


def user_for_token(*, digest: str) -> User | None:
    token = token_for(digest=digest)
    return None if token is None else token.user


def token_for(*, digest: str) -> ApiToken | None:
    """The live token with this digest, its user loaded; None if unknown, revoked or inactive."""
    token = ApiToken.objects.select_related("user").filter(digest=digest, revoked_at__isnull=True).first()
    if token is None or not token.user.is_active:
        return None
    return token


def page_access(*, user: User, project: Project) -> dict[str, Any]:
    """The user's role and what it allows, for showing the role and hiding unusable buttons."""
    role = role_of(user=user, project_id=project.pk)
    return {
        "project": project,
        "role": role,
        "can_edit": role_allows(role, Permission.EDIT),
        "can_manage": role_allows(role, Permission.MANAGE),
        "can_manage_webhooks": role_allows(role, Permission.MANAGE_WEBHOOKS),
    }

"""Reads for webhooks, through the caller's role (projects.selectors.require): only roles with
MANAGE_WEBHOOKS see a project's webhooks and deliveries; non-members get 404, other members 403."""

from datetime import datetime, timedelta

from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import Http404

from core.roles import ROLE_PERMISSIONS, Permission
from projects.models import Membership, Project
from projects.selectors import require
from webhooks.models import Webhook, WebhookDelivery

# A delivery overdue by this much is handed to the workers again by the tick; sooner, its own
# message is most likely still on its way.
RESEND_AFTER_SECONDS = 60
RESEND_BATCH = 500


def webhooks_for(*, user: User) -> QuerySet[Webhook]:
    """The webhooks of every project where the user's role manages them."""
    roles = [role for role, allowed in ROLE_PERMISSIONS.items() if Permission.MANAGE_WEBHOOKS in allowed]
    projects = Membership.objects.filter(user=user, role__in=roles).values("project_id")
    return Webhook.objects.filter(project_id__in=projects)


def webhooks_of(*, project: Project) -> QuerySet[Webhook]:
    return project.webhooks.order_by("-created_at", "-id")


def webhook_for(*, user: User, webhook_id: int) -> Webhook:
    webhook = Webhook.objects.select_related("project").filter(pk=webhook_id).first()
    if webhook is None:
        raise Http404("no such webhook")
    require(user=user, project_id=webhook.project_id, permission=Permission.MANAGE_WEBHOOKS)
    return webhook


def deliveries_of(*, webhook: Webhook, status: str | None = None) -> QuerySet[WebhookDelivery]:
    deliveries = webhook.deliveries.all()
    return deliveries if status is None else deliveries.filter(status=status)


def delivery_for(*, webhook: Webhook, delivery_id: int) -> WebhookDelivery:
    delivery = webhook.deliveries.filter(pk=delivery_id).first()
    if delivery is None:
        raise Http404("no such delivery")
    return delivery


def recent_deliveries_of(*, project: Project, limit: int = 20) -> list[WebhookDelivery]:
    deliveries = WebhookDelivery.objects.filter(webhook__project=project).select_related("webhook", "run")
    return list(deliveries.order_by("-created_at", "-id")[:limit])


def deliveries_overdue(*, now: datetime) -> list[int]:
    """Pending deliveries of active webhooks whose due time passed a while ago, oldest first."""
    overdue = WebhookDelivery.objects.filter(
        status=WebhookDelivery.Status.PENDING,
        webhook__active=True,
        next_attempt_at__lte=now - timedelta(seconds=RESEND_AFTER_SECONDS),
    )
    return list(overdue.order_by("next_attempt_at").values_list("pk", flat=True)[:RESEND_BATCH])

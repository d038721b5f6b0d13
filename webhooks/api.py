"""Webhooks over REST (see shared API.md). Only roles with MANAGE_WEBHOOKS (owners) reach them:
the selectors answer 404 to non-members and 403 to other members."""

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from core.api import idempotent
from core.callers import caller
from core.roles import Permission
from core.schema import NO_CONTENT
from core.views import ApiView
from projects import selectors as project_selectors
from webhooks import selectors, services
from webhooks import serializers as s


class WebhookListView(ApiView):
    @extend_schema(
        parameters=[s.WebhookFilterSerializer],
        responses=s.WebhookSerializer(many=True),
        summary="Webhooks of the projects the caller manages (of one with ?project=), newest first",
    )
    def get(self, request: Request) -> Response:
        project_id = self.query(s.WebhookFilterSerializer).get("project")
        if project_id is None:
            return self.paginated(selectors.webhooks_for(user=caller(request)), s.WebhookSerializer)
        project = project_selectors.project_for(
            user=caller(request), project_id=project_id, permission=Permission.MANAGE_WEBHOOKS
        )
        return self.paginated(selectors.webhooks_of(project=project), s.WebhookSerializer)

    @extend_schema(
        request=s.WebhookCreateSerializer,
        responses={201: s.WebhookCreatedSerializer},
        summary="Add a webhook (owners); its signing secret is in `secret`, this once",
    )
    @idempotent(secret_fields=("secret",))
    def post(self, request: Request) -> Response:
        data = self.validated(s.WebhookCreateSerializer)
        project = project_selectors.project_for(
            user=caller(request), project_id=data.pop("project"), permission=Permission.MANAGE_WEBHOOKS
        )
        webhook = services.webhook_create(project=project, by=caller(request), **data)
        return Response(s.WebhookCreatedSerializer(webhook).data, status=201)


class WebhookDetailView(ApiView):
    @extend_schema(responses=s.WebhookSerializer)
    def get(self, request: Request, id: int) -> Response:
        return Response(s.WebhookSerializer(selectors.webhook_for(user=caller(request), webhook_id=id)).data)

    @extend_schema(
        request=s.WebhookUpdateSerializer,
        responses=s.WebhookSerializer,
        summary="Change the URL, description, statuses or active flag (owners)",
    )
    def patch(self, request: Request, id: int) -> Response:
        webhook = selectors.webhook_for(user=caller(request), webhook_id=id)
        data = self.validated(s.WebhookUpdateSerializer, partial=True)
        return Response(s.WebhookSerializer(services.webhook_update(webhook=webhook, **data)).data)

    @extend_schema(responses=NO_CONTENT, summary="Remove a webhook and its deliveries (owners)")
    def delete(self, request: Request, id: int) -> Response:
        services.webhook_delete(webhook=selectors.webhook_for(user=caller(request), webhook_id=id))
        return Response(status=204)


class WebhookDeliveryListView(ApiView):
    @extend_schema(
        parameters=[s.DeliveryFilterSerializer],
        responses=s.WebhookDeliverySerializer(many=True),
        summary="The webhook's deliveries, newest first, with their attempts and last answer",
    )
    def get(self, request: Request, id: int) -> Response:
        webhook = selectors.webhook_for(user=caller(request), webhook_id=id)
        status = self.query(s.DeliveryFilterSerializer).get("status")
        return self.paginated(
            selectors.deliveries_of(webhook=webhook, status=status), s.WebhookDeliverySerializer
        )


class WebhookRedeliverView(ApiView):
    @extend_schema(
        request=None,
        responses={202: s.WebhookDeliverySerializer},
        summary="Send a delivered or failed delivery again (same id and body); a pending one answers 409",
    )
    def post(self, request: Request, id: int, delivery_id: int) -> Response:
        webhook = selectors.webhook_for(user=caller(request), webhook_id=id)
        delivery = selectors.delivery_for(webhook=webhook, delivery_id=delivery_id)
        delivery = services.delivery_redeliver(delivery=delivery)
        return Response(s.WebhookDeliverySerializer(delivery).data, status=202)


class WebhookPingView(ApiView):
    @extend_schema(
        request=None,
        responses={202: s.WebhookDeliverySerializer},
        summary="Send a test event (type ping) to the webhook; an inactive one answers 409",
    )
    def post(self, request: Request, id: int) -> Response:
        webhook = selectors.webhook_for(user=caller(request), webhook_id=id)
        return Response(s.WebhookDeliverySerializer(services.webhook_ping(webhook=webhook)).data, status=202)


class WebhookSecretRotateView(ApiView):
    @extend_schema(
        request=None,
        responses=s.WebhookSecretSerializer,
        summary="A new signing secret (owners), in `secret` this once; the old one also signs for 24 h",
    )
    @idempotent(secret_fields=("secret",))
    def post(self, request: Request, id: int) -> Response:
        webhook = selectors.webhook_for(user=caller(request), webhook_id=id)
        secret = services.webhook_secret_rotate(webhook=webhook)
        return Response(s.WebhookSecretSerializer({"webhook": webhook, "secret": secret}).data)

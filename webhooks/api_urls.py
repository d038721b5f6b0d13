"""The webhooks REST API, included at /api/v1/ beside the other apps' api_urls (see shared API.md)."""

from django.urls import path

from webhooks import api

urlpatterns = [
    path("webhooks", api.WebhookListView.as_view(), name="api-webhooks"),
    path("webhooks/<int:id>", api.WebhookDetailView.as_view(), name="api-webhook"),
    path(
        "webhooks/<int:id>/deliveries", api.WebhookDeliveryListView.as_view(), name="api-webhook-deliveries"
    ),
    path(
        "webhooks/<int:id>/deliveries/<int:delivery_id>/redeliver",
        api.WebhookRedeliverView.as_view(),
        name="api-webhook-redeliver",
    ),
    path("webhooks/<int:id>/ping", api.WebhookPingView.as_view(), name="api-webhook-ping"),
    path("webhooks/<int:id>/rotate-secret", api.WebhookSecretRotateView.as_view(), name="api-webhook-rotate"),
]

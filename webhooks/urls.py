from django.urls import path

from webhooks import views

urlpatterns = [
    path("projects/<int:project_id>/webhooks/", views.webhook_list, name="webhook-list"),
    path("webhooks/<int:webhook_id>/delete/", views.webhook_delete, name="webhook-delete"),
    path("webhooks/<int:webhook_id>/ping/", views.webhook_ping, name="webhook-ping"),
    path("webhooks/<int:webhook_id>/rotate-secret/", views.webhook_rotate, name="webhook-rotate"),
    path(
        "webhooks/<int:webhook_id>/deliveries/<int:delivery_id>/redeliver/",
        views.delivery_redeliver,
        name="webhook-redeliver",
    ),
]

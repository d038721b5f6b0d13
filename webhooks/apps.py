from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    verbose_name = "Webhooks on run status changes and their deliveries"

    def ready(self) -> None:
        # Runs calls its listeners inside the transaction that writes a status change or an alert,
        # so the deliveries written here commit with it (the outbox); runs imports nothing of ours.
        from runs.listeners import ALERT_LISTENERS, STATUS_LISTENERS, listener_add
        from webhooks.services import alert_deliveries_enqueue, deliveries_enqueue

        listener_add(STATUS_LISTENERS, deliveries_enqueue)
        listener_add(ALERT_LISTENERS, alert_deliveries_enqueue)

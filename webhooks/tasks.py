"""The Celery task that webhooks' services enqueue: thin, idempotent, an id in."""

from celery import shared_task


@shared_task(name="workers.eval.webhook", acks_late=True, ignore_result=True)
def webhook_deliver(delivery_id: int) -> None:
    """POST one webhook delivery; a duplicated message finds it claimed, settled or not yet due."""
    from webhooks.services import delivery_attempt

    delivery_attempt(delivery_id=delivery_id)

"""The Celery task that tier evaluation requests enqueue (tiers/services.py): thin, idempotent, an id
in. Its body imports the worker code late, inside the task, so the web process that enqueues it
loads none of it. The name keeps its `workers.eval.` prefix: it routes to the eval queue, and
queued messages and running workers know the task by it."""

from celery import shared_task


@shared_task(name="workers.eval.tier", acks_late=True, ignore_result=True)
def tier_evaluate(evaluation_id: int) -> None:
    """Evaluate a checkpoint under tiers (a TierEvaluation); a redelivery finds it claimed."""
    from workers.tier_eval import tier_evaluation_run

    tier_evaluation_run(evaluation_id)

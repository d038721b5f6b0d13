"""The sweeps' Celery task: a pass of the driver, ids in. A second delivery is one more pass,
which changes only what changed since (the driver settles, prunes and launches idempotently). Its
name routes it to the learner queue beside the scheduler's own pass (runs_schedule)."""

from celery import shared_task


@shared_task(name="workers.learner.sweep_advance", acks_late=True, ignore_result=True)
def sweep_advance(sweep_id: int) -> None:
    from sweeps.driver import sweep_advance as advance

    advance(sweep_id=sweep_id)

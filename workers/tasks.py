"""Celery tasks: thin, idempotent, ids in. Each fetches by id, guards against redelivery with a
conditional update, and calls a service. Long work never runs in a task body: the learner is a
supervised process of its own."""

from celery import shared_task


@shared_task(name="workers.learner.runs_schedule", acks_late=True, ignore_result=True)
def runs_schedule() -> None:
    """Start the queued runs that their projects' quotas allow (a redelivery finds nothing to do)."""
    from runs.scheduling import runs_admit

    runs_admit()

"""The Celery task the Tinker API's sampling enqueues: thin, ids in (its name routes it to the
rollout queue, whose workers keep policies resident). The body imports the worker code late, so
the web process that enqueues it loads none of it."""

from celery import shared_task


@shared_task(name="workers.rollout.tinker_sample", acks_late=True, ignore_result=True)
def tinker_sample(request_id: int) -> None:
    """Sample a Tinker request; a redelivery finds it taken and does nothing."""
    from workers.tinker_sampling import sample_run

    sample_run(request_id)

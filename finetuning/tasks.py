"""The Celery task that fine-tuning jobs' services enqueue: thin, idempotent, an id in. On the eval
queue: validating a file and building its task set version is a worker's light work, not a web
request's."""

from celery import shared_task


@shared_task(name="workers.eval.fine_tuning_job_launch", acks_late=True, ignore_result=True)
def job_launch(job_id: str) -> None:
    """Validate a job's files and launch its run; a redelivery finds it launched, failed or
    cancelled and does nothing."""
    from finetuning.jobs import job_launch as launch

    launch(job_id=job_id)

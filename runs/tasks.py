"""The Celery tasks that runs' services enqueue: thin, idempotent, ids in. Each body imports the
worker code that does the work late, inside the task, so the web process that enqueues them loads
none of it. The names keep their `workers.*` prefix: they route to the control, learner and eval queues, and
queued messages and running workers know the tasks by them."""

from celery import shared_task


@shared_task(name="workers.control.runs_schedule", acks_late=True, ignore_result=True)
def runs_schedule() -> None:
    """Restart learners that died and start the queued runs that their projects' quotas allow."""
    from workers.supervisor import runs_tick

    runs_tick()


@shared_task(name="workers.learner.supervise", acks_late=True, ignore_result=True)
def learner_supervise(run_id: int) -> None:
    from workers.supervisor import learner_supervise as supervise

    supervise(run_id)


@shared_task(name="workers.eval.stub_check", acks_late=True, ignore_result=True)
def version_stub_check(version_id: int) -> None:
    """Run a new version's stub check (rewards/stub_checks.py) in the eval workers' sandboxes; a
    redelivery checks only the items not checked yet."""
    from rewards.stub_checks import version_stub_check_run

    version_stub_check_run(version_id=version_id)

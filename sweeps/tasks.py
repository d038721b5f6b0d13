"""The sweeps' Celery task: a pass of the driver, ids in. A second delivery is one more pass,
which changes only what changed since (the driver settles, prunes and launches idempotently). Its
name routes it to the eval queue, not the learner's: a learner worker is busy with a trial's run for
as long as the run lasts (supervising it), and a pass that waited behind it would stop that run only
once it had ended. An eval worker runs short tasks, and the held-out evaluation that reports the
sweep's objective runs there too."""

from celery import shared_task


@shared_task(name="workers.eval.sweep_advance", acks_late=True, ignore_result=True)
def sweep_advance(sweep_id: int) -> None:
    from sweeps.driver import sweep_advance as advance

    advance(sweep_id=sweep_id)

"""The Celery task that reward models' services enqueue: ids in, a claim that makes a second
delivery harmless, the work in a supervised learner process (workers/supervisor.py). On the
learner queue (its name's `workers.learner.` prefix routes it there)."""

from celery import shared_task


@shared_task(name="workers.learner.reward_model_train", acks_late=True, ignore_result=True)
def reward_model_train(version_id: int) -> None:
    from workers.supervisor import reward_model_supervise

    reward_model_supervise(version_id)

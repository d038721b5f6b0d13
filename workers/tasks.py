"""Celery tasks: thin, idempotent, ids in. Each fetches by id, guards against redelivery with a
conditional update, and calls a service. Long work never runs in a task body: the learner is a
supervised process of its own."""

from celery import shared_task


@shared_task(name="workers.learner.runs_schedule", acks_late=True, ignore_result=True)
def runs_schedule() -> None:
    """Restart learners that died and start the queued runs that their projects' quotas allow."""
    from workers.supervisor import runs_tick

    runs_tick()


@shared_task(name="workers.learner.supervise", acks_late=True, ignore_result=True)
def learner_supervise(run_id: int) -> None:
    from workers.supervisor import learner_supervise as supervise

    supervise(run_id)


@shared_task(name="workers.rollout.batch", acks_late=True, ignore_result=True)
def rollout_batch(batch_id: int) -> None:
    from workers.run_rollout import rollout_batch_run

    rollout_batch_run(batch_id)


@shared_task(name="workers.eval.policy", acks_late=True, ignore_result=True)
def eval_policy(run_id: int, version: int) -> None:
    from workers.run_eval import policy_evaluate

    policy_evaluate(run_id, version)


@shared_task(name="workers.eval.tier", acks_late=True, ignore_result=True)
def tier_evaluate(evaluation_id: int) -> None:
    """Evaluate a checkpoint under tiers (a TierEvaluation); a redelivery finds it claimed."""
    from workers.tier_eval import tier_evaluation_run

    tier_evaluation_run(evaluation_id)


@shared_task(name="workers.eval.webhook", acks_late=True, ignore_result=True)
def webhook_deliver(delivery_id: int) -> None:
    """POST one webhook delivery; a duplicated message finds it claimed, settled or not yet due."""
    from webhooks.services import delivery_attempt

    delivery_attempt(delivery_id=delivery_id)

"""The Celery tasks that drive a run from its learner: thin, idempotent, ids in. Each fetches by id,
guards against redelivery with a conditional update, and calls a driver. Long work never runs in a
task body: the learner is a supervised process of its own. (The tasks that runs' and webhooks'
services enqueue sit beside those services: runs/tasks.py, webhooks/tasks.py.)"""

from celery import shared_task


@shared_task(name="workers.rollout.batch", acks_late=True, ignore_result=True)
def rollout_batch(batch_id: int) -> None:
    from workers.run_rollout import rollout_batch_run

    rollout_batch_run(batch_id)


@shared_task(name="workers.rollout.episode_score", acks_late=True, ignore_result=True)
def episode_score(episode_id: int) -> None:
    """Score an external agent's final answer with its run's reward rule (on a rollout worker,
    where sandboxes are) and store the episode."""
    from workers.run_rollout import episode_grade

    episode_grade(episode_id)


@shared_task(name="workers.eval.policy", acks_late=True, ignore_result=True)
def eval_policy(run_id: int, version: int) -> None:
    from workers.run_eval import policy_evaluate

    policy_evaluate(run_id, version)

"""The Celery task that the evaluation services enqueue: an id in, a claim that makes a second
delivery harmless, the work in workers/suite_eval.py. On the eval queue (its name's `workers.eval.`
prefix routes it there)."""

from celery import shared_task


@shared_task(name="workers.eval.suite", acks_late=True, ignore_result=True)
def suite_evaluate(evaluation_id: int) -> None:
    from evaluations.services import suite_evaluation_claim
    from workers.suite_eval import suite_evaluation_run

    evaluation = suite_evaluation_claim(evaluation_id=evaluation_id)
    if evaluation is None:  # gone, finished, or running on a live worker: a redelivery
        return
    suite_evaluation_run(evaluation)

"""What a finished run's usage record must say, whatever was killed or run again on the way: the
tokens its workers sampled and learned from, each counted once (tests/test_costs.py, and the
recovery tests after kill -9 of a learner or a rollout worker)."""

from django.db.models import Sum

from costs.models import Usage
from runs.models import RolloutBatch, Run, Trajectory
from workers.usage import rollout_component


def sampled_tokens_of_done_batches(run: Run) -> int:
    """Sampled tokens of the episodes stored by finished batches; where a step's part ran in two
    batches (cancelled by a rollback and dispatched again), only the last counts."""
    last: dict[tuple[int, str], int] = {}
    for batch in RolloutBatch.objects.filter(run=run, status=RolloutBatch.Status.DONE).order_by("pk"):
        last[(batch.step, rollout_component(batch.item_ids))] = batch.pk
    tokens = Trajectory.objects.filter(batch_id__in=last.values()).aggregate(n=Sum("completion_tokens"))
    return tokens["n"] or 0


def assert_billed_once(run: Run) -> None:
    """One learner record per step; sampled tokens as the finished batches stored them; trained
    tokens as the learned episodes hold them."""
    usage = Usage.objects.filter(run=run)
    learner_steps = sorted(usage.filter(kind="learner").values_list("step", flat=True))
    assert learner_steps == list(range(1, run.max_steps + 1))
    rollout = usage.filter(kind="rollout").aggregate(n=Sum("tokens_sampled"))["n"] or 0
    assert rollout == sampled_tokens_of_done_batches(run)
    learned = Trajectory.objects.filter(run=run).exclude(learned_in_step=None)
    trained = usage.aggregate(n=Sum("tokens_trained"))["n"] or 0
    assert trained == (learned.aggregate(n=Sum("completion_tokens"))["n"] or 0)

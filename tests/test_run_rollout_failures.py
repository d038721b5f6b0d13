"""A rollout batch that fails on every attempt: retried, then ended with its episodes errored, so
the learner's step closes on them (masked from learning) instead of waiting forever."""

import pytest
import torch

from runs import lifecycle
from runs.models import RolloutBatch, Run, RunEvent, Trajectory
from tests.test_run_lifecycle import setup  # noqa: F401  (a fixture: a run whose model folder is empty)
from workers.learners.grpo import learnable
from workers.run_learner import learner_config, mark_learned, wait_for_step
from workers.run_rollout import MAX_ATTEMPTS, rollout_batch_run, rollout_batches_expire

GROUP = 4


@pytest.fixture
def batch(setup):  # noqa: F811
    run = lifecycle.run_create(request=setup["request"], by=setup["owner"])
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    items = list(run.task_set_version.items.filter(split=run.train_split).values_list("pk", flat=True)[:2])
    # No policy was ever published for this run: loading version 0 fails on every attempt.
    return RolloutBatch.objects.create(run=run, index=0, step=0, policy_version=0, item_ids=items)


def test_a_failed_attempt_gives_the_batch_back_with_the_reason(batch):
    assert rollout_batch_run(batch.pk) == 0
    batch.refresh_from_db()
    assert (batch.status, batch.attempts) == (RolloutBatch.Status.PENDING, 1)
    # The version was never published to the artifact storage: the reason names it.
    assert batch.error.startswith("ArtifactMissingError: artifact runs/")
    assert "/policies/v0 is not in the artifact storage" in batch.error
    assert not Trajectory.objects.filter(batch=batch).exists()
    event = RunEvent.objects.get(run=batch.run, kind="rollout")
    assert event.level == "warning" and f"attempt 1 of {MAX_ATTEMPTS}" in event.message


def test_the_last_failed_attempt_records_every_episode_as_errored_and_the_step_closes(batch):
    for _ in range(MAX_ATTEMPTS):
        rollout_batch_run(batch.pk)
    batch.refresh_from_db()
    assert (batch.status, batch.attempts) == (RolloutBatch.Status.FAILED, MAX_ATTEMPTS)
    assert rollout_batch_run(batch.pk) == 0  # a redelivery finds it ended
    episodes = Trajectory.objects.filter(batch=batch)
    assert episodes.count() == len(batch.item_ids) * GROUP
    assert set(episodes.values_list("outcome", flat=True)) == {Trajectory.Outcome.ERRORED}
    assert all(errors[0]["kind"] == "rollout_failed" for errors in episodes.values_list("errors", flat=True))
    assert RunEvent.objects.filter(run=batch.run, kind="rollout", level="error").count() == 1

    run = Run.objects.get(pk=batch.run_id)
    config = learner_config(run)
    chosen, rows = wait_for_step(run, 0, config)  # returns at once: the batch has ended
    assert len(rows) == len(batch.item_ids) * GROUP
    keep, _, dropped = learnable(chosen, GROUP, config, version=0)
    assert keep == [] and dropped["errored"] == len(rows)  # all masked, none scored as zero


def test_a_batch_whose_worker_died_on_every_attempt_is_ended_by_the_learner(batch, settings):
    settings.FLYWHEEL_ROLLOUT_LEASE_SECONDS = 0
    RolloutBatch.objects.filter(pk=batch.pk).update(
        status=RolloutBatch.Status.RUNNING, attempts=MAX_ATTEMPTS, claimed_at=batch.created_at
    )
    assert rollout_batches_expire(RolloutBatch.objects.filter(run=batch.run)) == 1
    batch.refresh_from_db()
    assert batch.status == RolloutBatch.Status.FAILED and "stopped answering" in batch.error
    assert Trajectory.objects.filter(batch=batch, outcome=Trajectory.Outcome.ERRORED).count() == 2 * GROUP
    assert rollout_batches_expire(RolloutBatch.objects.filter(run=batch.run)) == 0


def test_learned_trajectories_are_claimed_once_with_their_advantages(batch):
    rows = [
        Trajectory.objects.create(
            run=batch.run, batch=batch, item_id=batch.item_ids[0], sample_index=index, policy_version=0
        )
        for index in range(4)
    ]
    mark_learned(rows, [0, 2, 3], torch.tensor([0.5, 9.0, -0.25, 1.5]), step=0)
    mark_learned(rows, [0, 1], torch.tensor([7.0, 7.0, 7.0, 7.0]), step=1)  # 0 was claimed already
    claimed = Trajectory.objects.filter(batch=batch).order_by("sample_index")
    assert list(claimed.values_list("learned_in_step", "advantage")) == [
        (0, 0.5),
        (1, 7.0),
        (0, -0.25),
        (0, 1.5),
    ]

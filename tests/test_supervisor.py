"""The supervision mechanism's watchdog on runs whose learner's host died with its supervisor: a run
being stopped is settled where it stands, one with no restart left fails with its learner's last
words, and a live one is left alone. (Restarts themselves run through real workers:
tests/test_run_recovery.py for runs, tests/test_reward_models_resume.py for reward models.)"""

from datetime import timedelta

import pytest
from django.utils import timezone

from runs.models import Run, RunEvent
from tests.run_fixtures import lab, make_run, set_status  # noqa: F401
from workers.supervisor import learner_log, runs_watchdog

S = Run.Status


@pytest.mark.django_db
def test_the_watchdog_settles_stopping_runs_and_fails_one_out_of_restarts_with_its_log(
    lab,  # noqa: F811
    settings,
    tmp_path,
):
    settings.FLYWHEEL_HOME = tmp_path
    long_ago, limit = timezone.now() - timedelta(days=1), settings.FLYWHEEL_LEARNER_MAX_RESTARTS
    cancelling = set_status(make_run(lab, name="cancelling"), S.CANCELLING, heartbeat_at=long_ago)
    pausing = set_status(make_run(lab, name="pausing"), S.PAUSING, heartbeat_at=long_ago)
    exhausted = set_status(
        make_run(lab, name="exhausted"), S.RUNNING, heartbeat_at=long_ago, restarts=limit, learner_step=3
    )
    learner_log(exhausted.pk).write_text("step 3\nRuntimeError: CUDA out of memory\n")
    live = set_status(make_run(lab, name="live"), S.RUNNING, heartbeat_at=timezone.now())

    assert runs_watchdog() == []

    for run in (cancelling, pausing, exhausted, live):
        run.refresh_from_db()
    assert (cancelling.status, pausing.status, exhausted.status, live.status) == (
        S.CANCELLED,
        S.PAUSED,
        S.FAILED,
        S.RUNNING,
    )
    said = {
        run.pk: RunEvent.objects.filter(run=run, kind="status").latest("pk").message
        for run in (cancelling, pausing)
    }
    assert said == {
        cancelling.pk: "cancelled (its learner was gone)",
        pausing.pk: "paused at its last checkpoint",
    }
    message = (
        f"the learner stopped sending heartbeats; gave up after {limit} restarts\n"
        "step 3\nRuntimeError: CUDA out of memory"
    )
    assert exhausted.error == {"message": message, "where": "learner, step 3"}
    assert exhausted.restarts == limit and live.restarts == 0

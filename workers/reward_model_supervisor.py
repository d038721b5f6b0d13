"""Supervision of reward-model training: the Celery task's body on the learner queue starts the
version's learner process (`python manage.py train_reward_model VERSION_ID`, never a long loop in a
task) and waits for it, beating the version's heartbeat while it lives; when the learner dies
(killed, out of memory) it is restarted and resumes at its last checkpoint, up to
FLYWHEEL_LEARNER_MAX_RESTARTS times. If the whole host dies, supervisor and learner die together: the
periodic watchdog (runs_tick) sees the heartbeat go stale and queues the version again, and the next
learner resumes at the checkpoint in the artifact storage. Torch-free: the watchdog runs on beat.
"""

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from reward_models.models import RewardModelVersion
from reward_models.store import checkpoint_discard, log_path

S = RewardModelVersion.Status
LOG_TAIL_LINES = 20
SUPERVISOR_BEAT_SECONDS = 5.0  # the supervisor beats the heartbeat this often while its learner lives


def reward_model_claim(version_id: int) -> bool:
    """Take a queued version (new, or queued again by the watchdog), or a running one whose
    supervisor stopped beating (its host died, and the watchdog has not seen it yet)."""
    stale = timezone.now() - timedelta(seconds=settings.FLYWHEEL_LEARNER_HEARTBEAT_TIMEOUT)
    claimable = Q(status=S.QUEUED) | Q(status=S.RUNNING, heartbeat_at__lt=stale)
    claimed = RewardModelVersion.objects.filter(claimable, pk=version_id).update(
        status=S.RUNNING, heartbeat_at=timezone.now(), error=""
    )
    RewardModelVersion.objects.filter(pk=version_id, started_at__isnull=True).update(
        started_at=timezone.now()
    )
    return bool(claimed)


def reward_model_supervise(version_id: int) -> None:
    """Run the version's learner process; restart it from its last checkpoint when it dies (up to
    FLYWHEEL_LEARNER_MAX_RESTARTS times), and settle the version if it cannot go on."""
    if not reward_model_claim(version_id):  # done, cancelled, or a redelivery while it trains
        return
    while True:
        code = _learner_run(version_id)
        version = RewardModelVersion.objects.get(pk=version_id)
        if code == 0 or version.is_terminal:
            if version.status in (S.CANCELLED, S.FAILED):  # the learner stopped at a cancel
                checkpoint_discard(version)
            return
        tail = _log_tail(version)
        if version.status == S.CANCELLING:
            _settle(version, S.CANCELLED, f"cancelled; the learner exited with code {code}")
            return
        if version.restarts >= settings.FLYWHEEL_LEARNER_MAX_RESTARTS:
            why = f"the learner exited with code {code}; gave up after {version.restarts} restarts"
            _settle(version, S.FAILED, f"{why}\n{tail}".strip())
            return
        RewardModelVersion.objects.filter(pk=version_id, status=S.RUNNING).update(
            restarts=version.restarts + 1, heartbeat_at=timezone.now()
        )
        with open(log_path(version.pk, version.key), "a") as log:
            log.write(
                f"the learner exited with code {code}; restarting from step {version.checkpoint_step} "
                f"({version.restarts + 1} of {settings.FLYWHEEL_LEARNER_MAX_RESTARTS})\n"
            )


def _learner_run(version_id: int) -> int:
    """Start the learner process and wait for it, beating the version's heartbeat meanwhile."""
    version = RewardModelVersion.objects.get(pk=version_id)
    with open(log_path(version.pk, version.key), "ab") as output:
        process = subprocess.Popen(
            [
                sys.executable,
                str(Path(settings.BASE_DIR) / "manage.py"),
                "train_reward_model",
                str(version_id),
            ],
            cwd=settings.BASE_DIR,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    RewardModelVersion.objects.filter(pk=version_id).update(learner_pid=process.pid)
    while True:
        try:
            return process.wait(timeout=SUPERVISOR_BEAT_SECONDS)
        except subprocess.TimeoutExpired:  # alive: the version is not stale, whatever a step takes
            RewardModelVersion.objects.filter(pk=version_id, status__in=(S.RUNNING, S.CANCELLING)).update(
                heartbeat_at=timezone.now()
            )


def _settle(version: RewardModelVersion, status: str, error: str) -> None:
    """End a version that failed or was cancelled; its training checkpoint goes with it."""
    settled = RewardModelVersion.objects.filter(pk=version.pk, status__in=RewardModelVersion.ACTIVE).update(
        status=status, error=error, finished_at=timezone.now()
    )
    if settled:
        checkpoint_discard(version)


def _log_tail(version: RewardModelVersion) -> str:
    try:
        lines = log_path(version.pk, version.key).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    return "\n".join(lines[-LOG_TAIL_LINES:])


def reward_models_watchdog() -> list[int]:
    """Versions whose supervisor stopped beating (its host died with it): queue the running ones
    again (the next learner resumes at the last checkpoint; bounded by the restarts), settle the
    cancelling ones. Returns the re-queued versions' ids."""
    from reward_models import tasks

    stale = timezone.now() - timedelta(seconds=settings.FLYWHEEL_LEARNER_HEARTBEAT_TIMEOUT)
    requeued = []
    for version in RewardModelVersion.objects.filter(
        status__in=(S.RUNNING, S.CANCELLING), heartbeat_at__lt=stale
    ):
        if version.status == S.CANCELLING:
            _settle(version, S.CANCELLED, "cancelled (its learner was gone)")
        elif version.restarts >= settings.FLYWHEEL_LEARNER_MAX_RESTARTS:
            why = f"the learner stopped sending heartbeats; gave up after {version.restarts} restarts"
            _settle(version, S.FAILED, why)
        elif RewardModelVersion.objects.filter(
            pk=version.pk, status=S.RUNNING, heartbeat_at__lt=stale
        ).update(
            status=S.QUEUED, restarts=version.restarts + 1
        ):  # queued again: the next tick leaves it to the task, whose claim takes it
            tasks.reward_model_train.delay(version.pk)
            requeued.append(version.pk)
    return requeued

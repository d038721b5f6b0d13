"""Supervision of learner processes, whatever they train, and the watchdog that restarts the ones
whose host died.

A run's learner (`manage.py run_learner RUN_ID`) and a reward-model version's (`manage.py
train_reward_model VERSION_ID`) are supervised the same way. A Celery task on the learner queue
claims the work, starts its learner as a process of its own (never a long loop in a task body) and
waits for it; when the learner dies (killed, out of memory) it is started again and resumes at its
last checkpoint, up to FLYWHEEL_LEARNER_MAX_RESTARTS times, and then the work fails with the last
lines of the learner's log. If the whole host dies, supervisor and learner die together: the
periodic watchdog (`runs_tick`, on beat; torch-free) sees the heartbeat go stale, settles what was
being stopped, and starts the rest again, bounded by the same restarts.

Each kind declares what differs (`Supervised`): how its work is claimed, its learner's command and
log, who beats the heartbeat, when it is done, how it fails, restarts and settles. A run's learner
beats its own heartbeat (so one that hangs goes stale too), may run on several processes and starts
on the spare learner its worker keeps loaded; a reward model's supervisor beats for its learner.
"""

import logging
import os
import socket
import subprocess
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Generic, TypeVar

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from core.exceptions import StateError
from finetuning.jobs import jobs_launch_resend
from projects.services import task_set_drafts_sweep
from projects.stub_checks import stub_checks_resend
from reward_models import tasks as reward_model_tasks
from reward_models.models import RewardModelVersion
from reward_models.store import checkpoint_discard, log_path
from runs import tasks as run_tasks
from runs.lifecycle import run_event, run_fail, run_transition
from runs.models import Run
from runs.run_store import run_dir
from runs.scheduling import gpu_workers, runs_admit
from sweeps.driver import sweeps_advance
from tinker_api import services as tinker_services
from webhooks.services import deliveries_resend

logger = logging.getLogger(__name__)
LOG_TAIL_LINES = 20
SUPERVISOR_BEAT_SECONDS = 5.0  # how often a supervisor that beats for its learner does so
LOST = "the learner stopped sending heartbeats"

Row = TypeVar("Row", Run, RewardModelVersion)


# --- the mechanism ---------------------------------------------------------------------------


class Supervised(ABC, Generic[Row]):
    """One kind of work that a learner process does under supervision: what the mechanism below
    needs to know of it."""

    model: type[Row]
    command: str  # `manage.py COMMAND ID` runs one learner
    # The statuses in which the supervisor beats the heartbeat while its learner lives; none: the
    # learner beats it itself.
    beat_while: tuple[str, ...] = ()
    # What the watchdog settles a stopping status at when the learner is gone: status -> (to, message).
    settles: dict[str, tuple[str, str]]

    @abstractmethod
    def claim(self, pk: int) -> Row | None:
        """The work, now this supervisor's; None when it is done or another supervises it."""

    @abstractmethod
    def log_path(self, row: Row) -> Path: ...

    def start(self, row: Row) -> subprocess.Popen[bytes]:
        """Start its learner and record the process."""
        process = learner_spawn(learner_argv(self.command, str(row.pk)), self.log_path(row))
        self.model.objects.filter(pk=row.pk).update(learner_pid=process.pid)
        return process

    def exited(self, row: Row) -> None:  # noqa: B027 - most kinds have nothing to do here
        """Its learner exited (before the supervisor looks at the work again)."""

    @abstractmethod
    def done(self, row: Row, code: int) -> bool:
        """Whether the supervisor's part is over once the learner exited with `code` (`row` read
        again): it finished, was stopped, or was settled here."""

    @abstractmethod
    def fail(self, row: Row, message: str) -> None:
        """No restart is left: fail it."""

    @abstractmethod
    def restart(self, row: Row, why: str) -> None:
        """Count a restart, and say so, before its supervisor starts the learner again."""

    @abstractmethod
    def settle(self, row: Row, status: str, message: str) -> None:
        """End work that was being stopped, at `status`."""

    @abstractmethod
    def stale(self) -> Iterator[Row]:
        """The work whose learner stopped answering: the watchdog's to look at."""

    @abstractmethod
    def requeue(self, row: Row, why: str) -> bool:
        """Count a restart and hand the work to a new supervisor (its own is gone); False when
        something else took it first."""


def supervise(kind: Supervised[Row], pk: int) -> None:
    """Claim the work and run its learner until it is done, starting it again from its last
    checkpoint when it dies, while restarts are left."""
    row = kind.claim(pk)
    if row is None:
        return
    while True:
        process = kind.start(row)
        code = learner_wait(kind, row, process)
        kind.exited(row)
        row.refresh_from_db()
        if kind.done(row, code):
            return
        why = f"the learner exited with code {code}"
        if out_of_restarts(kind, row, why):
            return
        kind.restart(row, why)


def learner_wait(kind: Supervised[Row], row: Row, process: subprocess.Popen[bytes]) -> int:
    """The learner's exit code, beating the heartbeat meanwhile where the supervisor beats it."""
    while True:
        try:
            return process.wait(timeout=SUPERVISOR_BEAT_SECONDS if kind.beat_while else None)
        except subprocess.TimeoutExpired:  # alive: the work is not stale, whatever a step takes
            kind.model.objects.filter(pk=row.pk, status__in=kind.beat_while).update(
                heartbeat_at=timezone.now()
            )


def out_of_restarts(kind: Supervised[Row], row: Row, why: str) -> bool:
    """Fail the work with the learner's last words when it has no restart left."""
    if row.restarts < settings.FLYWHEEL_LEARNER_MAX_RESTARTS:
        return False
    tail = log_tail(kind.log_path(row))
    kind.fail(row, f"{why}; gave up after {row.restarts} restarts\n{tail}".strip())
    return True


def watchdog(kind: Supervised[Row]) -> list[int]:
    """Work whose learner stopped answering (its host died with its supervisor): settle what was
    being stopped, start the rest again (bounded by the restarts). Returns the restarted ids."""
    restarted = []
    for row in kind.stale():
        if row.status in kind.settles:
            kind.settle(row, *kind.settles[row.status])
        elif not out_of_restarts(kind, row, LOST) and kind.requeue(row, LOST):
            restarted.append(row.pk)
    return restarted


def learner_spawn(
    argv: list[str], log: Path, *, stdin: int = subprocess.DEVNULL, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with open(log, "ab") as output:
        return subprocess.Popen(
            argv,
            cwd=settings.BASE_DIR,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=stdin,
            start_new_session=True,  # outlives a killed worker child; the watchdog covers the rest
        )


def learner_argv(command: str, argument: str, processes: int = 1) -> list[str]:
    """One plain process, or `accelerate launch` of `processes` ranks with the DDP config
    (FLYWHEEL_ACCELERATE_CONFIG); a dead rank stops the group, and the launcher exits non-zero."""
    manage = [str(Path(settings.BASE_DIR) / "manage.py"), command, argument]
    if processes <= 1:
        return [sys.executable, *manage]
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
    launch += [str(settings.FLYWHEEL_ACCELERATE_CONFIG), "--num_processes", str(processes)]
    return [*launch, "--main_process_port", str(free_port()), *manage]


def log_tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    return "\n".join(lines[-LOG_TAIL_LINES:])


# --- a run's learner ------------------------------------------------------------------------

S = Run.Status
LIVE = (S.STARTING, S.RUNNING, S.PAUSING, S.CANCELLING)


class RunLearners(Supervised[Run]):
    model = Run
    command = "run_learner"
    settles = {
        S.CANCELLING: (S.CANCELLED, "cancelled (its learner was gone)"),
        S.PAUSING: (S.PAUSED, "paused at its last checkpoint"),
    }

    def claim(self, pk: int) -> Run | None:
        run = Run.objects.filter(pk=pk, status__in=LIVE).first()
        if run is None or learner_alive(run):  # finished, or a redelivery while the learner runs
            return None
        return run

    def log_path(self, row: Run) -> Path:
        return learner_log(row.pk)

    def start(self, row: Run) -> subprocess.Popen[bytes]:
        processes = learner_processes(row)
        process = None if processes > 1 else _spare_take(row.pk)
        if process is None:
            argv = learner_argv(self.command, str(row.pk), processes)
            process = learner_spawn(argv, learner_log(row.pk), env=learner_env(processes))
        Run.objects.filter(pk=row.pk).update(
            learner_pid=process.pid, learner_host=socket.gethostname(), heartbeat_at=timezone.now()
        )
        return process

    def exited(self, row: Run) -> None:
        if settings.FLYWHEEL_LEARNER_SPARE:
            learner_spare_refill()  # loads now that this learner is done (not beside it), for the next start

    def done(self, row: Run, code: int) -> bool:
        # A run being stopped whose learner crashed is restarted: the new learner stops it.
        return row.status not in LIVE or code == 0

    def fail(self, row: Run, message: str) -> None:
        try:
            run_fail(run=row, message=message, where=f"learner, step {row.learner_step}")
        except StateError:
            pass

    def restart(self, row: Run, why: str) -> None:
        tail = log_tail(learner_log(row.pk))
        Run.objects.filter(pk=row.pk).update(restarts=row.restarts + 1)
        row.refresh_from_db()
        limit = settings.FLYWHEEL_LEARNER_MAX_RESTARTS
        run_event(
            row,
            "restart",
            f"{why}; restarting from the last checkpoint ({row.restarts} of {limit})",
            level="warning",
            data={"log": tail},
        )

    def settle(self, row: Run, status: str, message: str) -> None:
        run_transition(row, allowed=(row.status,), to=status, message=message)

    def stale(self) -> Iterator[Run]:
        for run in Run.objects.filter(status__in=LIVE):
            if not heartbeat_stale(run) or learner_alive(run):
                continue
            if run.status == S.STARTING and run.learner_pid is None and not _starting_too_long(run):
                continue
            yield run

    def requeue(self, row: Run, why: str) -> bool:
        self.restart(row, why)
        Run.objects.filter(pk=row.pk).update(heartbeat_at=timezone.now())
        run_tasks.learner_supervise.delay(row.pk)
        return True


RUNS = RunLearners()


def learner_supervise(run_id: int) -> None:
    supervise(RUNS, run_id)


def runs_watchdog() -> list[int]:
    """Runs whose learner stopped answering: restart them (bounded) or settle their status."""
    return watchdog(RUNS)


def learner_log(run_id: int) -> Path:
    path = run_dir(run_id) / "learner.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def learner_alive(run: Run) -> bool:
    """A learner of this run runs on this host (its pid answers and its heartbeat is fresh)."""
    if not run.learner_pid or run.learner_host != socket.gethostname():
        return False
    try:
        os.kill(run.learner_pid, 0)
    except ProcessLookupError:
        return False
    return not heartbeat_stale(run)


def heartbeat_stale(run: Run) -> bool:
    timeout = timedelta(seconds=settings.FLYWHEEL_LEARNER_HEARTBEAT_TIMEOUT)
    return run.heartbeat_at is None or timezone.now() - run.heartbeat_at > timeout


def _starting_too_long(run: Run) -> bool:
    timeout = timedelta(seconds=settings.FLYWHEEL_LEARNER_HEARTBEAT_TIMEOUT)
    return timezone.now() - run.updated_at > timeout


def learner_processes(run: Run) -> int:
    """Processes of the run's learner: the GPU workers the scheduler counted it as holding
    (runs/scheduling.py: its `learner_processes` hyperparameter, else FLYWHEEL_LEARNER_PROCESSES,
    for a distributed algorithm; one for any other)."""
    return gpu_workers(run)


def learner_env(processes: int) -> dict[str, str]:
    env = dict(os.environ)
    if processes > 1 and "ACCELERATE_USE_CPU" not in env and not _cuda_available():
        env["ACCELERATE_USE_CPU"] = "true"  # DDP over gloo on a host without GPUs
    return env


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# A learner process started ahead of need: its interpreter, Django, torch and transformers loaded
# (about five seconds of a run's start), waiting on its stdin for a run id. One per worker process
# that supervises learners, started with that process (webapp/celery.py) and again each time one of
# its learners exits; it exits by itself when that worker process goes (its stdin closes).
_spare: subprocess.Popen[bytes] | None = None


def learner_spare_refill() -> None:
    global _spare
    if _spare is None or _spare.poll() is not None:
        spare_log = Path(settings.FLYWHEEL_HOME) / "logs" / "learner-spare.log"
        spare_log.parent.mkdir(parents=True, exist_ok=True)
        argv = learner_argv(RUNS.command, "--wait")
        _spare = learner_spawn(argv, spare_log, stdin=subprocess.PIPE, env=learner_env(1))


def _spare_take(run_id: int) -> subprocess.Popen[bytes] | None:
    """The spare, handed run_id, when there is a live one; else None."""
    global _spare
    spare, _spare = _spare, None
    if spare is None or spare.poll() is not None:
        return None
    assert spare.stdin is not None  # started with stdin=PIPE
    try:
        spare.stdin.write(f"{run_id}\n".encode())
        spare.stdin.close()
    except OSError:  # it died just now
        spare.kill()
        spare.wait()
        return None
    return spare


# --- a reward model's learner ---------------------------------------------------------------

RM = RewardModelVersion.Status


class RewardModelLearners(Supervised[RewardModelVersion]):
    model = RewardModelVersion
    command = "train_reward_model"
    beat_while = (RM.RUNNING, RM.CANCELLING)
    settles = {RM.CANCELLING: (RM.CANCELLED, "cancelled (its learner was gone)")}

    def claim(self, pk: int) -> RewardModelVersion | None:
        """A queued version (new, or queued again by the watchdog), or a running one whose
        supervisor stopped beating (its host died, and the watchdog has not seen it yet)."""
        claimable = Q(status=RM.QUEUED) | Q(status=RM.RUNNING, heartbeat_at__lt=_stale_before())
        claimed = RewardModelVersion.objects.filter(claimable, pk=pk).update(
            status=RM.RUNNING, heartbeat_at=timezone.now(), error=""
        )
        RewardModelVersion.objects.filter(pk=pk, started_at__isnull=True).update(started_at=timezone.now())
        return RewardModelVersion.objects.get(pk=pk) if claimed else None

    def log_path(self, row: RewardModelVersion) -> Path:
        return log_path(row.pk, row.key)

    def done(self, row: RewardModelVersion, code: int) -> bool:
        if code == 0 or row.is_terminal:
            if row.status in (RM.CANCELLED, RM.FAILED):  # the learner stopped at a cancel
                checkpoint_discard(row)
            return True
        if row.status == RM.CANCELLING:
            self.settle(row, RM.CANCELLED, f"cancelled; the learner exited with code {code}")
            return True
        return False

    def fail(self, row: RewardModelVersion, message: str) -> None:
        self.settle(row, RM.FAILED, message)

    def restart(self, row: RewardModelVersion, why: str) -> None:
        RewardModelVersion.objects.filter(pk=row.pk, status=RM.RUNNING).update(
            restarts=row.restarts + 1, heartbeat_at=timezone.now()
        )
        with open(self.log_path(row), "a") as log:
            limit = settings.FLYWHEEL_LEARNER_MAX_RESTARTS
            log.write(f"{why}; restarting from step {row.checkpoint_step} ({row.restarts + 1} of {limit})\n")

    def settle(self, row: RewardModelVersion, status: str, message: str) -> None:
        """End a version that failed or was cancelled; its training checkpoint goes with it."""
        settled = RewardModelVersion.objects.filter(pk=row.pk, status__in=RewardModelVersion.ACTIVE).update(
            status=status, error=message, finished_at=timezone.now()
        )
        if settled:
            checkpoint_discard(row)

    def stale(self) -> Iterator[RewardModelVersion]:
        yield from RewardModelVersion.objects.filter(
            status__in=(RM.RUNNING, RM.CANCELLING), heartbeat_at__lt=_stale_before()
        )

    def requeue(self, row: RewardModelVersion, why: str) -> bool:
        """Queued again, for the task's claim (the next tick leaves it alone): the next learner
        resumes at the checkpoint in the artifact storage."""
        requeued = RewardModelVersion.objects.filter(
            pk=row.pk, status=RM.RUNNING, heartbeat_at__lt=_stale_before()
        ).update(status=RM.QUEUED, restarts=row.restarts + 1)
        if requeued:
            reward_model_tasks.reward_model_train.delay(row.pk)
        return bool(requeued)


REWARD_MODELS = RewardModelLearners()


def reward_model_supervise(version_id: int) -> None:
    supervise(REWARD_MODELS, version_id)


def reward_models_watchdog() -> list[int]:
    """Versions whose supervisor stopped beating: queue the running ones again, settle the
    cancelling ones. Returns the re-queued versions' ids."""
    return watchdog(REWARD_MODELS)


def _stale_before() -> datetime:
    return timezone.now() - timedelta(seconds=settings.FLYWHEEL_LEARNER_HEARTBEAT_TIMEOUT)


# --- the periodic pass ----------------------------------------------------------------------


def runs_tick() -> None:
    """The periodic pass: restart what died (runs' learners and reward-model trainings), start what
    the quotas allow, send again the webhook deliveries, stub checks and fine-tuning jobs' launches
    whose messages were lost, delete the drafts of imports that died, end the Tinker sessions whose
    clients went quiet, and advance every sweep (before admission, so a trial it launches starts in
    the same tick)."""

    runs_watchdog()
    reward_models_watchdog()
    sweeps_advance()
    runs_admit()
    deliveries_resend()
    task_set_drafts_sweep()
    stub_checks_resend()
    jobs_launch_resend()
    tinker_services.sessions_expire()

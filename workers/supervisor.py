"""Supervision of learner processes and the watchdog that restarts the ones whose host died.

`learner_supervise` runs in a Celery task on the learner queue: it starts the run's learner as a
process of its own and waits for it, restarting it from its last checkpoint when it crashes, up to
FLYWHEEL_LEARNER_MAX_RESTARTS times. If the whole worker host dies, supervisor and learner die
together; the periodic watchdog then sees the run's heartbeat go stale and starts a new one.
"""

import logging
import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from core.exceptions import StateError
from projects.services import task_set_drafts_sweep
from projects.stub_checks import stub_checks_resend
from runs import tasks as run_tasks
from runs.learners import algorithm_get
from runs.lifecycle import run_event, run_fail, run_transition
from runs.models import Run
from runs.run_store import run_dir
from runs.scheduling import runs_admit
from tinker_api import services as tinker_services
from webhooks.services import deliveries_resend
from workers.reward_model_supervisor import reward_models_watchdog

logger = logging.getLogger(__name__)
S = Run.Status
LIVE = (S.STARTING, S.RUNNING, S.PAUSING, S.CANCELLING)
LOG_TAIL_LINES = 20


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


def learner_supervise(run_id: int) -> None:
    run = Run.objects.filter(pk=run_id, status__in=LIVE).first()
    if run is None or learner_alive(run):  # finished, or a redelivery while the learner runs
        return
    while True:
        code = _learner_run(run)
        run.refresh_from_db()
        if run.status not in LIVE or code == 0:
            return
        if not _restart_or_fail(run, f"the learner exited with code {code}"):
            return


def learner_processes(run: Run) -> int:
    """Processes of the run's learner: its `learner_processes` hyperparameter, else this worker's
    FLYWHEEL_LEARNER_PROCESSES. Only algorithms registered as distributed run on several."""
    algorithm = algorithm_get(run.method)
    if algorithm is None or not algorithm.distributed:
        return 1
    return int(run.resolved.get("learner_processes") or 0) or settings.FLYWHEEL_LEARNER_PROCESSES


def _learner_run(run: Run) -> int:
    processes = learner_processes(run)
    if processes > 1:
        process = _learner_spawn(str(run.pk), learner_log(run.pk), processes=processes)
    else:
        process = _spare_take(run.pk) or _learner_spawn(str(run.pk), learner_log(run.pk))
    Run.objects.filter(pk=run.pk).update(
        learner_pid=process.pid, learner_host=socket.gethostname(), heartbeat_at=timezone.now()
    )
    code = process.wait()
    if settings.FLYWHEEL_LEARNER_SPARE:
        learner_spare_refill()  # loads now that this learner is done (not beside it), for the next start
    return code


def _learner_spawn(
    argument: str, log_path: Path, stdin: int = subprocess.DEVNULL, processes: int = 1
) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            learner_argv(argument, processes),
            cwd=settings.BASE_DIR,
            env=learner_env(processes),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=stdin,
            start_new_session=True,  # outlives a killed worker child; the watchdog covers the rest
        )


def learner_argv(argument: str, processes: int) -> list[str]:
    """One plain process, or `accelerate launch` of `processes` ranks with the DDP config
    (FLYWHEEL_ACCELERATE_CONFIG); a dead rank stops the group, and the launcher exits non-zero."""
    command = [str(Path(settings.BASE_DIR) / "manage.py"), "run_learner", argument]
    if processes <= 1:
        return [sys.executable, *command]
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
    launch += [str(settings.FLYWHEEL_ACCELERATE_CONFIG), "--num_processes", str(processes)]
    return [*launch, "--main_process_port", str(free_port()), *command]


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
_spare: subprocess.Popen | None = None


def learner_spare_refill() -> None:
    global _spare
    if _spare is None or _spare.poll() is not None:
        spare_log = Path(settings.FLYWHEEL_HOME) / "logs" / "learner-spare.log"
        spare_log.parent.mkdir(parents=True, exist_ok=True)
        _spare = _learner_spawn("--wait", spare_log, stdin=subprocess.PIPE)


def _spare_take(run_id: int) -> subprocess.Popen | None:
    """The spare, handed run_id, when there is a live one; else None."""
    global _spare
    spare, _spare = _spare, None
    if spare is None or spare.poll() is not None:
        return None
    try:
        spare.stdin.write(f"{run_id}\n".encode())
        spare.stdin.close()
    except OSError:  # it died just now
        spare.kill()
        spare.wait()
        return None
    return spare


def _restart_or_fail(run: Run, why: str) -> bool:
    """Count a restart if the run has one left; otherwise fail it with the learner's last words."""
    tail = _log_tail(run.pk)
    if run.restarts >= settings.FLYWHEEL_LEARNER_MAX_RESTARTS:
        message = f"{why}; gave up after {run.restarts} restarts"
        try:
            run_fail(run=run, message=f"{message}\n{tail}".strip(), where=f"learner, step {run.learner_step}")
        except StateError:
            pass
        return False
    Run.objects.filter(pk=run.pk).update(restarts=run.restarts + 1)
    run.refresh_from_db()
    limit = settings.FLYWHEEL_LEARNER_MAX_RESTARTS
    run_event(
        run,
        "restart",
        f"{why}; restarting from the last checkpoint ({run.restarts} of {limit})",
        level="warning",
        data={"log": tail},
    )
    return True


def _log_tail(run_id: int) -> str:
    try:
        lines = learner_log(run_id).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    return "\n".join(lines[-LOG_TAIL_LINES:])


def runs_watchdog() -> list[int]:
    """Runs whose learner stopped answering: restart them (bounded) or settle their status."""
    restarted = []
    for run in Run.objects.filter(status__in=LIVE):
        if not heartbeat_stale(run) or learner_alive(run):
            continue
        if run.status == S.STARTING and run.learner_pid is None and not _starting_too_long(run):
            continue
        if run.status == S.CANCELLING:
            run_transition(
                run, allowed=(S.CANCELLING,), to=S.CANCELLED, message="cancelled (its learner was gone)"
            )
            continue
        if run.status == S.PAUSING:
            run_transition(run, allowed=(S.PAUSING,), to=S.PAUSED, message="paused at its last checkpoint")
            continue
        if _restart_or_fail(run, "the learner stopped sending heartbeats"):
            Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now())
            run_tasks.learner_supervise.delay(run.pk)
            restarted.append(run.pk)
    return restarted


def _starting_too_long(run: Run) -> bool:
    timeout = timedelta(seconds=settings.FLYWHEEL_LEARNER_HEARTBEAT_TIMEOUT)
    return timezone.now() - run.updated_at > timeout


def runs_tick() -> None:
    """The periodic pass: restart what died (runs' learners and reward-model trainings), start what
    the quotas allow, send again the webhook deliveries and stub checks whose messages were lost,
    delete the drafts of imports that died, and end the Tinker sessions whose clients went quiet."""

    runs_watchdog()
    reward_models_watchdog()
    runs_admit()
    deliveries_resend()
    task_set_drafts_sweep()
    stub_checks_resend()
    tinker_services.sessions_expire()

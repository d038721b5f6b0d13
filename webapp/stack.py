"""The local stack that `make up` starts and `make down` stops: the private Redis (embedded
default only), the web server (Daphne) and one Celery worker per queue. Each process runs
detached with a pidfile under FLYWHEEL_HOME/run and a log under FLYWHEEL_HOME/logs."""

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

STOP_GRACE_SECONDS = 15.0


@dataclass(frozen=True)
class Service:
    name: str
    argv: list[str]


def solo_worker_argv(queues: str, name: str) -> list[str]:
    """One Celery worker process serving `queues` itself (solo pool, no peers to sync with): how
    tests and benchmarks stand up a worker host they can kill."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "webapp",
        "worker",
        "-Q",
        queues,
        "-n",
        name,
        "-c",
        "1",
        "--pool",
        "solo",
        "--without-gossip",
        "--without-mingle",
        "--loglevel",
        "INFO",
    ]


def services() -> list[Service]:
    python = sys.executable
    celery = [python, "-m", "celery", "-A", "webapp", "worker", "--loglevel", "INFO", "--without-gossip"]
    concurrency = {
        "rollout": settings.FLYWHEEL_ROLLOUT_CONCURRENCY,
        "learner": settings.FLYWHEEL_LEARNER_CONCURRENCY,
        "eval": settings.FLYWHEEL_EVAL_CONCURRENCY,
    }
    workers = [
        Service(f"worker-{queue}", [*celery, "-Q", queue, "-n", f"{queue}@%h", "-c", str(concurrency[queue])])
        for queue in settings.CELERY_WORKER_QUEUES
    ]
    web = Service(
        "web",
        [
            python,
            "-m",
            "webapp.serve",  # Daphne, with request bodies bounded before they are read
            "-b",
            settings.FLYWHEEL_BIND,
            "-p",
            str(settings.PORT),
            "webapp.asgi:application",
        ],
    )
    beat = Service(
        "beat",
        [
            python,
            "-m",
            "celery",
            "-A",
            "webapp",
            "beat",
            "--loglevel",
            "INFO",
            "--schedule",
            str(settings.FLYWHEEL_HOME / "run" / "celerybeat-schedule"),
        ],
    )
    return [web, *workers, beat]


def run_dir() -> Path:
    path = settings.FLYWHEEL_HOME / "run"
    path.mkdir(parents=True, exist_ok=True)
    return path


def log_dir() -> Path:
    path = settings.FLYWHEEL_HOME / "logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def pid_of(name: str) -> int | None:
    """The pid in the service's pidfile if that process is still alive."""
    pidfile = run_dir() / f"{name}.pid"
    try:
        pid = int(pidfile.read_text().strip())
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None
    return pid


def service_start(service: Service) -> int:
    """Start the service detached, unless it already runs; returns its pid."""
    running = pid_of(service.name)
    if running is not None:
        return running
    log = open(log_dir() / f"{service.name}.log", "ab")  # noqa: SIM115 - handed to the child
    process = subprocess.Popen(
        service.argv,
        cwd=settings.BASE_DIR,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # survives the make process; stopped by `make down`
        env=os.environ.copy(),
    )
    (run_dir() / f"{service.name}.pid").write_text(str(process.pid))
    return process.pid


def process_stop(name: str, timeout: float = STOP_GRACE_SECONDS) -> bool:
    """TERM the process group, then KILL after the grace period; True if something was stopped."""
    pid = pid_of(name)
    pidfile = run_dir() / f"{name}.pid"
    if pid is None:
        pidfile.unlink(missing_ok=True)
        return False
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    if _alive(pid):
        _signal_group(pid, signal.SIGKILL)
    pidfile.unlink(missing_ok=True)
    return True


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(os.getpgid(pid), sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True

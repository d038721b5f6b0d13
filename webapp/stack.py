"""The local stack that `make up` starts and `make down` stops: the private Redis (embedded
default only), the web server (uvicorn, HTTP and websockets), one Celery worker per queue and
the scheduler (Celery beat), each with a log under FLYWHEEL_HOME/logs.

They run under a supervisor (`manage.py flywheel_supervise`, started detached by `make up`, its
pid in FLYWHEEL_HOME/run/supervisor.pid): a service that dies is started again at once (its whole
process group killed first, so no orphan of a killed server keeps its port), then, if it keeps
dying, with a back-off of up to 30 s. `make down` stops the supervisor, which stops the services
in reverse order (Redis last) and then exits.

Everything the stack starts carries FLYWHEEL_STACK_HOME=<its home> in its environment, and so does
everything those start in turn: learners and the spare learner run in sessions of their own (they
must outlive a killed worker process) and are reparented to init when their worker goes, but they
keep the mark. Stopping the stack stops every process with the mark and waits for them."""

import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from django.conf import settings

from webapp import web_server
from webapp.embedded_redis import redis_argv, redis_password, redis_ping

logger = logging.getLogger("flywheel.stack")

STOP_GRACE_SECONDS = 15.0
STACK_MARK = "FLYWHEEL_STACK_HOME"


def stack_env() -> dict[str, str]:
    """The mark of this home's stack, inherited by every process it starts (see the docstring)."""
    return {STACK_MARK: str(settings.FLYWHEEL_HOME)}


def stack_processes(home: Path, exclude: frozenset[int] | set[int] = frozenset()) -> list[int]:
    """Live processes of this user that carry the mark of the stack of `home`, however deep they
    were started and whoever their parent is now."""
    mark = f"{STACK_MARK}={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude or int(entry.name) == os.getpid():
            continue
        try:
            marked = mark in (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or another user's
            continue
        if marked and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def stack_processes_stop(
    home: Path, exclude: frozenset[int] | set[int] = frozenset(), timeout: float = STOP_GRACE_SECONDS
) -> list[int]:
    """TERM every marked process (but `exclude`), KILL those left after `timeout`, and wait until
    none is left; returns the pids it found."""
    pids = stack_processes(home, exclude)
    for pid in pids:
        _signal_one(pid, signal.SIGTERM)
        _signal_one(pid, signal.SIGCONT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            logger.warning("pid %s did not stop within %.0f s of SIGTERM; killing it", pid, timeout)
            _signal_one(pid, signal.SIGKILL)
    while any(_alive(pid) for pid in pids):  # KILL is not refused; this waits for the kernel
        time.sleep(0.05)
    return pids


def _signal_one(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


@dataclass(frozen=True)
class Service:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # over the stack's own environment
    fresh_dirs: tuple[Path, ...] = ()  # emptied before each start
    health: Callable[[], bool] | None = None  # answers within its own timeout; False when hung

    @property
    def umask(self) -> int:
        """What the service writes is for this user only, except a worker's: a sandbox runs as
        another uid and must read the workspace, harness and cgroup files its worker makes (the
        worker's own artifacts get their modes set explicitly, and its log and pid files are made
        here, under the supervisor's umask)."""
        return 0o022 if self.name.startswith("worker-") else 0o077


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


def web_argv() -> list[str]:
    return web_server.web_argv(
        python=sys.executable,
        bind=settings.FLYWHEEL_BIND,
        port=settings.PORT,
        workers=settings.FLYWHEEL_WEB_WORKERS,
    )


def web_service() -> Service:
    """The web server; its processes count requests for /metrics in files of one folder, which
    every process reads and sums (Prometheus' multiprocess mode), emptied before each start."""
    metrics_dir = settings.FLYWHEEL_HOME / "run" / "prometheus"
    return Service("web", web_argv(), {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}, (metrics_dir,))


def redis_service() -> Service:
    """The embedded default's private Redis, in the foreground so the supervisor sees it die, and
    pinged (with a timeout) so that it sees it hang."""
    home, port = settings.FLYWHEEL_HOME, settings.FLYWHEEL_REDIS_PORT
    password = redis_password(home)
    return Service(
        "redis",
        redis_argv(home=home, port=port),
        health=lambda: redis_ping(port, password, timeout=HEALTH_TIMEOUT_SECONDS),
    )


def services() -> list[Service]:
    python = sys.executable
    celery = [python, "-m", "celery", "-A", "webapp", "worker", "--loglevel", "INFO", "--without-gossip"]
    concurrency = {
        "rollout": settings.FLYWHEEL_ROLLOUT_CONCURRENCY,
        "learner": settings.FLYWHEEL_LEARNER_CONCURRENCY,
        "eval": settings.FLYWHEEL_EVAL_CONCURRENCY,
        "control": settings.FLYWHEEL_CONTROL_CONCURRENCY,
    }
    workers = [
        Service(f"worker-{queue}", [*celery, "-Q", queue, "-n", f"{queue}@%h", "-c", str(concurrency[queue])])
        for queue in settings.CELERY_WORKER_QUEUES
    ]
    web = web_service()
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
    return [*([redis_service()] if settings.EMBEDDED_REDIS else []), web, *workers, beat]


def run_dir() -> Path:
    path = settings.FLYWHEEL_HOME / "run"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def log_dir() -> Path:
    path = settings.FLYWHEEL_HOME / "logs"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def home_private(home: Path) -> int:
    """Take group and other permissions off everything under the home that this user owns (what an
    older version left readable: logs, pid files, Redis data, artifacts); returns how many changed.
    What the stack writes from now on is private already (a umask of 077)."""
    changed = 0
    for folder, dirs, files in os.walk(home):
        for path in [folder, *(os.path.join(folder, name) for name in dirs + files)]:
            try:
                info = os.lstat(path)
                if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid() or not info.st_mode & 0o077:
                    continue
                os.chmod(path, stat.S_IMODE(info.st_mode) & 0o700)
            except OSError:  # gone meanwhile
                continue
            changed += 1
    return changed


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
        env=os.environ | service.env | stack_env(),
        umask=service.umask,
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
    _signal_group(pid, signal.SIGCONT)  # a stopped (hung) process handles its TERM only once resumed
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
    try:  # a zombie (dead, its parent yet to reap it) is not alive
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


# --- start-up progress (what `make up` waits on) ----------------------------------------------


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by the process and its children (a web server's workers)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


@dataclass
class Progress:
    """Whether a starting service still makes progress: its processes use CPU (importing, loading
    a model) or it writes to its log. A hung or stopped one does neither; one that keeps dying
    shows up as restarts (the supervisor gives it a new pid each time)."""

    name: str
    pid: int | None = None
    cpu: float = 0.0
    log_size: int = -1
    restarts: int = 0
    moved_at: float = field(default_factory=time.monotonic)

    def update(self, now: float) -> None:
        pid = pid_of(self.name)
        if pid != self.pid:
            self.restarts += self.pid is not None and pid is not None
            self.pid, self.cpu, self.moved_at = pid, 0.0, now
        cpu = tree_cpu_seconds(pid) if pid is not None else 0.0
        try:
            size = (log_dir() / f"{self.name}.log").stat().st_size
        except FileNotFoundError:
            size = -1
        if cpu > self.cpu + PROGRESS_CPU_SECONDS or size != self.log_size:
            self.moved_at = now
            self.cpu = cpu
        self.log_size = size

    def stalled_for(self, now: float) -> float:
        return now - self.moved_at


PROGRESS_CPU_SECONDS = 0.05  # more CPU than this since the last change counts as progress


# --- the supervisor --------------------------------------------------------------------------

POLL_SECONDS = 0.2
STABLE_SECONDS = 10.0  # a service that lived this long restarts at once when it dies
MAX_BACKOFF_SECONDS = 30.0
# A service with a health check is checked every HEALTH_EVERY_SECONDS once it has had
# HEALTH_GRACE_SECONDS to start; HEALTH_FAILURES failures in a row (a hung process: stopped,
# deadlocked, swapped out) get it killed and started again, as if it had died.
HEALTH_EVERY_SECONDS = 2.0
HEALTH_TIMEOUT_SECONDS = 1.0
HEALTH_GRACE_SECONDS = 10.0
HEALTH_FAILURES = 3


@dataclass
class Supervised:
    service: Service
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    failures: int = 0  # deaths in a row, each within STABLE_SECONDS of its start
    due_at: float = 0.0  # when to start it again
    health_at: float = 0.0  # when to check its health next
    unhealthy: int = 0  # failed health checks in a row

    def start(self) -> None:
        for folder in self.service.fresh_dirs:
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
        log = open(log_dir() / f"{self.service.name}.log", "ab")  # noqa: SIM115 - handed to the child
        with log:
            self.process = subprocess.Popen(
                self.service.argv,
                cwd=settings.BASE_DIR,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a group of its own: stopped, or cleaned up, as one
                env=os.environ | self.service.env | stack_env(),
                umask=self.service.umask,
            )
        self.started_at = time.monotonic()
        self.health_at, self.unhealthy = self.started_at + HEALTH_GRACE_SECONDS, 0
        (run_dir() / f"{self.service.name}.pid").write_text(str(self.process.pid))
        logger.info("%s: started, pid %s", self.service.name, self.process.pid)

    def check(self) -> None:
        """Start it again if it died (its leftover processes killed first) and its time has come."""
        now = time.monotonic()
        self.health_check(now)
        if self.process is not None and self.process.poll() is not None:
            code, pid = self.process.returncode, self.process.pid
            _kill_session(pid)  # children of a killed parent must not hold its port
            self.process = None
            self.failures = self.failures + 1 if now - self.started_at < STABLE_SECONDS else 0
            delay = min(MAX_BACKOFF_SECONDS, 2.0 ** (self.failures - 1)) if self.failures else 0.0
            self.due_at = now + delay
            logger.warning(
                "%s: pid %s exited with code %s; starting it again in %.0f s",
                self.service.name,
                pid,
                code,
                delay,
            )
        if self.process is None and now >= self.due_at:
            self.start()

    def health_check(self, now: float) -> None:
        """Kill a live process that failed its health check HEALTH_FAILURES times in a row; `check`
        then starts it again like one that died."""
        check = self.service.health
        if check is None or self.process is None or self.process.poll() is not None or now < self.health_at:
            return
        self.health_at = now + HEALTH_EVERY_SECONDS
        if check():
            self.unhealthy = 0
            return
        self.unhealthy += 1
        name, pid = self.service.name, self.process.pid
        logger.warning(
            "%s: pid %s failed its health check (%d of %d)", name, pid, self.unhealthy, HEALTH_FAILURES
        )
        if self.unhealthy >= HEALTH_FAILURES:
            logger.warning("%s: pid %s hangs; killing it to start it again", name, pid)
            _kill_session(pid)  # SIGKILL: a stopped or deadlocked process cannot ignore it
            self.process.wait()

    def stop(self) -> None:
        if self.process is None:
            return
        _signal_group(self.process.pid, signal.SIGTERM)
        _signal_group(self.process.pid, signal.SIGCONT)  # a stopped process handles TERM once resumed
        try:
            self.process.wait(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            _signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()
        (run_dir() / f"{self.service.name}.pid").unlink(missing_ok=True)
        logger.info("%s: stopped", self.service.name)


def _kill_session(leader: int) -> None:
    """SIGKILL what is left of a dead service: it led a session and group of its own (its pid is
    their id), which its orphaned children are still in."""
    try:
        os.killpg(leader, signal.SIGKILL)
    except ProcessLookupError:
        pass


def supervise(chosen: list[Service]) -> None:
    """Run the services until SIGTERM or SIGINT, starting again each one that dies; then stop
    them in reverse order."""
    stopping = {"now": False}

    def request_stop(signum, frame) -> None:
        stopping["now"] = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    supervised = [Supervised(service) for service in chosen]
    for entry in supervised:
        entry.start()
    while not stopping["now"]:
        for entry in supervised:
            entry.check()
        time.sleep(POLL_SECONDS)
    redis = [entry for entry in supervised if entry.service.name == "redis"]
    for entry in reversed(supervised):
        if entry not in redis:
            entry.stop()
    # What the services started and left behind (learners, the spare learner), before Redis goes.
    keep = {entry.process.pid for entry in redis if entry.process is not None}
    if left := stack_processes_stop(settings.FLYWHEEL_HOME, exclude=keep | {os.getpid()}):
        logger.info("stopped %d processes the services had started: %s", len(left), left)
    for entry in redis:
        entry.stop()


def supervisor_start(names: list[str] | None = None) -> int:
    """Start the supervisor detached (unless it runs); returns its pid."""
    argv = [sys.executable, str(settings.BASE_DIR / "manage.py"), "flywheel_supervise"]
    if names:
        argv += ["--services", ",".join(names)]
    return service_start(Service("supervisor", argv))

"""What each Celery worker tells the operations page about itself, written to Redis.

Every worker's main process beats every BEAT_SECONDS from a thread of its own (a task that blocks a
solo worker's loop does not stop it): its record (host, pid, queues, device, memory, the tasks it
runs and since when) under RECORD_KEY, and an ALIVE_KEY that expires ALIVE_SECONDS after the last
beat. A worker killed with SIGKILL stops beating, so its alive key lapses within ALIVE_SECONDS and
the page shows it gone; its record stays for RECORD_KEEP_SECONDS so it can say when it was last
seen, and a worker that starts again under the same name counts a restart. Each process that runs
tasks beats its sandbox pool's counts into SANDBOXES_KEY the same way, and a failed task is pushed
onto EVENTS_KEY (capped). Redis keeps time for liveness (key expiry), so hosts' clocks need not
agree. Nothing here touches the database.
"""

import json
import logging
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable
from datetime import UTC, datetime

import psutil
from django.conf import settings
from redis import Redis

logger = logging.getLogger(__name__)

BEAT_SECONDS = 2.0
ALIVE_SECONDS = 6  # three missed beats: a killed worker shows as gone within this (plus a refresh)
RECORD_KEEP_SECONDS = 3600  # a gone worker's record, for "last seen" and restart counts
WORKERS_KEY = "flywheel:ops:workers"  # set of worker names with a record
RECORD_KEY = "flywheel:ops:worker:{name}"
ALIVE_KEY = "flywheel:ops:alive:{name}"
SANDBOX_PIDS_KEY = "flywheel:ops:sandbox-pids:{name}"  # the worker's processes that have a pool
SANDBOXES_KEY = "flywheel:ops:sandboxes:{name}:{pid}"  # one process's pool counts
EVENTS_KEY = "flywheel:ops:events"  # newest first: task failures, worker restarts
EVENTS_KEEP = 200
MESSAGE_CHARS = 500
SENT_AT_HEADER = "flywheel_sent_at"  # put on every task message when it is published (queue waits)


def redis_client() -> Redis:
    return Redis.from_url(settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1)


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def event_push(client: Redis, event: dict) -> None:
    pipe = client.pipeline()
    pipe.lpush(EVENTS_KEY, json.dumps({"at": now_iso(), **event}))
    pipe.ltrim(EVENTS_KEY, 0, EVENTS_KEEP - 1)
    pipe.execute()


def device_describe() -> str:
    """The host's accelerators as nvidia-smi names them, else "cpu". Asked once, at start: the
    worker's main process must not initialise CUDA (its pool forks from it)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "" or not shutil.which("nvidia-smi"):
        return "cpu"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "cpu"
    gpus = [line.strip() for line in out.splitlines() if line.strip()]
    return f"{len(gpus)}× {gpus[0]}" if gpus else "cpu"


def memory_bytes(pid: int) -> int:
    """Memory of the worker: its own process and every descendant (pool processes, learners it
    supervises, sandboxes), which is what the host pays for it. Proportional set sizes where the
    system gives them: forked pool processes share most of their pages with their parent, which
    resident sizes would count once per process."""
    try:
        process = psutil.Process(pid)
        processes = [process, *process.children(recursive=True)]
    except psutil.Error:
        return 0
    return sum(_process_memory(each) for each in processes)


def _process_memory(process: psutil.Process) -> int:
    try:
        full = process.memory_full_info()
        return int(getattr(full, "pss", full.rss))
    except psutil.AccessDenied:
        try:
            return process.memory_info().rss
        except psutil.Error:
            return 0
    except psutil.Error:  # exited meanwhile
        return 0


def task_integer_args(args: object) -> list[int]:
    """The ids a task was called with (tasks take ids, never payloads): at most three, ints only."""
    if not isinstance(args, list | tuple):
        return []
    return [arg for arg in args[:3] if isinstance(arg, int) and not isinstance(arg, bool)]


class WorkerBeat:
    """The main process's beat: one thread, started when the worker is ready."""

    def __init__(self, *, name: str, queues: list[str], concurrency: int, pool: str, tasks: Callable) -> None:
        self.name = name
        self.queues = queues
        self.concurrency = concurrency
        self.pool = pool
        self.tasks = tasks  # () -> [{"task", "id", "args", "since", "pid"}]
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self.started_at = now_iso()
        self.device = device_describe()
        self.restarts = 0
        self.previous: dict | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="ops-heartbeat", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def run(self) -> None:
        client = redis_client()
        first = True
        while not self.stop.is_set():
            try:
                if first:
                    self.restart_note(client)
                    first = False
                self.beat(client)
            except Exception as exc:  # noqa: BLE001 - Redis away: beat again next time, never die
                logger.warning("ops heartbeat failed: %s", exc)
            self.stop.wait(BEAT_SECONDS)

    def restart_note(self, client: Redis) -> None:
        """Another process beat under this name before: count a restart, and say how it ended."""
        raw = client.get(RECORD_KEY.format(name=self.name))
        if not raw:
            return
        before = json.loads(raw)
        if before.get("pid") == self.pid and before.get("host") == self.host:
            return
        ended = "stopped" if before.get("state") == "stopped" else "gone"
        self.restarts = int(before.get("restarts", 0)) + 1
        self.previous = {"pid": before.get("pid"), "ended": ended, "last_seen_at": before.get("beat_at")}
        how = "after it stopped" if ended == "stopped" else "after its process was lost without stopping"
        event_push(
            client,
            {"kind": "worker_restarted", "worker": self.name, "message": f"{self.name} started again {how}"},
        )

    def record(self, state: str) -> dict:
        return {
            "name": self.name,
            "host": self.host,
            "pid": self.pid,
            "queues": self.queues,
            "concurrency": self.concurrency,
            "pool": self.pool,
            "state": state,
            "started_at": self.started_at,
            "beat_at": now_iso(),
            "device": self.device,
            "memory_bytes": memory_bytes(self.pid),
            "restarts": self.restarts,
            "previous": self.previous,
            "tasks": self.tasks(),
        }

    def beat(self, client: Redis, state: str = "running") -> None:
        pipe = client.pipeline()
        pipe.sadd(WORKERS_KEY, self.name)
        pipe.set(RECORD_KEY.format(name=self.name), json.dumps(self.record(state)), ex=RECORD_KEEP_SECONDS)
        if state == "running":
            pipe.set(ALIVE_KEY.format(name=self.name), self.pid, ex=ALIVE_SECONDS)
        else:
            pipe.delete(ALIVE_KEY.format(name=self.name))
        pipe.execute()

    def shutdown(self) -> None:
        """A worker that stops in order says so at once (a killed one is found by its silence)."""
        self.stop.set()
        try:
            self.beat(redis_client(), state="stopped")
        except Exception as exc:  # noqa: BLE001
            logger.warning("ops heartbeat could not record the stop: %s", exc)


class SandboxBeat:
    """A task-running process's beat: its sandbox pool's counts, while it has a pool, under a key
    of its own that lapses with it (a pool process that dies takes its count away)."""

    def __init__(self, name: str, counts: Callable[[], dict | None]) -> None:
        self.name = name
        self.counts = counts
        self.pid = os.getpid()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="ops-sandbox-beat", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def run(self) -> None:
        client = redis_client()
        while not self.stop.is_set():
            try:
                self.beat(client)
            except Exception as exc:  # noqa: BLE001 - Redis away: beat again next time, never die
                logger.debug("sandbox beat failed: %s", exc)
            self.stop.wait(BEAT_SECONDS)

    def beat(self, client: Redis) -> None:
        counts = self.counts()
        if counts is None:
            return
        pids = SANDBOX_PIDS_KEY.format(name=self.name)
        pipe = client.pipeline()
        pipe.sadd(pids, self.pid)
        pipe.expire(pids, RECORD_KEEP_SECONDS)
        pipe.set(SANDBOXES_KEY.format(name=self.name, pid=self.pid), json.dumps(counts), ex=ALIVE_SECONDS)
        pipe.execute()


def task_failure_record(*, worker: str, task: str, task_id: str, args: object, exc: BaseException) -> None:
    """A task that raised, for the page's recent failures (message cut to MESSAGE_CHARS)."""
    try:
        event_push(
            redis_client(),
            {
                "kind": "task_failed",
                "worker": worker,
                "task": task,
                "task_id": task_id,
                "args": task_integer_args(args),
                "error": type(exc).__name__,
                "message": str(exc)[:MESSAGE_CHARS],
            },
        )
    except Exception as error:  # noqa: BLE001 - reporting must not hide the task's own failure
        logger.warning("could not record a task failure: %s", error)

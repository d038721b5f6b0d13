"""The real Celery workers a benchmark runs against: the embedded Redis, then each worker as its
own process, started one after another (each once it says it is ready)."""

import subprocess
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def start_workers(
    env: dict[str, str], workers: tuple[tuple[str, str], ...], host: str
) -> list[subprocess.Popen]:
    """`workers`: (queues, name) pairs; each worker is named `<name>@<host>`."""
    from webapp.embedded_redis import redis_start
    from webapp.stack import solo_worker_argv

    redis_start(home=Path(env["FLYWHEEL_HOME"]), port=int(env["FLYWHEEL_REDIS_PORT"]))
    processes = []
    for queues, name in workers:
        process = subprocess.Popen(
            solo_worker_argv(queues, f"{name}@{host}"),
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for line in process.stdout:
            if " ready." in line:
                break
        # Keep reading: a worker whose output pipe fills up blocks on its next log line.
        threading.Thread(target=lambda process=process: [None for _ in process.stdout], daemon=True).start()
        processes.append(process)
    return processes


def stop_all(processes: list[subprocess.Popen]) -> None:
    """Stop what `start_workers` (and a web server beside them) started, then the embedded Redis: a
    process still busy after a minute is killed."""
    from webapp.stack import process_stop

    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a worker still finishing a task
            process.kill()
    process_stop("redis")

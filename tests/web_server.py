"""A real web server process (uvicorn with the stack's own arguments, webapp/web_server.py) for
tests that must measure it from outside (its memory) or talk to it over real sockets (the API
fuzzer)."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from webapp import web_server

START_SECONDS = 60.0
STOP_SECONDS = 15.0
ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class WebServer:
    """`with WebServer(env) as server:` starts the server and waits until it answers."""

    def __init__(self, env: dict[str, str], log: Path, workers: int = 1) -> None:
        self.env = env
        self.log = log
        self.workers = workers
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "WebServer":
        argv = web_server.web_argv(
            python=sys.executable, bind="127.0.0.1", port=self.port, workers=self.workers
        )
        with open(self.log, "ab") as output:
            self.process = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=self.env,
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._wait_answering()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def _wait_answering(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the web server exited ({self.process.returncode}); see {self.log}")
            try:
                urllib.request.urlopen(f"{self.url}/healthz", timeout=2).close()
                return
            except urllib.error.HTTPError:
                return  # any HTTP answer (503 without workers) means it serves
            except OSError:
                time.sleep(0.2)  # not listening yet: poll again until the deadline
        raise RuntimeError(f"the web server did not answer in {START_SECONDS:.0f}s; see {self.log}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@contextlib.contextmanager
def served_with_workers(log: Path, rollout_queues: str = "rollout") -> Iterator["WebServer"]:
    """A live web server with a learner host and a rollout host of its own behind it: what a
    client of an API (the OpenAI one, Tinker's) talks to in an end-to-end test."""
    from tests.run_harness import Host, hosts_killed, worker_env

    env = worker_env()
    learner_host, rollout_host = Host(env), Host(env)
    with hosts_killed(learner_host, rollout_host):
        learner_host.worker("learner,control")
        rollout_host.worker(rollout_queues)
        with WebServer(env, log) as server:
            yield server

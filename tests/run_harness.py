"""What the end-to-end and recovery tests of runs share: a tiny model, a demo project, real
Celery worker processes pointed at the test database, and waiting on the record."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.db import connection

from projects import services as project_services
from projects.demo_tasks import demo_task_sets
from rewards import services as reward_services
from runs.models import Run
from tests.conftest import make_project, make_user
from tiers import services as tier_services
from webapp.stack import solo_worker_argv
from webapp.web_server import web_argv
from workers.base_model import BaseModelConfig, base_model_build

RUN_TIMEOUT_SECONDS = 300
TINY = BaseModelConfig(
    seed=3,
    corpus_size=400,
    vocab_size=256,
    hidden_size=32,
    layers=1,
    heads=2,
    intermediate_size=64,
    steps=20,
    batch_size=16,
    warmup_steps=2,
    heldout_size=8,
)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny-base")
    base_model_build(path, TINY, log=lambda line: None)
    return path


def database_url() -> str:
    """The test database, for worker processes that must see what the test writes."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def worker_env(**extra: str) -> dict[str, str]:
    return (
        os.environ
        | {
            "DATABASE_URL": database_url(),
            "REDIS_URL": settings.REDIS_URL,
            "FLYWHEEL_HOME": str(settings.FLYWHEEL_HOME),
            "FLYWHEEL_ROLLOUT_RESEND_SECONDS": "3",
            "FLYWHEEL_ROLLOUT_LEASE_SECONDS": "8",
            "FLYWHEEL_LEARNER_HEARTBEAT_TIMEOUT": "8",
            "FLYWHEEL_TICK_SECONDS": "2",
            # Each worker's start-up sandbox check (2 s of CPU) is tested in test_ops, not in every run.
            "FLYWHEEL_SANDBOX_WORKER_CHECK": "false",
        }
        | extra
    )


class Host:
    """A set of processes standing for one machine: killing the host kills all of them.

    Fixtures start a host's processes inside `with hosts_killed(...)` (or a try/finally), so a
    pytest-timeout that fires while a worker is still starting kills what was started: a fixture
    whose set-up fails never runs the code after its yield."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.processes: list[subprocess.Popen] = []

    def argv(self, argv: list[str]) -> list[str]:
        """The command line that runs `argv` on this host (a subclass runs it elsewhere)."""
        return argv

    def worker(self, queues: str) -> subprocess.Popen:
        name = f"{queues.replace(',', '-')}-{uuid.uuid4().hex[:6]}@test"
        argv = self.argv(solo_worker_argv(queues, name))
        process = subprocess.Popen(
            argv,
            cwd=settings.BASE_DIR,
            env=self.env,
            start_new_session=True,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self.processes.append(process)
        for line in process.stdout:
            if " ready." in line:
                break
        else:
            raise AssertionError(f"worker {name} exited before it was ready")
        # Keep reading: a worker whose output pipe fills up blocks on its next log line.
        threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()
        return process

    def beat(self, folder: Path) -> subprocess.Popen:
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "webapp",
            "beat",
            "--schedule",
            str(folder / "beat-schedule"),
        ]
        return self._start(argv, log=folder / "beat.log")

    def web(self, folder: Path, *, bind: str, port: int) -> subprocess.Popen:
        """The web server (one uvicorn process); returns once its /healthz says healthy: the database,
        Redis and a worker for every queue answer (start the workers first)."""
        argv = web_argv(python=sys.executable, bind=bind, port=port, workers=1)
        process = self._start(argv, log=folder / "web.log")
        url = f"http://{bind}:{port}"
        wait_until(lambda: web_answers(f"{url}/healthz"), f"the web server at {url}", timeout=120)
        return process

    def _start(self, argv: list[str], log: Path) -> subprocess.Popen:
        with open(log, "ab") as output:
            process = subprocess.Popen(
                self.argv(argv),
                cwd=settings.BASE_DIR,
                env=self.env,
                start_new_session=True,
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.processes.append(process)
        return process

    def send(self, sig: int) -> None:
        for process in self.processes:
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.send(sig)
        for process in self.processes:
            process.wait(timeout=30)
        self.processes.clear()


@contextmanager
def hosts_killed(*hosts: Host) -> Iterator[None]:
    """Kill every host on the way out, whatever raised (a timeout while a worker starts too), and
    every one of them even if killing another fails."""
    try:
        yield
    finally:
        with ExitStack() as stack:
            for host in hosts:
                stack.callback(host.kill)


def web_answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2, trust_env=False).status_code == 200
    except httpx.TransportError:
        return False


def learner_kill(run: Run) -> None:
    """kill -9 of the run's learner process (and only it)."""
    os.kill(run.learner_pid, signal.SIGKILL)


def demo_project(
    model: Path, *, train_size: int = 8, heldout_size: int = 4, max_new_tokens: int = 12
) -> dict:
    owner = make_user(f"owner-{uuid.uuid4().hex[:6]}")
    project = make_project(owner, name=f"demo-{uuid.uuid4().hex[:6]}")
    task_set = project_services.task_set_create(project=project, name="demo", by=owner)
    sets = demo_task_sets(seed=0, train_size=train_size, heldout_size=heldout_size)
    lines = [(json.dumps(item) + "\n").encode() for item in sets["train"] + sets["heldout"]]
    version = project_services.task_set_import(
        task_set=task_set, stream=lines, file_format="jsonl", by=owner
    ).version
    rule = reward_services.reward_rule_create(
        project=project, name="tests", spec={"type": "unit_tests", "name": "tests"}, by=owner
    )
    tier = tier_services.tier_create(
        project=project,
        by=owner,
        name="rollout",
        base_model=str(model),
        temperature=1.0,
        max_new_tokens=max_new_tokens,
    )
    return {"owner": owner, "project": project, "version": version, "rule": rule, "tier": tier}


def run_body(setup: dict, *, steps: int, **hyperparameters) -> dict:
    """A GRPO run of the demo project over REST. The tests' tiny model rarely passes a demo item,
    so most steps have no reward variance: these runs test the machinery, not learning, and the
    nothing_to_learn monitor only alerts for them (tests/test_outcomes.py tests it stopping)."""
    return {
        "project": setup["project"].pk,
        "name": "test run",
        "task_set_version": setup["version"].pk,
        "reward_rule_version": setup["rule"].versions.get().pk,
        "tier": setup["tier"].pk,
        "method": "grpo",
        "hyperparameters": {"group_size": 4, "batch_size": 4, "staleness": 1, "eval_items": 4}
        | hyperparameters,
        "max_steps": steps,
        "monitor_actions": {"nothing_to_learn": "alert"},
    }


def wait_until(condition: Callable[[], bool], what: str, timeout: float = RUN_TIMEOUT_SECONDS) -> None:
    """Poll the record for a condition, with a deadline (this is waiting on state, not a sleep
    standing in for synchronisation)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def wait_for_terminal(run_id: int) -> Run:
    wait_until(lambda: Run.objects.get(pk=run_id).is_terminal, f"run {run_id} to finish")
    return Run.objects.get(pk=run_id)

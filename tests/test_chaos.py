"""Chaos: kill -9 of the services a deployment depends on, with real processes. Redis dies under a
real web server and a real browser; the stack's supervisor brings a killed Redis, web server and
worker back; a request killed with its server leaves its Idempotency-Key free. (kill -9 of a
rollout worker mid-batch: tests/test_run_recovery.py.)"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

from core.models import IdempotencyKey
from projects import services as project_services
from projects.models import Project, TaskItem, TaskSetVersion
from runs.lifecycle import RunRequest, run_create
from runs.models import Run, RunEvent
from tests.conftest import make_project, make_user
from tests.run_harness import demo_project, tiny_model, wait_until, worker_env
from tests.test_run_recovery import start_redis
from webapp import web_server
from webapp.embedded_redis import redis_ping

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["tiny_model"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def call(base: str, method: str, path: str, token: str = "", body=None, headers=None) -> tuple[int, dict]:
    """One HTTP request; (status, JSON body or {})."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    request = urllib.request.Request(base + path, data=data, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if body is not None and not isinstance(body, bytes):
        request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, {}


def answers(base: str) -> bool:
    try:
        call(base, "GET", "/healthz")
        return True
    except OSError:
        return False


class WebServer:
    """The stack's web server (uvicorn) on the test database, in a process group of its own."""

    def __init__(self, folder: Path, **env: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = worker_env(**env)
        self.log = folder / f"web-{self.port}.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> "WebServer":
        argv = web_server.web_argv(python=sys.executable, bind="127.0.0.1", port=self.port, workers=1)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                argv, cwd=settings.BASE_DIR, env=self.env, stdout=log, stderr=log, start_new_session=True
            )
        wait_until(lambda: answers(self.base), f"the web server on {self.port}", timeout=60)
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


@pytest.fixture
def servers(tmp_path):
    made: list[WebServer] = []

    def make(**env: str) -> WebServer:
        made.append(WebServer(tmp_path, **env))
        return made[-1]

    yield make
    for server in made:
        server.kill()


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


# --- Redis killed under a live web server ---------------------------------------------------


def test_a_redis_outage_keeps_reads_refuses_writes_with_503_keeps_live_pages_and_recovers(
    tiny_model, servers, tmp_path
):
    from playwright.sync_api import expect

    from tests.test_browser import chromium_page

    redis_port = free_port()
    redis = start_redis(redis_port, tmp_path)
    try:
        setup = demo_project(tiny_model)
        owner, project = setup["owner"], setup["project"]
        run = run_create(
            request=RunRequest(
                project=project,
                name="watched",
                task_set_version=setup["version"],
                reward_rule_version=setup["rule"].versions.get(),
                tier=setup["tier"],
                hyperparameters={"group_size": 2, "batch_size": 2},
                max_steps=2,
            ),
            by=owner,
        )
        Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
        _, token = project_services.api_token_create(user=owner, name="chaos")
        web = servers(REDIS_URL=f"redis://127.0.0.1:{redis_port}/0").start()
        assert call(web.base, "POST", "/api/v1/projects", token, {"name": "before"})[0] == 201

        with chromium_page() as page:
            page.context.add_cookies([{"name": "sessionid", "value": session_cookie(owner), "url": web.base}])
            page.goto(f"{web.base}/runs/{run.pk}/")
            status = page.locator("#live-status")
            status.wait_for()
            expect(status).to_have_text("live")  # (a string predicate would be eval'd: the CSP refuses it)

            redis.send_signal(signal.SIGKILL)
            redis.wait(timeout=20)
            killed_at = time.monotonic()

            # Reads answer; the throttle (a Redis cache) fails open.
            code, body = call(web.base, "GET", f"/api/v1/runs?project={project.pk}", token)
            assert code == 200 and [row["id"] for row in body["results"]] == [run.pk]
            assert call(web.base, "GET", f"/api/v1/runs/{run.pk}/events", token)[0] == 200
            # Writes answer 503 in the error shape, and change nothing.
            code, body = call(web.base, "POST", "/api/v1/projects", token, {"name": "during"})
            assert code == 503, body
            assert body["error"]["code"] == "service_unavailable" and "Redis" in body["error"]["message"]
            assert set(body["error"]) == {"code", "message", "param", "details"}
            assert not Project.objects.filter(name="during").exists()
            code, health = call(web.base, "GET", "/healthz", settings.FLYWHEEL_OPS_TOKEN)  # the detail
            assert code == 503 and health["redis"]["ok"] is False and health["redis"]["detail"]
            assert health["database"]["ok"] is True

            # The live page says so and keeps showing the record, from REST.
            expect(status).to_contain_text("refreshing every 5 s", timeout=20_000)
            RunEvent.objects.create(run=run, kind="note", message="written while Redis was down")
            page.locator("#events-body").get_by_text("written while Redis was down").wait_for(timeout=20_000)

            redis = start_redis(redis_port, tmp_path)
            restarted_at = time.monotonic()
            wait_until(
                lambda: call(web.base, "POST", "/api/v1/projects", token, {"name": "after"})[0] == 201,
                "writes to resume",
                timeout=30,
            )
            writes_back = time.monotonic() - restarted_at
            assert writes_back < 5, writes_back  # the circuit breaker tries Redis again every 2 s
            assert Project.objects.filter(name="after").count() == 1
            assert call(web.base, "GET", "/healthz", settings.FLYWHEEL_OPS_TOKEN)[1]["redis"]["ok"] is True
            expect(status).to_have_text("live", timeout=20_000)
            assert time.monotonic() - killed_at > 0
    finally:
        redis.send_signal(signal.SIGKILL)
        redis.wait(timeout=20)


# --- the stack's supervisor ----------------------------------------------------------------


def pid_in(home: Path, name: str) -> int | None:
    try:
        pid = int((home / "run" / f"{name}.pid").read_text())
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None
    return pid


def test_the_supervisor_restarts_a_killed_redis_web_server_and_worker_within_10_seconds(tmp_path):
    home, port, redis_port = tmp_path / "home", free_port(), free_port()
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "REDIS_URL")}
    env |= {
        "FLYWHEEL_HOME": str(home),
        "PORT": str(port),
        "FLYWHEEL_REDIS_PORT": str(redis_port),
        "FLYWHEEL_WEB_WORKERS": "1",
        "FLYWHEEL_SANDBOX_WORKER_CHECK": "false",
    }
    base = f"http://127.0.0.1:{port}"
    supervisor = subprocess.Popen(
        [sys.executable, "manage.py", "flywheel_supervise", "--services", "redis,web,worker-eval"],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=(tmp_path / "supervisor.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    worker_log = home / "logs" / "worker-eval.log"
    try:
        wait_until(lambda: redis_ping(redis_port) and answers(base), "redis and the web server", timeout=90)
        wait_until(
            lambda: worker_log.exists() and worker_log.read_text().count(" ready.") == 1, "the worker", 120
        )
        restarted = {}
        checks = {
            "redis": lambda: redis_ping(redis_port),
            "web": lambda: answers(base),
            "worker-eval": lambda: worker_log.read_text().count(" ready.") == 2,
        }
        for name, back in checks.items():
            old = pid_in(home, name)
            os.kill(old, signal.SIGKILL)
            killed_at = time.monotonic()
            wait_until(
                lambda old=old, name=name: pid_in(home, name) not in (None, old), f"{name} restarted", 30
            )
            started = time.monotonic() - killed_at
            wait_until(back, f"{name} serving again", timeout=120)
            restarted[name] = (started, time.monotonic() - killed_at)
        print("restart seconds (process started, serving):", restarted)
        assert restarted["redis"][1] < 10 and restarted["web"][1] < 10, restarted
        assert restarted["worker-eval"][0] < 10, restarted  # started again; ready once it has loaded
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(timeout=90)
    # Stopping the supervisor stopped every service it ran.
    assert all(pid_in(home, name) is None for name in ("redis", "web", "worker-eval"))
    assert not redis_ping(redis_port) and not answers(base)


# --- an idempotency key whose request died with its server ----------------------------------


def test_an_import_killed_with_its_server_leaves_its_key_free_and_no_draft(servers, tmp_path):
    owner = make_user("importer")
    project = make_project(owner, name="imports")
    task_set = project_services.task_set_create(project=project, name="big", by=owner)
    _, token = project_services.api_token_create(user=owner, name="chaos")
    lines = b"".join(
        json.dumps({"id": f"q{n}", "prompt": f"What is {n} + 1?", "reference": str(n + 1)}).encode() + b"\n"
        for n in range(60_000)
    )
    boundary = "flywheel-chaos"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + lines
        + f"\r\n--{boundary}--\r\n".encode()
    )
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}", "Idempotency-Key": "import-1"}
    path = f"/api/v1/task-sets/{task_set.pk}/import"

    first = servers().start()
    threading.Thread(
        target=lambda: _ignore_errors(call, first.base, "POST", path, token, body, headers)
    ).start()
    drafts = TaskSetVersion.all_objects.filter(task_set=task_set, published=False)
    wait_until(
        lambda: TaskItem.objects.filter(version__in=drafts).exists(), "the import writing its items", 60
    )
    first.kill()  # kill -9 mid-import: the in-flight marker and a half-written draft stay behind
    assert IdempotencyKey.objects.get(key="import-1").response_status is None
    assert not TaskSetVersion.objects.filter(task_set=task_set).exists()  # nothing half-imported shows

    second = servers().start()
    retried_at = time.monotonic()
    code, created = call(second.base, "POST", path, token, body, headers)
    assert code == 201, created  # not 409 "in progress" for 24 hours: its process is gone
    assert time.monotonic() - retried_at < 60
    assert created["number"] == 1 and created["item_count"] == 60_000
    assert TaskSetVersion.objects.filter(task_set=task_set).count() == 1
    assert not TaskSetVersion.all_objects.filter(task_set=task_set, published=False).exists()  # swept
    assert TaskItem.objects.filter(version__task_set=task_set).count() == 60_000
    code, replay = call(second.base, "POST", path, token, body, headers)
    assert code == 201 and replay == created


def _ignore_errors(function, *args) -> None:
    try:
        function(*args)
    except OSError:  # the server was killed under it: the point of the test
        pass

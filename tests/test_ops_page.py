"""The operations page and GET /api/v1/ops/overview (issue 26): who may look, what an owner sees of
other projects, a real Celery worker seen, killed with SIGKILL and shown gone within 10 s, then its
replacement seen; the queues' waits; the Prometheus gauges."""

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.test import Client
from rest_framework.test import APIClient

from core.roles import Role
from ops.heartbeats import (
    ALIVE_SECONDS,
    EVENTS_KEY,
    SandboxBeat,
    WorkerBeat,
    redis_client,
    task_failure_record,
)
from runs.models import Run
from tests.conftest import api_client_for, make_project, make_user
from tests.run_harness import wait_until
from tests.test_api_schema import assert_matches_schema, schema  # noqa: F401 - a fixture
from tests.test_live_browser import build_run
from webapp.celery import app as celery_app
from webapp.stack import solo_worker_argv

OVERVIEW = "/api/v1/ops/overview"
GONE_WITHIN_SECONDS = 10.0  # the promise for a killed worker


def overview(client) -> dict:
    response = client.get(OVERVIEW)
    assert response.status_code == 200, response.content
    return response.json()


def worker_in(body: dict, name: str) -> dict | None:
    return next((worker for worker in body["workers"] if worker["name"] == name), None)


@pytest.fixture
def clean_ops_keys():
    """This test's view of the heartbeats starts empty (other tests' workers leave records)."""
    client = redis_client()
    for key in client.scan_iter("flywheel:ops:*"):
        client.delete(key)
    yield client
    for key in client.scan_iter("flywheel:ops:*"):
        client.delete(key)


# --- who may look ------------------------------------------------------------------------------


def test_only_owners_and_staff_get_the_overview_and_the_page(team):
    staff = make_user("operator")
    staff.is_staff = True
    staff.save()
    for role in (Role.LAUNCHER, Role.REVIEWER, Role.VIEWER):
        response = api_client_for(team[role]).get(OVERVIEW)
        assert (response.status_code, response.json()["error"]["code"]) == (403, "forbidden")
        page = Client()
        page.force_login(team[role])
        assert page.get("/ops/").status_code == 403
        assert b'href="/ops/"' not in page.get("/").content  # no link to a page they cannot open
    assert APIClient().get(OVERVIEW).status_code == 401
    assert Client().get("/ops/")["Location"].startswith("/accounts/login/")
    assert overview(api_client_for(team[Role.OWNER]))["scope"] == "own_projects"
    assert overview(api_client_for(staff))["scope"] == "all"
    page = Client()
    page.force_login(team[Role.OWNER])
    assert b'href="/ops/"' in page.get("/").content
    response = page.get("/ops/")
    assert response.status_code == 200 and b"<h1>Operations</h1>" in response.content


def test_an_owner_sees_every_worker_but_names_only_the_runs_of_their_projects(db, clean_ops_keys):
    ada, bob, staff = make_user("ada"), make_user("bob"), make_user("staff")
    staff.is_staff = True
    staff.save()
    ours = build_run(ada)
    theirs = run_in_project_of(bob, ours, "secret-run")
    tasks = [
        {
            "task": "workers.learner.supervise",
            "id": "t1",
            "args": [ours.pk],
            "since": time.time() - 90,
            "pid": 11,
        },
        {"task": "workers.eval.policy", "id": "t2", "args": [theirs.pk, 3], "since": time.time(), "pid": 12},
    ]
    beat = WorkerBeat(
        name="learner@ops-host", queues=["learner"], concurrency=2, pool="prefork", tasks=lambda: tasks
    )
    beat.beat(clean_ops_keys)
    boom = RuntimeError(f"prompt of {theirs.name} was too long")
    task_failure_record(
        worker="eval@ops-host", task="workers.eval.policy", task_id="t3", args=[theirs.pk], exc=boom
    )

    body = overview(api_client_for(ada))
    worker = worker_in(body, "learner@ops-host")
    assert (worker["state"], worker["queues"], worker["pid"]) == ("alive", ["learner"], os.getpid())
    mine, other = worker["tasks"]
    assert mine["run"] == {"id": ours.pk, "name": ours.name, "project": ours.project_id, "hidden": False}
    assert other["run"] == {"id": None, "name": "a run of another project", "project": None, "hidden": True}
    assert "secret-run" not in str(body)  # neither its name nor the failure's message
    (failure,) = [f for f in body["failures"] if f["kind"] == "task_failed"]
    assert failure["message"] == "RuntimeError (details are shown to members of the run's project)"

    as_staff = overview(api_client_for(staff))
    assert worker_in(as_staff, "learner@ops-host")["tasks"][1]["run"]["name"] == "secret-run"
    (failure,) = [f for f in as_staff["failures"] if f["kind"] == "task_failed"]
    assert failure["message"] == "RuntimeError: prompt of secret-run was too long"
    page = Client()
    page.force_login(ada)
    html = page.get("/ops/").content.decode()
    assert "learner@ops-host" in html and ours.name in html and "secret-run" not in html


def run_in_project_of(owner, like: Run, name: str) -> Run:
    """A copy of `like` in a project of owner's own (only its project and name matter here)."""
    project = make_project(owner, name=f"{owner.username}-project")
    return Run.objects.create(
        **{f.attname: getattr(like, f.attname) for f in Run._meta.concrete_fields if not f.primary_key}
        | {"project_id": project.pk, "name": name, "key": uuid.uuid4()}
    )


def test_the_overview_matches_its_declared_shape(team, clean_ops_keys, schema):  # noqa: F811
    beat = WorkerBeat(name="rollout@ops-host", queues=["rollout"], concurrency=1, pool="solo", tasks=list)
    beat.beat(clean_ops_keys)
    beat.shutdown()  # a stopped worker: state "stopped", no alive key
    client = api_client_for(team[Role.OWNER])
    response = client.get(OVERVIEW)
    assert_matches_schema(schema, response, "get", OVERVIEW)
    assert worker_in(response.json(), "rollout@ops-host")["state"] == "stopped"
    assert_matches_schema(schema, api_client_for(team[Role.VIEWER]).get(OVERVIEW), "get", OVERVIEW)


def test_with_redis_unreachable_the_overview_still_answers_and_says_so(team, settings):
    client = api_client_for(team[Role.OWNER])
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    body = overview(client)
    assert (body["status"], body["redis"]["ok"], body["database"]["ok"]) == ("degraded", False, True)
    assert "ConnectionError" in body["redis"]["detail"]
    assert (body["workers"], body["queues"]) == ([], [])
    page = Client()
    page.force_login(team[Role.OWNER])
    html = page.get("/ops/").content.decode()
    assert "Redis is unreachable: workers cannot be read." in html


def test_sandboxes_in_use_are_counted_per_worker_and_in_total(team, clean_ops_keys):
    from sandboxes.services import sandbox_acquire, sandbox_pool, sandbox_pool_counts
    from tests.sandbox_fixtures import backend_ready, make_spec

    backend_ready("bubblewrap")
    sandbox_pool().close()  # earlier tests in this process may have left sandboxes warm in its pool
    name = "rollout@sandbox-host"
    WorkerBeat(name=name, queues=["rollout"], concurrency=1, pool="solo", tasks=list).beat(clean_ops_keys)
    beat = SandboxBeat(name, sandbox_pool_counts)
    client = api_client_for(team[Role.OWNER])
    with sandbox_acquire(make_spec("bubblewrap")):  # a real sandbox of this process's pool, in use
        beat.beat(clean_ops_keys)
        body = overview(client)
    assert worker_in(body, name)["sandboxes"] == {"live": 1, "busy": 1, "idle": 0, "replaced": 0}
    assert body["sandboxes"] == {"live": 1, "busy": 1, "idle": 0, "replaced": 0}
    beat.beat(clean_ops_keys)  # given back: idle, kept warm
    assert overview(client)["sandboxes"] == {"live": 1, "busy": 0, "idle": 1, "replaced": 0}
    sandbox_pool().close()  # the next user of this process's pool starts a fresh one


# --- a real worker -----------------------------------------------------------------------------


class Worker:
    """A real Celery worker (solo pool) on a queue of this test's own, so it takes no one's work."""

    def __init__(self, name: str, queue: str) -> None:
        self.process = subprocess.Popen(
            solo_worker_argv(queue, name),
            cwd=settings.BASE_DIR,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        # Keep reading: a worker whose output pipe fills up blocks on its next log line.
        threading.Thread(target=lambda: [None for _ in self.process.stdout], daemon=True).start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        if worker.process.poll() is None:
            worker.kill()


def test_a_killed_worker_shows_as_gone_within_10_s_and_its_replacement_appears(team, clean_ops_keys, workers):
    client = api_client_for(team[Role.OWNER])
    queue = f"ops-test-{uuid.uuid4().hex[:8]}"
    name = f"{queue}@ops"

    def state() -> dict | None:
        return worker_in(overview(client), name)

    workers.append(Worker(name, queue))
    wait_until(lambda: (state() or {}).get("state") == "alive", "the worker to be seen", timeout=60)
    first = state()
    assert (first["pid"], first["queues"], first["restarts"]) == (workers[0].pid, [queue], 0)
    assert first["memory_bytes"] > 10 * 2**20 and first["device"]

    workers[0].kill()
    killed_at = time.monotonic()
    wait_until(lambda: state()["state"] == "gone", "the killed worker to show as gone", GONE_WITHIN_SECONDS)
    gone_after = time.monotonic() - killed_at
    assert gone_after <= GONE_WITHIN_SECONDS
    print(f"killed worker shown gone after {gone_after:.1f} s (alive key lasts {ALIVE_SECONDS} s)")

    # Work sent while nobody serves the queue waits, and the page says for how long.
    celery_app.send_task("ops.test.nothing", queue=queue)
    (waiting,) = [q for q in overview(client)["queues"] if q["name"] == queue]
    assert (waiting["waiting"], waiting["workers_alive"]) == (1, 0)
    assert 0 <= waiting["oldest_wait_seconds"] < 60
    clean_ops_keys.delete(queue)  # the replacement must not run it

    workers.append(Worker(name, queue))
    wait_until(lambda: state()["state"] == "alive", "the replacement to be seen", timeout=60)
    second = state()
    assert (second["pid"], second["restarts"]) == (workers[1].pid, 1)
    assert (second["previous"]["pid"], second["previous"]["ended"]) == (workers[0].pid, "gone")
    restarts = [f for f in overview(client)["failures"] if f["kind"] == "worker_restarted"]
    assert [f["worker"] for f in restarts] == [name]
    assert clean_ops_keys.llen(EVENTS_KEY) == 1


def test_a_workers_running_tasks_come_from_celerys_own_bookkeeping():
    """What the main process beats: the requests Celery marked accepted (a pool process took
    them), with their ids and since when, and nothing once they are done."""
    from celery.worker import state
    from celery.worker.request import Request
    from kombu.message import Message

    from webapp.celery import ops_running_tasks

    celery_app.loader.import_default_modules()
    sent = celery_app.amqp.as_task_v2("task-1", "workers.learner.supervise", args=(42,))
    message = Message(
        body=json.dumps(sent.body),
        headers=sent.headers,
        content_type="application/json",
        content_encoding="utf-8",
    )
    request = Request(message, app=celery_app, task=celery_app.tasks["workers.learner.supervise"])
    request.on_accepted(1234, time.monotonic() - 30)
    state.task_accepted(request)
    try:
        (task,) = ops_running_tasks()
        assert (task["task"], task["id"], task["args"], task["pid"]) == (
            "workers.learner.supervise",
            "task-1",
            [42],
            1234,
        )
        assert 29 < time.time() - task["since"] < 40
    finally:
        state.task_ready(request)
    assert ops_running_tasks() == []


# --- Prometheus --------------------------------------------------------------------------------


def test_the_metrics_endpoint_has_gauges_for_workers_queues_and_services(db, clean_ops_keys):
    beat = WorkerBeat(name="eval@ops-host", queues=["eval"], concurrency=3, pool="prefork", tasks=list)
    beat.beat(clean_ops_keys)
    text = (
        Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {settings.FLYWHEEL_OPS_TOKEN}").content.decode()
    )
    assert 'flywheel_workers{queue="eval",state="alive"} 1.0' in text
    assert 'flywheel_workers{queue="learner",state="alive"} 0.0' in text
    assert 'flywheel_queue_waiting{queue="rollout"}' in text
    assert "flywheel_redis_up 1.0" in text and "flywheel_database_up 1.0" in text
    assert "flywheel_redis_latency_seconds" in text and 'flywheel_sandboxes{state="busy"} 0.0' in text

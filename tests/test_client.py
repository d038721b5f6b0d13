"""The `flywheel` client package and command, against a live server: the web server `make up`
starts (uvicorn), on the test database. Retries are checked against a small HTTP server that fails on
purpose, since the real one only fails when something is wrong."""

import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connections

from flywheel import BadRequestError, Client, ForbiddenError, NotFoundError, ServerError
from flywheel._endpoints import endpoints_of
from projects import services as project_services
from projects.models import Project, TaskSet, TaskSetVersion
from runs import lifecycle
from runs.models import Run
from tests.conftest import api_client_for, make_project, make_user
from tests.run_harness import wait_until, worker_env
from tiers import services as tier_services
from traces.models import Trace
from webapp import web_server

pytestmark = pytest.mark.django_db(transaction=True)
FLYWHEEL = str(Path(sys.executable).with_name("flywheel"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def server_url(tmp_path):
    """The stack's web server on the test database and this test's Redis, in one process."""
    port = free_port()
    log = open(tmp_path / "web.log", "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        web_server.web_argv(python=sys.executable, bind="127.0.0.1", port=port, workers=1),
        cwd=settings.BASE_DIR,
        env=worker_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def listening() -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_until(listening, "the web server to listen", timeout=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


@pytest.fixture
def owner_token():
    owner = make_user("client-owner")
    project = make_project(owner, name="client")
    _, token = project_services.api_token_create(user=owner, name="client")
    return {"owner": owner, "project": project, "token": token}


def test_every_operation_of_the_schema_has_a_client_method():
    response = api_client_for(make_user("schema-reader")).get("/api/v1/schema/", {"format": "json"})
    schema = json.loads(response.content)
    operations = {
        (method.upper(), path.removeprefix("/api/v1"))
        for path, item in schema["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    }
    mapped = endpoints_of(Client(url="http://127.0.0.1:1", token="fw_x"))
    assert sorted(operations - set(mapped)) == []  # an operation no client method reaches
    assert sorted(set(mapped) - operations) == []  # a client method for an operation that is gone


TASKS = b'{"id": "a", "prompt": "1+1?", "reference": "2"}\n{"id": "b", "prompt": "2+2?", "reference": "4"}\n'


def test_the_client_creates_lists_every_page_and_raises_the_apis_errors(server_url, owner_token, tmp_path):
    project = owner_token["project"]
    with Client(url=server_url, token=owner_token["token"]) as client:
        assert client.me.get()["username"] == "client-owner"
        path = tmp_path / "tasks.jsonl"
        path.write_bytes(b'{"id": "c", "prompt": "3+3?"}\n')
        with pytest.raises(BadRequestError) as refused:  # created with its file, or not at all
            client.task_sets.create(project.pk, "arith", file=path)
        assert refused.value.details[0]["line"] == 1 and refused.value.details[0]["param"] == "reference"
        assert not TaskSet.objects.filter(project=project).exists()
        path.write_bytes(TASKS)
        task_set = client.task_sets.create(project.pk, "arith", file=path)
        version = task_set["version"]
        assert (version["number"], version["item_count"]) == (1, 2)
        model = tmp_path / "model"  # a local directory: the server checks that a base model exists
        model.mkdir()
        for index in range(3):
            client.tiers.create(project.pk, f"tier-{index}", str(model))
        tiers = list(client.tiers.list(project=project.pk, limit=1))  # three pages of one
        assert [tier["name"] for tier in tiers] == ["tier-2", "tier-1", "tier-0"]
        assert [line["id"] for line in client.task_sets.export(task_set["id"], 1)] == ["a", "b"]
        path.write_bytes(b'{"id": "c", "prompt": "3+3?"}\n')
        with pytest.raises(BadRequestError) as refused:
            client.task_sets.import_file(task_set["id"], path)
        assert refused.value.status == 400 and refused.value.code == "invalid_request"
        assert refused.value.details[0]["line"] == 1 and refused.value.details[0]["param"] == "reference"
        with pytest.raises(NotFoundError):
            client.runs.get(999_999)
    viewer = make_user("client-viewer")
    project_services.member_add(project=project, username=viewer.username, role="viewer")
    _, viewer_token = project_services.api_token_create(user=viewer, name="v")
    with Client(url=server_url, token=viewer_token) as client, pytest.raises(ForbiddenError) as forbidden:
        client.task_sets.create(project.pk, "nope")
    assert "viewer" in forbidden.value.message


def test_a_create_retried_with_its_idempotency_key_is_done_once(server_url, owner_token):
    with Client(url=server_url, token=owner_token["token"]) as client:
        first = client.projects.create("once", idempotency_key="create-once")
        again = client.projects.create("once", idempotency_key="create-once")
    assert first["id"] == again["id"]
    assert Project.objects.filter(name="once").count() == 1


class FlakyHandler(BaseHTTPRequestHandler):
    """Answers 503, then 429 (Retry-After: 0), then 201; records each request's Idempotency-Key."""

    answers = [503, 429, 201]
    seen: list = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).seen.append(self.headers.get("Idempotency-Key"))
        status = type(self).answers[min(len(type(self).seen), len(type(self).answers)) - 1]
        body = json.dumps({"id": 1} if status == 201 else {"error": {"code": "busy", "message": "try later"}})
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Retry-After", "0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args) -> None:
        pass


def test_429_and_5xx_are_retried_with_the_same_idempotency_key(db):
    FlakyHandler.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FlakyHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with Client(url=url, token="fw_x", max_retries=3) as client:
            assert client.projects.create("p") == {"id": 1}
        assert len(FlakyHandler.seen) == 3 and len(set(FlakyHandler.seen)) == 1 and FlakyHandler.seen[0]
        FlakyHandler.seen, FlakyHandler.answers = [], [503]
        with Client(url=url, token="fw_x", max_retries=1) as client, pytest.raises(ServerError) as failed:
            client.projects.create("p")
        assert (failed.value.status, failed.value.code, len(FlakyHandler.seen)) == (503, "busy", 2)
    finally:
        FlakyHandler.answers = [503, 429, 201]
        server.shutdown()


def launchable(owner_token) -> dict:
    from rewards import services as reward_services

    owner, project = owner_token["owner"], owner_token["project"]
    task_set = project_services.task_set_create(project=project, name="t", by=owner)
    version = project_services.task_set_import(
        task_set=task_set, stream=TASKS.splitlines(keepends=True), file_format="jsonl", by=owner
    ).version
    spec = {
        "type": "string_check",
        "name": "s",
        "input": "{{sample.output_text}}",
        "reference": "{{item.reference}}",
        "operation": "eq",
    }
    rule = reward_services.reward_rule_create(project=project, name="r", spec=spec, by=owner)
    tier = tier_services.tier_create(project=project, by=owner, name="t", base_model="org/model")
    return {
        "project": project.pk,
        "task_set_version": version.pk,
        "reward_rule_version": rule.versions.get().pk,
        "tier": tier.pk,
    }


def test_follow_yields_a_runs_events_live_and_ends_when_it_ends(server_url, owner_token):
    ids = launchable(owner_token)
    with Client(url=server_url, token=owner_token["token"]) as client:
        run = client.runs.launch(name="followed", eval_split="train", **ids)
        Run.objects.filter(pk=run["id"]).update(status=Run.Status.RUNNING)
        seen = []

        # Cancelled once the follower's websocket has joined the run's group: the live path, not
        # REST's.
        # (The layer's pub/sub channel for the run's group: subscribed while a viewer is in it.)
        group = f"{settings.CHANNEL_LAYERS['default']['CONFIG']['prefix']}__group__run-{run['id']}"
        broker = redis.Redis.from_url(settings.REDIS_URL)

        def followers() -> int:
            return dict(broker.pubsub_numsub(group)).get(group.encode(), 0)

        def stop_when_followed() -> None:
            wait_until(lambda: followers() > 0, "the follower's websocket", timeout=60)
            lifecycle.run_cancel(run=Run.objects.get(pk=run["id"]))  # running → cancelling
            lifecycle.run_transition(
                Run.objects.get(pk=run["id"]),
                allowed=("cancelling",),
                to="cancelled",
                message="cancelled at step 0",
            )
            connections.close_all()  # this thread's connection, before the test database goes

        stopper = threading.Thread(target=stop_when_followed)
        stopper.start()
        for message in client.follow(run):
            seen.append(message)
        stopper.join()
    messages = [m["payload"]["message"] for m in seen if m["event"] == "event"]
    assert messages[0].startswith("queued") and messages[-2:] == ["cancelling", "cancelled at step 0"]
    assert seen[-1]["event"] == "run" and seen[-1]["payload"]["status"] == "cancelled"
    assert len(messages) == len(set(m["payload"]["id"] for m in seen if m["event"] == "event"))  # none twice
    assert [m["payload"]["status"] for m in seen if m["event"] == "status"] == ["cancelling", "cancelled"]


def test_log_trace_batches_in_the_background_and_flushes(server_url, owner_token):
    project = owner_token["project"]
    client = Client(url=server_url, token=owner_token["token"], project=project.pk, trace_batch_size=100)
    ids = [client.log_trace(prompt=f"q{i}", completion=f"a{i}", model="m", latency_ms=i) for i in range(250)]
    client.flush()
    assert Trace.objects.filter(project=project).count() == 250
    client.log_trace(id=ids[0], feedback={"thumbs": "down", "correction": "better"})
    client.close()  # flushes what is left
    trace = Trace.objects.get(external_id=ids[0])
    assert (trace.prompt, trace.thumbs, trace.correction) == ("q0", "down", "better")
    with pytest.raises(TypeError, match="unknown fields colour"):
        Client(url=server_url, token="x", project=1).log_trace(prompt="p", colour="red")


def flywheel(
    server_url: str, token: str, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess:
    env = os.environ | {"FLYWHEEL_URL": server_url, "FLYWHEEL_TOKEN": token}
    return subprocess.run(
        [FLYWHEEL, *args], env=env, capture_output=True, text=True, input=stdin, timeout=120
    )


def test_the_command_line_imports_launches_lists_cancels_logs_and_exports(server_url, owner_token, tmp_path):
    ids = launchable(owner_token)
    token = owner_token["token"]
    task_set = TaskSet.objects.get(pk=TaskSetVersion.objects.get(pk=ids["task_set_version"]).task_set_id)
    path = tmp_path / "more.jsonl"
    path.write_bytes(TASKS + b'{"id": "c", "prompt": "3+3?", "reference": "6"}\n')
    imported = flywheel(server_url, token, "--json", "tasks", "import", str(task_set.pk), str(path))
    assert imported.returncode == 0, imported.stderr
    assert json.loads(imported.stdout)["item_count"] == 3
    versions = task_set.versions.count()
    forced = ["tasks", "import", "--format", "humaneval", str(task_set.pk), str(path)]
    refused = flywheel(server_url, token, *forced)
    assert refused.returncode != 0  # not HumanEval lines: refused, line by line and field by field
    why = "nothing imported: line 1, field 'canonical_solution': is required (HumanEval line)"
    assert why in refused.stderr
    assert task_set.versions.count() == versions  # nothing written
    new_set = ["tasks", "create", "--project", str(ids["project"]), "more", str(path)]
    created = flywheel(server_url, token, "--json", *new_set)
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["version"]["item_count"] == 3
    path.write_bytes(b'{"id": "c", "prompt": "3+3?"}\n')
    refused = flywheel(
        server_url, token, "tasks", "create", "--project", str(ids["project"]), "less", str(path)
    )
    assert refused.returncode != 0 and "line 1, field 'reference'" in refused.stderr
    assert not TaskSet.objects.filter(name="less").exists()  # a refused file creates no set
    launch = [
        "runs", "launch", "--project", str(ids["project"]), "--name", "cli", "--task-set-version",
        str(ids["task_set_version"]), "--reward-rule-version", str(ids["reward_rule_version"]),
        "--tier", str(ids["tier"]), "--eval-split", "train", "--hp", "group_size=4", "--max-steps", "3",
    ]  # fmt: skip
    launched = flywheel(server_url, token, "--json", *launch)
    assert launched.returncode == 0, launched.stderr
    run = json.loads(launched.stdout)
    assert (run["resolved"]["group_size"], run["max_steps"]) == (4, 3)
    listed = flywheel(server_url, token, "runs", "list", "--project", str(ids["project"]))
    assert f"{run['id']:>6}  queued" in listed.stdout
    cancelled = flywheel(server_url, token, "--json", "runs", "cancel", str(run["id"]))
    assert json.loads(cancelled.stdout)["status"] == "cancelled"
    again = flywheel(server_url, token, "runs", "cancel", str(run["id"]))
    assert again.returncode == 2 and "cancelled" in again.stderr
    traces = "".join(json.dumps({"id": f"t{i}", "prompt": "p", "completion": "c"}) + "\n" for i in range(120))
    logged = flywheel(
        server_url, token, "--json", "traces", "log", "-", "--project", str(ids["project"]), stdin=traces
    )
    assert json.loads(logged.stdout) == {"received": 120, "created": 120, "updated": 0, "unchanged": 0}
    out = tmp_path / "export.jsonl"
    exported = flywheel(
        server_url, token, "export", "--task-set", str(task_set.pk), "--version", "2", "-o", str(out)
    )
    assert exported.returncode == 0, exported.stderr
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["a", "b", "c"]
    refused = flywheel(
        server_url, token, "tasks", "import", str(task_set.pk), str(tmp_path / "missing.jsonl")
    )
    assert refused.returncode == 2 and "missing.jsonl" in refused.stderr and "Traceback" not in refused.stderr


def test_the_client_imports_no_django_and_no_app_of_the_server():
    import ast

    forbidden = {"django", "rest_framework", "channels", "webapp", "workers", "runs", "rewards", "reviews"}
    forbidden |= {"traces", "webhooks", "sandboxes", "inference"}
    found = []
    for path in (Path(settings.BASE_DIR) / "client" / "src" / "flywheel").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            found += [f"{path.name}: {name}" for name in names if name.split(".")[0] in forbidden]
    assert found == []

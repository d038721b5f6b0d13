"""Operations: /healthz with real Celery workers, /metrics, and the management commands."""

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from projects.models import ApiToken, Project, TaskSetVersion
from runs.demo import DEMO_PROJECT, demo_ensure
from tests.conftest import api_client_for, make_project, make_user
from tiers.models import Tier
from webapp.stack import solo_worker_argv

WORKER_STOP_SECONDS = 20


def ops() -> dict[str, str]:
    """The operations token, which /healthz's detail and /metrics ask for (core/ops_access.py)."""
    return {"HTTP_AUTHORIZATION": f"Bearer {settings.FLYWHEEL_OPS_TOKEN}"}


@pytest.fixture(scope="module")
def worker_name():
    """A real Celery worker on every queue, named uniquely so a running `make up` stack
    sharing this Redis cannot be mistaken for it."""
    name = f"test-{uuid.uuid4().hex[:8]}@healthz"
    argv = solo_worker_argv("rollout,learner,eval,control", name)
    # Earlier tests leave messages on these queues (runs scheduled after commit); this worker is
    # here to be seen, not to work, so it starts on empty queues.
    purge = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "webapp",
        "purge",
        "-f",
        "-Q",
        "rollout,learner,eval,control",
    ]
    subprocess.run(purge, cwd=settings.BASE_DIR, check=True, capture_output=True)
    process = subprocess.Popen(
        argv,
        cwd=settings.BASE_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    for line in process.stdout:  # wait for the worker to say it is ready, not for a fixed time
        if " ready." in line:
            break
    else:
        pytest.fail(f"the worker exited before it was ready (code {process.wait()})")
    # Keep reading: a worker whose output pipe fills up blocks on its next log line.
    threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()
    yield name
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=WORKER_STOP_SECONDS)
    except subprocess.TimeoutExpired:  # a warm shutdown waits for a task; this one has none to finish
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_healthz_reports_database_redis_and_the_live_worker_of_each_queue(client, db, worker_name):
    from django.core.cache import cache

    cache.delete("healthz:workers")
    body = client.get("/healthz", **ops()).json()
    assert body["database"]["ok"] is True and body["redis"]["ok"] is True
    assert (
        set(body["queues"]) == set(settings.CELERY_WORKER_QUEUES) == {"rollout", "learner", "eval", "control"}
    )
    for queue in settings.CELERY_WORKER_QUEUES:
        assert worker_name in body["queues"][queue]["names"]


def test_healthz_shows_each_sandbox_workers_start_up_check_and_degrades_on_a_failed_one(
    client, db, settings, worker_name
):
    from django.core.cache import cache

    from tests.run_harness import wait_until

    def sandboxes() -> tuple[int, dict]:
        cache.delete("healthz:workers")
        response = client.get("/healthz", **ops())
        return response.status_code, response.json()["sandboxes"].get(worker_name, {})

    wait_until(lambda: sandboxes()[1].get("ok") is not None, "the worker's sandbox check", timeout=60)
    status, check = sandboxes()
    (backend,) = check["backends"]
    assert (status, check["ok"]) == (200, True)
    assert (backend["backend"], backend["detail"]) == (settings.FLYWHEEL_SANDBOX_BACKEND, "graded right")
    # The same worker's host losing bubblewrap: what its check records turns /healthz degraded.
    settings.FLYWHEEL_SANDBOX_BWRAP = "/nonexistent/bwrap"
    with pytest.raises(CommandError):
        call_command("check_sandboxes", "--backend", "bubblewrap", "--record", worker_name, stdout=StringIO())
    status, check = sandboxes()
    assert (status, check["ok"], check["backends"][0]["backend"]) == (503, False, "bubblewrap")
    assert "is not installed: run `make sandbox-deps`" in check["backends"][0]["detail"]
    settings.FLYWHEEL_SANDBOX_BWRAP = "/usr/bin/bwrap"
    call_command("check_sandboxes", "--backend", "bubblewrap", "--record", worker_name, stdout=StringIO())
    status, check = sandboxes()
    assert (status, check["ok"], check["backends"][0]["detail"]) == (200, True, "graded right")


def test_healthz_answers_503_when_redis_is_unreachable(client, db, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    response = client.get("/healthz", **ops())
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "degraded" and body["redis"]["ok"] is False
    assert body["queues"]["rollout"]["workers"] == 0


def test_metrics_are_served_in_prometheus_format(client, db):
    owner = make_user("m")
    make_project(owner)
    client.get("/healthz")
    text = client.get("/metrics", **ops()).content.decode()
    assert "flywheel_projects 1.0" in text
    assert 'flywheel_http_requests_total{method="GET",status=' in text


def test_create_api_token_prints_a_token_that_authenticates(db):
    user = make_user("cli")
    out = StringIO()
    call_command("create_api_token", "cli", "--name", "ci", stdout=out)
    raw = out.getvalue().strip()
    assert raw.startswith("fw_") and ApiToken.objects.get(user=user).name == "ci"
    assert ApiToken.objects.filter(digest__contains=raw).count() == 0  # only the hash is stored
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get("/api/v1/me").status_code == 200


def test_create_api_token_for_an_unknown_user_fails_clearly(db):
    with pytest.raises(CommandError, match="no user named 'ghost'"):
        call_command("create_api_token", "ghost")


def test_seeding_the_demo_twice_changes_nothing(db):
    demo_ensure(username="demo", password="pw-demo-1")
    counts = (Project.objects.count(), TaskSetVersion.objects.count(), Tier.objects.count())
    demo_ensure(username="demo", password="pw-demo-1")
    assert (
        (Project.objects.count(), TaskSetVersion.objects.count(), Tier.objects.count()) == counts == (1, 2, 3)
    )
    project = Project.objects.get(name=DEMO_PROJECT)
    assert sorted(project.tiers.values_list("name", flat=True)) == ["capability", "rollout", "speed"]
    assert api_client_for(project.memberships.get().user).get("/api/v1/projects").status_code == 200


def test_import_tasks_command_imports_a_file_and_reports_errors_by_line(db, tmp_path):
    owner = make_user("importer")
    make_project(owner, name="cli-project")
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"prompt": f"p{i}", "reference": "r"}) + "\n" for i in range(3)))
    out = StringIO()
    call_command(
        "import_tasks", "cli-project", "set", str(good), "--user", "importer", stdout=out, stderr=StringIO()
    )
    assert out.getvalue().strip() == "created version 1 with 3 items"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "p"}\n')
    err = StringIO()
    with pytest.raises(CommandError, match="1 errors; nothing was imported"):
        call_command(
            "import_tasks",
            "cli-project",
            "set",
            str(bad),
            "--user",
            "importer",
            stdout=StringIO(),
            stderr=err,
        )
    assert "line 1, field 'reference': is required for an answer item" in err.getvalue()
    assert TaskSetVersion.objects.count() == 1

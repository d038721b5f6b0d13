# The fixtures imported from sandbox_fixtures are test parameters here, not redefinitions:
# ruff: noqa: F811
"""The stub check at import (projects/stub_checks.py queues it, rewards/stub_checks.py runs it): each
code item's tests run against a stub of the
solution after the version commits; the tests a stub passes are stored with the item, shown on the
version page, in REST and by `verify`, and the graders take them from there. Real sandboxes
(bubblewrap), the real database; the Celery task's body is called as a worker would."""

import io
import json
from unittest import mock

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from sandbox_fixtures import bubblewrap_pool  # noqa: F401  (a fixture)

from projects import services as project_services
from projects import stub_checks
from projects.models import TaskItem, TaskSetVersion
from rewards import stub_checks as stub_check_runs
from rewards.engine import Sample, score
from rewards.graders import sandboxed
from tests.conftest import api_client_for

PARTIAL = {"type": "unit_tests", "name": "tests", "score": "pass_rate"}
DOUBLE = {
    "id": "double",
    "kind": "code",
    "prompt": "Write double(x).",
    # `assert True` and `assert not double(0)`: a stub passes those two, not the other two
    "tests": "from solution import double\n\nassert True\nassert not double(0)\n"
    "assert double(2) == 4\nassert double(3) == 6\n",
    "entry_point": "double",
    "reference_solution": "def double(x):\n    return 2 * x\n",
}
NOOP = {
    "id": "noop",
    "kind": "code",
    "prompt": "Write noop(), which does nothing.",
    "tests": "from solution import noop\n\nassert noop() is None\nassert True\n",
    "entry_point": "noop",
    "reference_solution": "def noop():\n    return None\n",
}
ANSWER = {"id": "sum", "prompt": "What is 2 + 2?", "reference": "4"}
# A blank line after the first item: the others' lines (3, 4) are not their positions + 1.
FILE = "".join(json.dumps(item) + "\n" for item in (ANSWER, DOUBLE, NOOP)).replace("\n{", "\n\n{", 1)
NOOP_WARNING = "line 4 (noop): a stub passes every test, so this item can only ever pay 0"


@pytest.fixture
def version(team, django_capture_on_commit_callbacks) -> TaskSetVersion:
    task_set = project_services.task_set_create(project=team["project"], name="code", by=team["owner"])
    with mock.patch("projects.stub_checks.enqueue_check") as delay:
        with django_capture_on_commit_callbacks(execute=True):
            report = project_services.task_set_import(
                task_set=task_set, stream=io.BytesIO(FILE.encode()), file_format="jsonl", by=team["owner"]
            )
    assert report.ok and report.created
    delay.assert_called_once_with(report.version.pk)  # after the version committed
    return report.version


def test_a_new_version_queues_the_stub_check_of_its_code_items_and_keeps_their_lines(version):
    assert (version.stub_check_status, version.stub_check_done, version.stub_check_total) == ("queued", 0, 2)
    assert list(version.items.values_list("external_id", "line", "stub_check")) == [
        ("sum", 1, None),
        ("double", 3, None),
        ("noop", 4, None),
    ]


def test_the_check_stores_what_a_stub_passes_and_warns_by_line_about_items_a_stub_passes_in_full(
    version, bubblewrap_pool
):
    done: list[int] = []
    warnings = stub_check_runs.version_stub_check_run(
        version_id=version.pk, pool=bubblewrap_pool, progress=done.append
    )
    assert [str(warning) for warning in warnings] == [NOOP_WARNING]
    assert sum(done) == 2
    double, noop = TaskItem.objects.get(external_id="double"), TaskItem.objects.get(external_id="noop")
    assert double.stub_check == {
        "tests": ["line 3", "line 4", "line 5", "line 6"],
        "passed": ["line 3", "line 4"],
    }
    assert noop.stub_check == {"tests": ["line 3", "line 4"], "passed": ["line 3", "line 4"]}
    assert TaskItem.objects.get(external_id="sum").stub_check is None  # answers are not stubbed
    version.refresh_from_db()
    assert (version.stub_check_status, version.stub_check_done, version.stub_check_no_credit) == (
        "done",
        2,
        2,
    )
    assert version.stub_check_warnings == [{"item": "noop", "line": 4, "message": NOOP_WARNING}]

    # A redelivery finds every item checked and runs no sandbox.
    with mock.patch.object(stub_check_runs, "stub_check") as again:
        stub_check_runs.version_stub_check_run(version_id=version.pk, pool=bubblewrap_pool)
    again.assert_not_called()


def test_graders_take_the_stored_result_instead_of_running_stubs(version, bubblewrap_pool):
    stub_check_runs.version_stub_check_run(version_id=version.pk, pool=bubblewrap_pool)
    item = TaskItem.objects.get(external_id="double").grading_dict()
    nothing = Sample(files={"solution.py": "def double(x):\n    pass\n"})
    with mock.patch.object(sandboxed, "stub_run") as stub_run:
        result = score(PARTIAL, item, nothing, pool=bubblewrap_pool)
    stub_run.assert_not_called()
    assert result.total == 0.0
    assert [test["name"] for test in result.tests if test.get("credit") is False] == ["line 3", "line 4"]
    # What the grader credits is the stored result: stored as if no stub passed anything, the
    # do-nothing solution earns the two tests it passes.
    doctored = item | {"stub_check": {"tests": item["stub_check"]["tests"], "passed": []}}
    assert score(PARTIAL, doctored, nothing, pool=bubblewrap_pool).total == 0.5
    # A rule that runs the tests otherwise (another solution file) checks stubs itself.
    other = PARTIAL | {"solution_file": "main.py"}
    with mock.patch.object(sandboxed, "stub_run", wraps=sandboxed.stub_run) as stub_run:
        score(other, doctored, Sample(files={"main.py": "def double(x):\n    pass\n"}), pool=bubblewrap_pool)
    assert stub_run.called


def test_rest_and_the_version_page_show_the_check_and_the_tests_without_credit(
    team, version, bubblewrap_pool
):
    client = api_client_for(team["viewer"])
    url = f"/api/v1/task-sets/{version.task_set_id}/versions/{version.number}"
    assert client.get(url).json()["stub_check"] == {
        "status": "queued",
        "done": 0,
        "total": 2,
        "items_with_no_credit_tests": 0,
        "warnings": [],
        "note": "no credit: a stub passes this test",
    }
    stub_check_runs.version_stub_check_run(version_id=version.pk, pool=bubblewrap_pool)
    check = client.get(url).json()["stub_check"]
    assert (check["status"], check["done"], check["items_with_no_credit_tests"]) == ("done", 2, 2)
    assert check["warnings"] == [{"item": "noop", "line": 4, "message": NOOP_WARNING}]
    double = TaskItem.objects.get(external_id="double")
    item = client.get(f"/api/v1/tasks/{double.pk}").json()
    assert item["line"] == 3
    assert item["stub_check"] == {
        "tests": ["line 3", "line 4", "line 5", "line 6"],
        "no_credit": ["line 3", "line 4"],
        "stub_passes_every_test": False,
        "note": "no credit: a stub passes this test",
    }

    client.force_login(team["viewer"])
    page = client.get(f"/task-sets/{version.task_set_id}/versions/{version.number}/").content.decode()
    assert NOOP_WARNING in page
    assert "<code>line 4</code>: no credit: a stub passes this test" in page


def test_verify_checks_the_items_not_checked_yet_and_names_the_tests_without_credit(
    team, version, bubblewrap_pool
):
    client = api_client_for(team["launcher"])
    with mock.patch("sandboxes.services.sandbox_pool", return_value=bubblewrap_pool):
        response = client.post(f"/api/v1/task-sets/{version.task_set_id}/versions/{version.number}/verify")
    assert response.status_code == 200, response.content
    report = response.json()
    assert (report["checked"], report["passed"]) == (2, 1)
    assert [(check["item"], check["reason"]) for check in report["broken"]] == [
        ("noop", "a stub of the solution passes every test too: the item can only ever pay 0")
    ]
    assert report["stub_passes_every_test"] == ["noop"]
    assert report["broken"][0]["no_credit"] == ["line 3", "line 4"]
    version.refresh_from_db()
    assert version.stub_check_status == "done"


def test_import_tasks_runs_the_check_with_a_progress_bar_and_warns_by_line(team, tmp_path, bubblewrap_pool):
    path = tmp_path / "code.jsonl"
    path.write_text(FILE)
    out, err = io.StringIO(), io.StringIO()
    with (
        mock.patch("sandboxes.services.sandbox_pool", return_value=bubblewrap_pool),
        mock.patch("projects.stub_checks.enqueue_check") as delay,
    ):
        call_command("import_tasks", "alpha", "fresh", str(path), user="owner", stdout=out, stderr=err)
    delay.assert_not_called()  # run here, not queued
    assert "created version 1 with 3 items" in out.getvalue()
    assert f"warning: {NOOP_WARNING}" in err.getvalue() and "stub check" in err.getvalue()
    version = TaskSetVersion.objects.get(task_set__name="fresh")
    assert (version.stub_check_status, version.stub_check_done) == ("done", 2)


def test_a_file_upload_for_the_check_counts_only_code_items(team, django_capture_on_commit_callbacks):
    task_set = project_services.task_set_create(project=team["project"], name="answers", by=team["owner"])
    upload = SimpleUploadedFile("a.jsonl", (json.dumps(ANSWER) + "\n").encode())
    with mock.patch("projects.stub_checks.enqueue_check") as delay:
        with django_capture_on_commit_callbacks(execute=True):
            response = api_client_for(team["owner"]).post(
                f"/api/v1/task-sets/{task_set.pk}/import", {"file": upload}, format="multipart"
            )
    assert response.status_code == 201
    assert response.json()["stub_check"]["status"] == "none"
    delay.assert_not_called()


def test_the_celery_task_runs_the_check_on_the_eval_queue(version, bubblewrap_pool, settings):
    from celery import current_app

    from runs import tasks

    assert tasks.version_stub_check.name == stub_checks.STUB_CHECK_TASK
    assert current_app.amqp.router.route({}, stub_checks.STUB_CHECK_TASK)["queue"].name == "eval"
    with mock.patch("sandboxes.services.sandbox_pool", return_value=bubblewrap_pool):
        tasks.version_stub_check(version.pk)
    version.refresh_from_db()
    assert (version.stub_check_status, version.stub_check_done) == ("done", 2)


def test_the_dry_run_page_shows_the_tests_without_credit_from_the_stored_check(
    client, team, version, bubblewrap_pool
):
    from rewards import services as reward_services

    stub_check_runs.version_stub_check_run(version_id=version.pk, pool=bubblewrap_pool)
    rule = reward_services.reward_rule_create(
        project=team["project"], name="tests", spec=PARTIAL, by=team["owner"]
    )
    client.force_login(team["owner"])
    sample = {"output_text": "```python\ndef double(x):\n    pass\n```"}
    with (
        mock.patch("sandboxes.services.sandbox_pool", return_value=bubblewrap_pool),
        mock.patch.object(sandboxed, "stub_run") as stub_run,
    ):
        response = client.post(
            f"/reward-rules/{rule.pk}/dry-run/",
            {
                "version": "1",
                "source": "task_set",
                "task_set_version": str(version.pk),
                "item_ids": "double",
                "samples": json.dumps(sample),
            },
        )
    stub_run.assert_not_called()
    assert [(row["item_id"], row["total"]) for row in response.context["rows"]] == [("double", 0.0)]
    body = response.content.decode()
    assert body.count("no credit: a stub passes this test") == 2


class BrokenPool:
    """A pool whose sandboxes fail to start: infrastructure, not the item's doing."""

    max_sandboxes = 2

    def acquire(self, spec):
        from sandboxes.interface import InfrastructureError

        raise InfrastructureError("no sandbox today")


def test_a_sandbox_that_fails_leaves_its_item_unchecked_for_the_graders_and_a_later_run(
    version, bubblewrap_pool
):
    assert stub_check_runs.version_stub_check_run(version_id=version.pk, pool=BrokenPool()) == []
    assert list(version.items.filter(kind="code").values_list("stub_check", flat=True)) == [None, None]
    stub_check_runs.version_stub_check_run(version_id=version.pk, pool=bubblewrap_pool)
    assert version.items.filter(kind="code", stub_check__isnull=True).count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_real_eval_worker_runs_the_check_after_a_rest_import_commits():
    from tests.conftest import make_project, make_user
    from tests.run_harness import Host, hosts_killed, wait_until, worker_env

    owner = make_user("importer")
    project = make_project(owner, name="stubbed")
    client = api_client_for(owner)
    host = Host(worker_env())
    with hosts_killed(host):
        host.worker("eval")
        upload = SimpleUploadedFile("code.jsonl", FILE.encode())
        response = client.post(
            "/api/v1/task-sets", {"project": project.pk, "name": "code", "file": upload}, format="multipart"
        )
        assert response.status_code == 201, response.content
        assert response.json()["version"]["stub_check"]["status"] == "queued"
        version = TaskSetVersion.objects.get(task_set__project=project)
        wait_until(
            lambda: TaskSetVersion.objects.get(pk=version.pk).stub_check_status == "done",
            "the stub check",
            timeout=120,
        )
    url = f"/api/v1/task-sets/{version.task_set_id}/versions/1"
    assert client.get(url).json()["stub_check"]["warnings"] == [
        {"item": "noop", "line": 4, "message": NOOP_WARNING}
    ]


def test_a_resplit_reuses_the_checks_of_the_same_items_without_a_sandbox(team, version, bubblewrap_pool):
    stub_check_runs.version_stub_check_run(version_id=version.pk, pool=bubblewrap_pool)
    with mock.patch("projects.stub_checks.enqueue_check"):
        again = project_services.task_set_resplit(
            version=version, by=team["owner"], split_seed=9, heldout_fraction=0.5
        )
    assert again.created and again.version.stub_check_status == "queued"
    with mock.patch.object(stub_check_runs, "stub_check") as sandboxed_check:
        warnings = stub_check_runs.version_stub_check_run(version_id=again.version.pk, pool=bubblewrap_pool)
    sandboxed_check.assert_not_called()
    assert [warning.item for warning in warnings] == ["noop"]
    assert TaskItem.objects.get(version=again.version, external_id="double").no_credit_tests == [
        "line 3",
        "line 4",
    ]
    again.version.refresh_from_db()
    assert (again.version.stub_check_status, again.version.stub_check_done) == ("done", 2)


def test_pytest_items_are_stub_checked_at_import_too_and_graders_agree(bubblewrap_pool):
    tests = (
        "from solution import triple\n\n\n"
        "def test_always():\n    assert True\n\n\n"
        "def test_nothing_for_zero():\n    assert not triple(0)\n\n\n"
        "def test_two():\n    assert triple(2) == 6\n"
    )
    item = {
        "id": "triple",
        "kind": "code",
        "prompt": "Write triple(x).",
        "setup_files": {"tests/test_triple.py": tests},
        "entry_point": "triple",
    }
    checked = sandboxed.stub_check(item, bubblewrap_pool)
    assert sorted(checked["tests"]) == [
        "tests/test_triple.py::test_always",
        "tests/test_triple.py::test_nothing_for_zero",
        "tests/test_triple.py::test_two",
    ]
    assert sorted(checked["passed"]) == [
        "tests/test_triple.py::test_always",
        "tests/test_triple.py::test_nothing_for_zero",
    ]
    # The grader, given the stored check, credits only the test a stub fails.
    stored = {**item, "stub_check": checked}
    half = Sample(files={"solution.py": "def triple(x):\n    return 0\n"})
    right = Sample(files={"solution.py": "def triple(x):\n    return 3 * x\n"})
    assert score(PARTIAL, stored, half, pool=bubblewrap_pool).total == 0.0
    assert score(PARTIAL, stored, right, pool=bubblewrap_pool).total == 1.0


def test_a_broker_that_is_down_never_fails_an_import_and_the_tick_sends_the_check_later(
    team, django_capture_on_commit_callbacks
):
    from datetime import timedelta

    from kombu.exceptions import OperationalError

    task_set = project_services.task_set_create(project=team["project"], name="offline", by=team["owner"])
    refused = mock.patch.object(stub_checks.current_app, "send_task", side_effect=OperationalError("down"))
    with refused, django_capture_on_commit_callbacks(execute=True):
        report = project_services.task_set_import(
            task_set=task_set, stream=io.BytesIO(FILE.encode()), file_format="jsonl", by=team["owner"]
        )
    assert report.ok and report.created  # committed, not failed: `make up` seeds the demo before Redis
    version = TaskSetVersion.objects.get(pk=report.version.pk)
    assert version.stub_check_status == "queued"
    with mock.patch.object(stub_checks.current_app, "send_task") as send:
        assert stub_checks.stub_checks_resend() == []  # too soon: it may still be on its way
        TaskSetVersion.all_objects.filter(pk=version.pk).update(
            created_at=version.created_at - stub_checks.STUB_CHECK_RESEND_AFTER - timedelta(seconds=1)
        )
        assert stub_checks.stub_checks_resend() == [version.pk]
    send.assert_called_once_with(stub_checks.STUB_CHECK_TASK, args=[version.pk])

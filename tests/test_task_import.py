"""The task set import service: streaming, all-or-nothing, versioned, round-tripping."""

import json

import pytest

from core.leases import process_identity
from projects import services as project_services
from projects.models import TaskItem, TaskSetVersion
from tests.conftest import make_project, make_user


def jsonl(*items) -> list[bytes]:
    return [(json.dumps(item) + "\n").encode() for item in items]


ANSWERS = [{"id": f"q{i}", "prompt": f"What is {i} + {i}?", "reference": str(2 * i)} for i in range(10)]
CODE = {
    "id": "add",
    "kind": "code",
    "prompt": "Write add(a, b).",
    "tests": "from solution import add\nassert add(1, 2) == 3\n",
    "entry_point": "add",
    "reference_solution": "def add(a, b):\n    return a + b\n",
    "setup_files": {"README.md": "hi"},
}
AGENT = {
    "id": "fix",
    "kind": "agent",
    "instructions": "Make the tests pass.",
    "files": {"app.py": "x = 1\n"},
    "check_command": "python -m pytest -q",
    "max_steps": 8,
}


@pytest.fixture
def task_set(db):
    user = make_user("importer")
    project = make_project(user)
    return project_services.task_set_create(project=project, name="arith", by=user)


def do_import(task_set, lines, **kwargs):
    return project_services.task_set_import(
        task_set=task_set,
        stream=lines,
        file_format=kwargs.pop("file_format", "jsonl"),
        by=task_set.created_by,
        **kwargs,
    )


def test_an_import_creates_version_1_with_every_kind_of_item(task_set):
    report = do_import(task_set, jsonl(*ANSWERS, CODE, AGENT))
    assert report.ok and report.created
    assert report.version.number == 1
    assert report.version.item_count == 12
    assert report.version.kind_counts == {"agent": 1, "answer": 10, "code": 1}
    item = TaskItem.objects.get(version=report.version, external_id="add")
    assert item.data["entry_point"] == "add" and item.text == "Write add(a, b)."


def test_a_bad_line_names_its_line_and_field_and_imports_nothing(task_set):
    bad = dict(ANSWERS[1])
    del bad["reference"]
    report = do_import(task_set, jsonl(ANSWERS[0], bad, {"kind": "code", "prompt": "x"}) + [b"{oops\n"])
    assert not report.ok
    assert [(e.line, e.field) for e in report.errors] == [
        (2, "reference"),
        (3, "tests"),
        (4, None),
    ]
    assert TaskSetVersion.objects.count() == 0 and TaskItem.objects.count() == 0


def test_reimporting_identical_content_creates_no_new_version(task_set):
    first = do_import(task_set, jsonl(*ANSWERS))
    again = do_import(task_set, jsonl(*ANSWERS))
    assert not again.created and again.version.pk == first.version.pk
    changed = do_import(task_set, jsonl(*ANSWERS[:-1]))
    assert changed.created and changed.version.number == 2
    assert TaskSetVersion.objects.filter(task_set=task_set).count() == 2


def test_export_round_trips_exactly(task_set):
    first = do_import(task_set, jsonl(*ANSWERS, CODE, AGENT))
    exported = "".join(project_services.task_set_export_lines(version=first.version))
    again = do_import(task_set, [line.encode() + b"\n" for line in exported.splitlines()])
    assert not again.created and again.version.pk == first.version.pk
    assert "".join(project_services.task_set_export_lines(version=again.version)) == exported


def test_the_split_is_seeded_and_stable_per_item(task_set):
    items = [{"id": f"i{n}", "prompt": "p", "reference": "r"} for n in range(200)]
    report = do_import(task_set, jsonl(*items), heldout_fraction=0.25, split_seed=7)
    splits = dict(TaskItem.objects.filter(version=report.version).values_list("external_id", "split"))
    subset = do_import(task_set, jsonl(*items[:50]))  # same seed and fraction carry over
    sub_splits = dict(TaskItem.objects.filter(version=subset.version).values_list("external_id", "split"))
    assert all(sub_splits[key] == splits[key] for key in sub_splits)
    assert 30 <= report.split_counts["heldout"] <= 70
    resplit = project_services.task_set_resplit(
        version=report.version, by=task_set.created_by, split_seed=8, heldout_fraction=0.25
    )
    assert resplit.created and resplit.version.split_seed == 8
    assert (
        resplit.version.split_counts != report.version.split_counts
        or resplit.content_hash != report.content_hash
    )


def test_csv_answers_import_with_line_numbers(task_set):
    rows = [b"prompt,reference,id\n", b"What is 2+2?,4,a\n", b"What is 3+3?,,b\n"]
    report = do_import(task_set, rows, file_format="csv")
    assert [(e.line, e.field) for e in report.errors] == [(3, "reference")]
    good = do_import(task_set, rows[:2], file_format="csv")
    assert good.created and good.version.item_count == 1


def test_duplicate_ids_are_refused_with_the_first_line(task_set):
    report = do_import(task_set, jsonl(ANSWERS[0], ANSWERS[0]))
    assert [str(e) for e in report.errors] == ["line 2, field 'id': duplicate id 'q0'; first used on line 1"]


def test_code_and_agent_items_can_say_what_their_sandbox_needs(task_set):
    sandbox = {"image": "flywheel-sandbox:py311", "limits": {"wall_seconds": 60, "memory_mb": 2048}}
    report = do_import(
        task_set, jsonl(CODE | {"sandbox": sandbox}, AGENT | {"sandbox": {"limits": {"cpus": 2}}})
    )
    assert report.ok, report.errors
    stored = dict(TaskItem.objects.values_list("external_id", "data__sandbox"))
    assert stored == {"add": sandbox, "fix": {"limits": {"cpus": 2}}}


def test_a_bad_sandbox_field_names_the_line_and_the_limit_and_imports_nothing(task_set):
    bad_limits = {"limits": {"wall_seconds": 0, "memory_mb": "lots", "gpus": 1}, "network": True}
    report = do_import(
        task_set,
        jsonl(
            CODE | {"sandbox": bad_limits},
            AGENT | {"sandbox": {"image": "--privileged"}},
            ANSWERS[0] | {"sandbox": {}},
        ),
    )
    assert not report.ok
    assert [(e.line, e.field, e.message) for e in report.errors] == [
        (1, "sandbox.network", "unknown field (known: image, limits)"),
        (1, "sandbox.limits.wall_seconds", "must be between 0.1 and 3600"),
        (1, "sandbox.limits.memory_mb", "must be an integer"),
        (
            1,
            "sandbox.limits.gpus",
            "is not a sandbox limit (known: cpu_seconds, memory_mb, max_processes, "
            "max_open_files, max_file_size_mb, max_output_bytes, wall_seconds, workspace_mb, cpus)",
        ),
        (2, "sandbox.image", "must be a Docker image name such as flywheel-sandbox:latest"),
        (3, "sandbox", "unknown field for an answer item"),
    ]
    assert TaskItem.objects.count() == 0


def test_agent_items_may_restrict_their_tools_and_bad_tools_name_the_line(task_set):
    tools = {"tools": ["read_file", "write_file", "run_tests", "submit"], "test_file": "test_app.py"}
    good = AGENT | {"files": {"app.py": "x = 1\n", "test_app.py": "def test(): ..."}} | tools
    report = do_import(
        task_set,
        jsonl(
            good,
            AGENT | {"id": "b", "tools": ["shell", "browse"]},
            AGENT | {"id": "c", "tools": ["shell"], "test_file": "nope.py"},
        ),
    )
    assert not report.ok
    assert [(e.line, e.field, e.message) for e in report.errors] == [
        (2, "tools", "unknown tool 'browse' (built-ins: shell, read_file, write_file, run_tests, submit)"),
        (3, "tools", "must include submit (an episode ends with it)"),
        (3, "test_file", "must name one of the item's files"),
    ]
    assert TaskItem.objects.count() == 0
    report = do_import(task_set, jsonl(good))
    assert report.ok and TaskItem.objects.get().data["tools"] == tools["tools"]


# --- a large import beside other users ------------------------------------------------------


def many_answers(count: int, *, broken_last: bool = False) -> list[bytes]:
    lines = jsonl(*({"id": f"q{n}", "prompt": f"{n} + 1?", "reference": str(n + 1)} for n in range(count)))
    if broken_last:
        lines[-1] = b'{"id": "broken", "prompt": "no reference"}\n'
    return lines


@pytest.mark.django_db(transaction=True)
def test_another_users_read_is_answered_promptly_while_a_large_import_writes():
    """The import writes in short transactions under a draft: the reader's request (whose bearer
    token is due a last-used write) never waits for the whole import, on SQLite either."""
    import threading
    import time

    from django.db import connection

    from projects.models import ApiToken
    from tests.conftest import api_client_for

    importer = make_user("importer")
    task_set = project_services.task_set_create(project=make_project(importer), name="big", by=importer)
    reader = make_user("reader")
    make_project(reader, name="theirs")
    client = api_client_for(reader)
    assert client.get("/api/v1/runs").status_code == 200  # loaded and warm before the import
    finished = threading.Event()

    def run_import() -> None:
        try:
            project_services.task_set_import(
                task_set=task_set, stream=many_answers(100_000), file_format="jsonl", by=importer
            )
        finally:
            finished.set()
            connection.close()

    threading.Thread(target=run_import).start()
    drafts = TaskSetVersion.all_objects.filter(task_set=task_set, published=False)
    deadline = time.monotonic() + 120
    while not TaskItem.objects.filter(version__in=drafts).exists():
        assert time.monotonic() < deadline and not finished.is_set(), "the import never started writing"
        time.sleep(0.05)
    waits = []
    while not finished.is_set() and len(waits) < 10:
        ApiToken.objects.filter(user=reader).update(last_used_at=None)  # due a write on this request
        started = time.monotonic()
        response = client.get("/api/v1/runs")
        waits.append(time.monotonic() - started)
        assert response.status_code == 200
    assert waits and not finished.is_set(), "the import ended before the reads: make it larger"
    assert max(waits) < 1.5, waits  # one batch's transaction at most, never the whole import
    assert not TaskSetVersion.objects.filter(task_set=task_set).exists()  # unpublished until it ends
    finished.wait(300)
    version = TaskSetVersion.objects.get(task_set=task_set)
    assert (version.number, version.item_count, version.items.count()) == (1, 100_000, 100_000)


@pytest.mark.django_db(transaction=True)
def test_a_large_import_that_fails_on_its_last_line_leaves_nothing():
    importer = make_user("importer")
    task_set = project_services.task_set_create(project=make_project(importer), name="big", by=importer)
    report = project_services.task_set_import(
        task_set=task_set, stream=many_answers(20_000, broken_last=True), file_format="jsonl", by=importer
    )
    assert not report.ok and report.errors[0].line == 20_000
    assert not TaskSetVersion.all_objects.filter(task_set=task_set).exists()
    assert not TaskItem.objects.exists()


def test_the_draft_of_an_import_that_died_is_swept(task_set):
    from tests.test_api import dead_process_identity

    draft = TaskSetVersion.all_objects.create(
        task_set=task_set,
        number=None,
        published=False,
        draft_owner=dead_process_identity(),
        content_hash="",
        item_count=0,
    )
    TaskItem.objects.create(
        version=draft, position=0, external_id="q0", kind="answer", split="train", text="x", data={}
    )
    alive = TaskSetVersion.all_objects.create(
        task_set=task_set,
        number=None,
        published=False,
        draft_owner=process_identity(),
        content_hash="",
        item_count=0,
    )
    assert project_services.task_set_drafts_sweep() == 1
    assert list(TaskSetVersion.all_objects.values_list("pk", flat=True)) == [alive.pk]
    assert not TaskItem.objects.filter(version=draft).exists()
    assert not TaskSetVersion.objects.exists()  # a draft is never a version anyone sees

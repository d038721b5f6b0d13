"""Verify references: on a set that includes broken references, every broken one is named with its
reason and every good one passes, through the service, REST, the page's button, the import option
and `manage.py verify_references`."""

import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from projects import selectors as project_selectors
from projects import services as project_services
from rewards.references import references_verify
from tests.conftest import api_client_for, make_project, make_user
from tests.test_code_formats import HONEST, LINES

GOOD = [
    {"id": f"good-{name}", "kind": "code", "prompt": "add", **LINES[name], "reference_solution": HONEST}
    for name in LINES
]
BROKEN = [
    # a reference that gets it wrong
    {
        "id": "wrong-answer",
        "kind": "code",
        "prompt": "add",
        **LINES["candidate"],
        "reference_solution": "def add(a, b):\n    return a - b\n",
    },
    # a test no correct solution passes (the dataset's own bug)
    {
        "id": "bad-test",
        "kind": "code",
        "prompt": "add",
        "tests": "from solution import add\n\nassert add(1, 2) == 3\nassert add(2, 2) == 5\n",
        "reference_solution": HONEST,
    },
    # a reference that no longer runs
    {
        "id": "does-not-run",
        "kind": "code",
        "prompt": "add",
        **LINES["namespace"],
        "reference_solution": "import numpy\n" + HONEST,
    },
    # an io reference printing the wrong format
    {
        "id": "io-format",
        "kind": "code",
        "prompt": "add",
        **LINES["io"],
        "reference_solution": "print('answer: 3')\n",
    },
]
NO_REFERENCE = {"id": "no-reference", "kind": "code", "prompt": "add", **LINES["flywheel"]}
ITEMS = (
    GOOD[:2]
    + BROKEN[:2]
    + [NO_REFERENCE]
    + GOOD[2:]
    + BROKEN[2:]
    + [{"id": "q", "prompt": "2+2?", "reference": "4"}]
)
BROKEN_REASONS = {
    "wrong-answer": "check line 5 failed: line 5: assert candidate(1, 2) == 3 (expected 3, actual -1)",
    "bad-test": "line 4 failed: line 4: assert add(2, 2) == 5 (expected 5, actual 4)",
    "does-not-run": "importing the solution failed: ModuleNotFoundError: No module named 'numpy'",
    "io-format": (
        "case 1 failed: the output differs from the expected output (exact comparison) "
        "(expected 3\\n, actual answer: 3\\n)"
    ),
}


def lines() -> list[bytes]:
    return [(json.dumps(item) + "\n").encode() for item in ITEMS]


@pytest.fixture
def version(db):
    owner = make_user("referee")
    project = make_project(owner, name="references")
    task_set = project_services.task_set_create(project=project, name="refs", by=owner)
    return project_services.task_set_import(
        task_set=task_set, stream=lines(), file_format="jsonl", by=owner
    ).version


def assert_the_broken_are_named(report: dict) -> None:
    assert (report["checked"], report["passed"], report["skipped"], report["errored"]) == (9, 5, 2, 0)
    assert [check["item"] for check in report["broken"]] == [
        "wrong-answer",
        "bad-test",
        "does-not-run",
        "io-format",
    ]
    for check in report["broken"]:
        assert BROKEN_REASONS[check["item"]] in check["reason"]
        assert check["passed"] is False


def test_references_verify_names_every_broken_reference_and_passes_the_good_ones(version):

    seen = []
    report = references_verify(
        project_selectors.grading_items_of(version=version), progress=lambda: seen.append(1)
    )
    assert len(seen) == len(ITEMS)
    assert_the_broken_are_named(report.to_dict())


def test_the_verify_endpoint_reports_the_broken_and_needs_a_launcher(version):
    owner = version.task_set.created_by
    path = f"/api/v1/task-sets/{version.task_set.pk}/versions/{version.number}/verify"
    response = api_client_for(owner).post(path)
    assert response.status_code == 200
    assert_the_broken_are_named(response.json())
    viewer = make_user("viewer")
    version.task_set.project.memberships.create(user=viewer, role="viewer")
    assert api_client_for(viewer).post(path).status_code == 403


def test_the_pages_button_names_the_broken_references(version):
    web = Client()
    web.force_login(version.task_set.created_by)
    page = web.get(f"/task-sets/{version.task_set.pk}/versions/{version.number}/").content.decode()
    assert 'id="verify-references"' in page
    response = web.post(f"/task-sets/{version.task_set.pk}/versions/{version.number}/verify/", follow=True)
    text = response.content.decode()
    assert "4 of 9 references are broken" in text
    for name in BROKEN_REASONS:
        assert f"{name}: " in text


def test_importing_with_verify_references_reports_them(db):
    owner = make_user("importer")
    task_set = project_services.task_set_create(
        project=make_project(owner, name="imports"), name="refs", by=owner
    )
    upload = io.BytesIO(b"".join(lines()))
    upload.name = "refs.jsonl"
    response = api_client_for(owner).post(
        f"/api/v1/task-sets/{task_set.pk}/import",
        {"file": upload, "verify_references": "true"},
        format="multipart",
    )
    assert response.status_code == 201, response.json()
    assert_the_broken_are_named(response.json()["references"])


def test_the_command_shows_progress_names_the_broken_and_fails(version):
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError, match="4 broken references"):
        call_command("verify_references", "references", "refs", stdout=out, stderr=err)
    text = out.getvalue()
    assert text.startswith("refs v1: 9 references checked, 5 pass, 4 broken, 0 errored, 2 items without one")
    assert [line.split(":")[1].strip() for line in text.splitlines()[1:]] == list(BROKEN_REASONS)
    assert "references: 100%" in err.getvalue()


def test_the_command_names_a_version_the_set_does_not_have(version):
    with pytest.raises(CommandError, match=r"^refs has no version 9$"):
        call_command("verify_references", "references", "refs", "--set-version", "9")

"""Task sets over REST: create, import (JSONL, CSV, dry run, errors), versions, export, split, items."""

import json

import pytest
from asgiref.sync import async_to_sync
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import AsyncClient

from projects import services as project_services
from projects.models import TaskItem, TaskSet, TaskSetVersion
from runs import services
from tests.conftest import api_client_for

ANSWERS = [{"id": f"q{i}", "prompt": f"What is {i} + {i}?", "reference": str(2 * i)} for i in range(8)]
CODE = {
    "id": "add",
    "kind": "code",
    "prompt": "Write add(a, b).",
    "tests": "from solution import add\nassert add(1, 2) == 3\n",
    "entry_point": "add",
}


@pytest.fixture
def task_set(team):
    return project_services.task_set_create(project=team["project"], name="arith", by=team["owner"])


@pytest.fixture
def launcher(team):
    return api_client_for(team["launcher"])


def jsonl_file(*items, name: str = "tasks.jsonl") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, "".join(json.dumps(item) + "\n" for item in items).encode())


def import_url(task_set) -> str:
    return f"/api/v1/task-sets/{task_set.pk}/import"


def upload(client, task_set, file, **fields):
    return client.post(import_url(task_set), {"file": file, **fields}, format="multipart")


# --- task sets -----------------------------------------------------------------------------


def test_a_launcher_creates_a_task_set(team, launcher):
    response = launcher.post(
        "/api/v1/task-sets",
        {"project": team["project"].pk, "name": "arith", "description": "sums"},
        format="json",
    )
    assert response.status_code == 201
    task_set = TaskSet.objects.get()
    assert response.json() == {
        "id": task_set.pk,
        "project": team["project"].pk,
        "name": "arith",
        "description": "sums",
        "created_by": team["launcher"].pk,
        "created_at": response.json()["created_at"],
        "version": None,  # created without a file (tests/test_task_set_create.py: with one)
    }


def test_a_viewer_may_not_create_a_task_set_and_an_outsider_sees_no_project(team):
    body = {"project": team["project"].pk, "name": "arith"}
    assert api_client_for(team["viewer"]).post("/api/v1/task-sets", body, format="json").status_code == 403
    assert api_client_for(team["outsider"]).post("/api/v1/task-sets", body, format="json").status_code == 404
    assert TaskSet.objects.count() == 0


def test_task_sets_are_listed_for_the_callers_projects_and_filtered(team, task_set):
    project_services.task_set_create(project=team["other_project"], name="theirs", by=team["outsider"])
    client = api_client_for(team["viewer"])
    assert [t["name"] for t in client.get("/api/v1/task-sets").json()["results"]] == ["arith"]
    other = client.get(f"/api/v1/task-sets?project={team['other_project'].pk}").json()
    assert other["results"] == []


def test_a_task_set_is_renamed_and_a_taken_name_is_refused(team, task_set, launcher):
    project_services.task_set_create(project=team["project"], name="taken", by=team["owner"])
    url = f"/api/v1/task-sets/{task_set.pk}"
    refused = launcher.patch(url, {"name": "taken"}, format="json")
    assert refused.status_code == 400
    assert refused.json()["error"]["details"] == [
        {"param": "name", "message": "this project already has a task set named 'taken'"}
    ]
    renamed = launcher.patch(url, {"name": "sums"}, format="json")
    assert renamed.status_code == 200 and renamed.json()["name"] == "sums"
    assert api_client_for(team["viewer"]).patch(url, {"name": "x"}, format="json").status_code == 403
    assert TaskSet.objects.get(pk=task_set.pk).name == "sums"


# --- import --------------------------------------------------------------------------------


def test_an_import_creates_version_1_and_answers_201(team, task_set, launcher):
    response = upload(launcher, task_set, jsonl_file(*ANSWERS, CODE), heldout_fraction="0.25", split_seed="7")
    assert response.status_code == 201
    version = TaskSetVersion.objects.get()
    body = response.json()
    assert body == {
        "id": version.pk,
        "task_set": task_set.pk,
        "number": 1,
        "content_hash": version.content_hash,
        "item_count": 9,
        "kind_counts": {"answer": 8, "code": 1},
        "split_counts": version.split_counts,
        "split_seed": 7,
        "heldout_fraction": 0.25,
        "source_name": "tasks.jsonl",
        "created_by": team["launcher"].pk,
        "created_at": body["created_at"],
        "stub_check": {  # the code item's stub check, queued for after the commit
            "status": "queued",
            "done": 0,
            "total": 1,
            "items_with_no_credit_tests": 0,
            "warnings": [],
            "note": "no credit: a stub passes this test",
        },
        "created": True,
        "references": None,
    }
    assert sum(version.split_counts.values()) == 9


def test_a_csv_import_is_recognised_by_its_file_name(task_set, launcher):
    file = SimpleUploadedFile("tasks.csv", b"id,prompt,reference\r\na,What is 2+2?,4\r\nb,What is 3+3?,6\r\n")
    response = upload(launcher, task_set, file)
    assert response.status_code == 201
    assert response.json()["kind_counts"] == {"answer": 2}
    assert list(TaskItem.objects.values_list("external_id", "text")) == [
        ("a", "What is 2+2?"),
        ("b", "What is 3+3?"),
    ]


def test_a_file_with_errors_answers_400_with_every_line_and_imports_nothing(task_set, launcher):
    bad = {"id": "q1", "prompt": "p"}
    file = jsonl_file(ANSWERS[0], bad, {"kind": "code", "prompt": "x"})
    file = SimpleUploadedFile("tasks.jsonl", file.read() + b"{oops\n")
    response = upload(launcher, task_set, file)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and error["param"] == "file"
    assert error["error_count"] == 3
    assert error["details"] == [
        {"line": 2, "param": "reference", "message": "is required for an answer item"},
        {
            "line": 3,
            "param": "tests",
            "message": "holds no test in any format: no test_* function or assert (Flywheel's own, or "
            "namespace style), no check(candidate) (candidate style), no io_tests, and no test_*.py in "
            "setup_files (pytest)",
        },
        {
            "line": 4,
            "param": None,
            "message": "not valid JSON: Expecting property name enclosed in double quotes at column 2",
        },
    ]
    assert (
        error["message"]
        == "nothing imported: line 2, field 'reference': is required for an answer item (and 2 more)"
    )
    assert TaskSetVersion.objects.count() == 0 and TaskItem.objects.count() == 0


def test_details_list_the_first_errors_and_error_count_counts_them_all(settings, task_set, launcher):
    settings.FLYWHEEL_IMPORT_MAX_ERRORS = 2
    response = upload(launcher, task_set, jsonl_file(*[{"id": f"x{n}"} for n in range(5)]))
    error = response.json()["error"]
    assert response.status_code == 400
    assert error["error_count"] == 10 and len(error["details"]) == 2


def test_bad_import_fields_are_each_named(task_set, launcher):
    response = upload(
        launcher, task_set, jsonl_file(*ANSWERS), heldout_fraction="2", format="xml", dry_run="maybe"
    )
    assert response.status_code == 400
    assert [d["param"] for d in response.json()["error"]["details"]] == [
        "format",
        "heldout_fraction",
        "dry_run",
    ]
    missing = launcher.post(import_url(task_set), {}, format="multipart")
    assert [d["param"] for d in missing.json()["error"]["details"]] == ["file"]
    assert TaskSetVersion.objects.count() == 0


def test_a_dry_run_reports_counts_errors_and_a_preview_and_stores_nothing(task_set, launcher):
    response = upload(
        launcher, task_set, jsonl_file(*ANSWERS, {"id": "bad"}), dry_run="true", heldout_fraction="0"
    )
    assert response.status_code == 200
    body = response.json()
    assert body["item_count"] == 8
    assert body["kind_counts"] == {"answer": 8} and body["split_counts"] == {"train": 8}
    assert body["error_count"] == 2
    assert [(e["line"], e["param"]) for e in body["errors"]] == [(9, "prompt"), (9, "reference")]
    assert body["preview"][0] == {
        "line": 1,
        "id": "q0",
        "kind": "answer",
        "split": "train",
        "text": "What is 0 + 0?",
        "data": {"prompt": "What is 0 + 0?", "reference": "0"},
    }
    assert len(body["preview"]) == services.PREVIEW_ITEMS
    assert TaskSetVersion.objects.count() == 0 and TaskItem.objects.count() == 0


def test_a_viewer_may_not_import(team, task_set):
    response = upload(api_client_for(team["viewer"]), task_set, jsonl_file(*ANSWERS))
    assert response.status_code == 403
    assert TaskSetVersion.objects.count() == 0


def test_an_import_with_an_idempotency_key_creates_one_version(task_set, launcher):
    first = launcher.post(import_url(task_set), {"file": jsonl_file(*ANSWERS)}, HTTP_IDEMPOTENCY_KEY="imp-1")
    again = launcher.post(import_url(task_set), {"file": jsonl_file(*ANSWERS)}, HTTP_IDEMPOTENCY_KEY="imp-1")
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert TaskSetVersion.objects.count() == 1


def test_the_same_key_with_another_file_of_the_same_size_answers_422(task_set, launcher):
    first = jsonl_file({"id": "a", "prompt": "1+1?", "reference": "2"})
    other = jsonl_file({"id": "a", "prompt": "2+2?", "reference": "4"})
    assert first.size == other.size
    launcher.post(import_url(task_set), {"file": first}, HTTP_IDEMPOTENCY_KEY="imp-2")
    response = launcher.post(import_url(task_set), {"file": other}, HTTP_IDEMPOTENCY_KEY="imp-2")
    assert response.status_code == 422
    assert list(TaskItem.objects.values_list("text", flat=True)) == ["1+1?"]


# --- versions, export, split ---------------------------------------------------------------


def test_export_then_reimport_through_rest_creates_no_new_version(task_set, launcher):
    created = upload(launcher, task_set, jsonl_file(*ANSWERS, CODE))
    assert created.status_code == 201
    export = launcher.get(f"/api/v1/task-sets/{task_set.pk}/versions/1/export")
    assert export.status_code == 200
    assert export["Content-Type"] == "application/x-ndjson"
    assert export["Content-Disposition"] == 'attachment; filename="arith-v1.jsonl"'
    exported = b"".join(export.streaming_content)
    assert [json.loads(line)["id"] for line in exported.splitlines()] == [*(a["id"] for a in ANSWERS), "add"]
    again = upload(launcher, task_set, SimpleUploadedFile("arith-v1.jsonl", exported))
    assert again.status_code == 200
    assert again.json() == {**created.json(), "created": False}
    assert TaskSetVersion.objects.count() == 1


def test_an_export_accepts_the_ndjson_media_type(task_set, launcher):
    upload(launcher, task_set, jsonl_file(*ANSWERS))
    url = f"/api/v1/task-sets/{task_set.pk}/versions/1/export"
    assert launcher.get(url, HTTP_ACCEPT="application/x-ndjson").status_code == 200
    missing = launcher.get(
        f"/api/v1/task-sets/{task_set.pk}/versions/9/export", HTTP_ACCEPT="application/x-ndjson"
    )
    assert missing.status_code == 404 and json.loads(missing.content)["error"]["code"] == "not_found"


def test_under_asgi_the_export_streams_asynchronously(team, task_set, launcher):
    upload(launcher, task_set, jsonl_file(*ANSWERS))
    _, raw = project_services.api_token_create(user=team["viewer"], name="asgi")
    url = f"/api/v1/task-sets/{task_set.pk}/versions/1/export"
    response = async_to_sync(AsyncClient().get)(url, headers={"Authorization": f"Bearer {raw}"})
    assert response.status_code == 200 and response.is_async

    async def body() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    assert len(async_to_sync(body)().splitlines()) == len(ANSWERS)


def test_versions_are_listed_newest_first_and_fetched_by_number(task_set, launcher):
    upload(launcher, task_set, jsonl_file(*ANSWERS))
    upload(launcher, task_set, jsonl_file(*ANSWERS[:3]))
    listed = launcher.get(f"/api/v1/task-sets/{task_set.pk}/versions").json()["results"]
    assert [(v["number"], v["item_count"]) for v in listed] == [(2, 3), (1, 8)]
    one = launcher.get(f"/api/v1/task-sets/{task_set.pk}/versions/1")
    assert one.status_code == 200 and one.json()["id"] == listed[1]["id"]
    assert launcher.get(f"/api/v1/task-sets/{task_set.pk}/versions/3").status_code == 404


def test_another_projects_versions_answer_404(team, task_set, launcher):
    upload(launcher, task_set, jsonl_file(*ANSWERS))
    outsider = api_client_for(team["outsider"])
    for url in ("versions", "versions/1", "versions/1/export"):
        assert outsider.get(f"/api/v1/task-sets/{task_set.pk}/{url}").status_code == 404, url


def test_a_resplit_creates_a_new_version_and_the_same_split_does_not(task_set, launcher):
    upload(
        launcher, task_set, jsonl_file(*[{"id": f"i{n}", "prompt": "p", "reference": "r"} for n in range(50)])
    )
    url = f"/api/v1/task-sets/{task_set.pk}/versions/1/split"
    resplit = launcher.post(url, {"split_seed": 3, "heldout_fraction": 0.5}, format="json")
    assert resplit.status_code == 201
    assert (resplit.json()["number"], resplit.json()["split_seed"], resplit.json()["created"]) == (2, 3, True)
    again = launcher.post(
        f"/api/v1/task-sets/{task_set.pk}/versions/2/split",
        {"split_seed": 3, "heldout_fraction": 0.5},
        format="json",
    )
    assert again.status_code == 200 and again.json()["created"] is False and again.json()["number"] == 2
    assert TaskSetVersion.objects.count() == 2


def test_a_viewer_may_not_resplit_and_bad_settings_are_named(team, task_set, launcher):
    upload(launcher, task_set, jsonl_file(*ANSWERS))
    url = f"/api/v1/task-sets/{task_set.pk}/versions/1/split"
    viewer = api_client_for(team["viewer"])
    assert viewer.post(url, {"split_seed": 1, "heldout_fraction": 0.5}, format="json").status_code == 403
    bad = launcher.post(url, {"split_seed": "x", "heldout_fraction": -1}, format="json")
    assert [d["param"] for d in bad.json()["error"]["details"]] == ["split_seed", "heldout_fraction"]
    assert TaskSetVersion.objects.count() == 1


# --- items ---------------------------------------------------------------------------------


@pytest.fixture
def version(task_set, launcher):
    upload(launcher, task_set, jsonl_file(*ANSWERS, CODE), heldout_fraction="0")
    return TaskSetVersion.objects.get()


def test_a_versions_items_are_listed_in_file_order_and_walk_by_cursor(version, launcher):
    page = launcher.get(f"/api/v1/tasks?version={version.pk}&limit=4").json()
    ids = [item["external_id"] for item in page["results"]]
    while page["next"]:
        page = launcher.get(page["next"]).json()
        ids += [item["external_id"] for item in page["results"]]
    assert ids == [*(a["id"] for a in ANSWERS), "add"]


def test_items_are_filtered_by_kind_split_and_search(version, launcher):
    base = f"/api/v1/tasks?version={version.pk}"
    assert [i["external_id"] for i in launcher.get(f"{base}&kind=code").json()["results"]] == ["add"]
    assert launcher.get(f"{base}&split=heldout").json()["results"] == []
    assert [i["external_id"] for i in launcher.get(f"{base}&q=3 %2B 3").json()["results"]] == ["q3"]
    bad = launcher.get(f"{base}&kind=essay")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "kind"


def test_an_item_is_fetched_by_id_with_its_data(version, launcher):
    item = TaskItem.objects.get(external_id="add")
    body = launcher.get(f"/api/v1/tasks/{item.pk}").json()
    assert body == {
        "id": item.pk,
        "version": version.pk,
        "position": 8,
        "line": 9,
        "external_id": "add",
        "kind": "code",
        "split": "train",
        "text": "Write add(a, b).",
        "data": {k: v for k, v in CODE.items() if k not in ("id", "kind")},
        "stub_check": None,  # not checked yet
        "created_at": body["created_at"],
    }


def test_without_a_version_items_of_every_visible_project_come_newest_first(team, version, launcher):
    other = project_services.task_set_create(
        project=team["other_project"], name="theirs", by=team["outsider"]
    )
    outsider = api_client_for(team["outsider"])
    upload(outsider, other, jsonl_file({"id": "secret", "prompt": "p", "reference": "r"}))
    ids = [item["external_id"] for item in launcher.get("/api/v1/tasks?limit=3").json()["results"]]
    assert ids == ["add", "q7", "q6"]
    assert [i["external_id"] for i in launcher.get("/api/v1/tasks?q=secret").json()["results"]] == []


def test_another_projects_items_answer_404(team, version):
    outsider = api_client_for(team["outsider"])
    item = TaskItem.objects.first()
    assert outsider.get(f"/api/v1/tasks/{item.pk}").status_code == 404
    assert outsider.get(f"/api/v1/tasks?version={version.pk}").status_code == 404

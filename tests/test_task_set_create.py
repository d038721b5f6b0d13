"""A task set created with its first file, on every path (the page, REST, `import_tasks`; the client
in tests/test_client.py): the set and its version together or, when the file is refused, neither,
with the errors naming line and field."""

import io
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command

from projects.models import TaskItem, TaskSet, TaskSetVersion
from tests.conftest import api_client_for

GOOD = [{"id": f"q{i}", "prompt": f"What is {i} + {i}?", "reference": str(2 * i)} for i in range(3)]
BROKEN = [GOOD[0], {"id": "q1", "prompt": "What is 1 + 1?"}, GOOD[2]]  # line 2 lacks its reference


def jsonl(items, name: str = "items.jsonl") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, "".join(json.dumps(item) + "\n" for item in items).encode())


def nothing_created() -> bool:
    return not (TaskSet.objects.exists() or TaskSetVersion.all_objects.exists() or TaskItem.objects.exists())


# --- REST ----------------------------------------------------------------------------------


def create(client, project, file, **fields):
    body = {"project": project.pk, "name": "arith", "file": file, **fields}
    return client.post("/api/v1/task-sets", body, format="multipart")


def test_rest_a_refused_file_creates_no_set_and_names_the_line_and_field(team):
    response = create(api_client_for(team["launcher"]), team["project"], jsonl(BROKEN))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"] == "nothing imported: line 2, field 'reference': is required for an answer item"
    assert error["details"] == [
        {"line": 2, "param": "reference", "message": "is required for an answer item"}
    ]
    assert nothing_created()


def test_rest_a_good_file_creates_the_set_with_its_first_version(team):
    response = create(api_client_for(team["launcher"]), team["project"], jsonl(GOOD), heldout_fraction="0")
    assert response.status_code == 201, response.content
    body = response.json()
    task_set = TaskSet.objects.get()
    assert (body["id"], body["name"], body["project"]) == (task_set.pk, "arith", team["project"].pk)
    version = task_set.versions.get()
    assert (body["version"]["id"], body["version"]["number"], body["version"]["item_count"]) == (
        version.pk,
        1,
        3,
    )
    assert version.source_name == "items.jsonl" and version.split_counts == {"train": 3}


def test_rest_a_dry_run_a_taken_name_or_a_viewer_create_nothing(team):
    launcher = api_client_for(team["launcher"])
    dry = create(launcher, team["project"], jsonl(GOOD), dry_run="true")
    assert dry.status_code == 200 and dry.json()["item_count"] == 3
    assert nothing_created()
    viewer = create(api_client_for(team["viewer"]), team["project"], jsonl(GOOD))
    assert viewer.status_code == 403 and nothing_created()
    bad_split = create(launcher, team["project"], jsonl(GOOD), heldout_fraction="2")
    assert bad_split.status_code == 400 and bad_split.json()["error"]["param"] == "heldout_fraction"
    assert create(launcher, team["project"], jsonl(GOOD)).status_code == 201
    taken = create(launcher, team["project"], jsonl(GOOD))
    assert taken.status_code == 400 and taken.json()["error"]["param"] == "name"
    assert TaskSet.objects.count() == 1 and TaskSetVersion.objects.count() == 1


def test_rest_a_set_without_a_file_is_still_created_empty_on_request(team):
    response = api_client_for(team["launcher"]).post(
        "/api/v1/task-sets", {"project": team["project"].pk, "name": "later"}, format="json"
    )
    assert response.status_code == 201 and response.json()["version"] is None


# --- the page ------------------------------------------------------------------------------


def post_page(client, team, file, name="arith"):
    client.force_login(team["launcher"])
    return client.post(f"/projects/{team['project'].pk}/task-sets/new/", {"name": name, "file": file})


def test_the_page_lists_a_refused_files_errors_by_line_and_field_and_creates_nothing(client, team):
    response = post_page(client, team, jsonl(BROKEN))
    body = response.content.decode()
    assert response.status_code == 200
    assert (
        '<td class="num">2</td>\n              <td><code>reference</code></td>\n'
        "              <td>is required for an answer item</td>"
    ) in body
    assert "1 error in total; no task set was created." in body
    assert nothing_created()


def test_the_page_creates_the_set_with_its_first_version_and_opens_it(client, team):
    response = post_page(client, team, jsonl(GOOD))
    task_set = TaskSet.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/task-sets/{task_set.pk}/versions/1/"
    assert task_set.versions.get().item_count == 3
    page = client.get(response["Location"]).content.decode()
    assert "Task set arith created with 3 items as version 1." in page
    taken = post_page(client, team, jsonl(GOOD))
    assert "this project already has a task set named &#x27;arith&#x27;" in taken.content.decode()
    assert TaskSet.objects.count() == 1


def test_the_page_asks_for_a_file(client, team):
    client.force_login(team["launcher"])
    response = client.post(f"/projects/{team['project'].pk}/task-sets/new/", {"name": "arith"})
    assert response.status_code == 200
    assert '<p class="field-error" data-field="file">This field is required.</p>' in response.content.decode()
    assert nothing_created()


# --- the command ---------------------------------------------------------------------------


def test_the_command_leaves_nothing_for_a_refused_file_and_dry_runs_a_new_set(team, tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in BROKEN))
    err = io.StringIO()
    with pytest.raises(CommandError, match="1 errors; nothing was imported"):
        call_command("import_tasks", "alpha", "arith", str(path), user="owner", stderr=err)
    assert "line 2, field 'reference': is required for an answer item" in err.getvalue()
    assert nothing_created()
    path.write_text("".join(json.dumps(item) + "\n" for item in GOOD))
    out = io.StringIO()
    call_command("import_tasks", "alpha", "arith", str(path), user="owner", dry_run=True, stdout=out)
    assert out.getvalue().startswith("valid: 3 items") and nothing_created()

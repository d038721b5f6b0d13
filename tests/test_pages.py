"""The server-rendered pages: what each role sees, what it may change, and that nothing leaks."""

import json
from pathlib import Path

import pytest
from django.urls import reverse

from core.artifacts import artifacts_storage
from core.roles import Role
from core.tokens import token_digest
from projects import services as project_services
from projects.models import ApiToken, Membership, StagedImport, TaskSetVersion
from tests.conftest import make_user
from tiers import services as tier_services
from tiers.models import Tier

ANSWERS = [{"id": f"q{i}", "prompt": f"What is {i} + {i}?", "reference": str(2 * i)} for i in range(3)]
BROKEN = [ANSWERS[0], {"id": "q1", "prompt": "no reference"}, "{oops"]
TIER = {
    "name": "fast",
    "description": "",
    "base_model": "./models/tiny",
    "device": "cpu",
    "precision": "fp32",
    "speculation": "none",
    "draft_model": "",
    "speculative_tokens": "0",
    "temperature": "0.7",
    "top_p": "0.95",
    "top_k": "0",
    "stop": "</answer>\n\nEND",
    "max_new_tokens": "128",
    "batch_size": "16",
}


@pytest.fixture(autouse=True)
def media_root(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.MEDIA_ROOT


def jsonl_file(items, name="items.jsonl"):
    from django.core.files.uploadedfile import SimpleUploadedFile

    lines = "".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in items)
    return SimpleUploadedFile(name, lines.encode(), content_type="application/octet-stream")


def page(client, user, url, **kwargs):
    client.force_login(user)
    return client.get(url, **kwargs)


def text(response) -> str:
    return response.content.decode()


@pytest.fixture
def task_set(team):
    return project_services.task_set_create(project=team["project"], name="arith", by=team["owner"])


@pytest.fixture
def version(task_set):
    report = project_services.task_set_import(
        task_set=task_set,
        stream=[(json.dumps(item) + "\n").encode() for item in ANSWERS],
        file_format="jsonl",
        by=task_set.created_by,
        source_name="answers.jsonl",
    )
    return report.version


# --- sign in and the project list ----------------------------------------------------------


def test_an_anonymous_visitor_is_sent_to_the_sign_in_page(client, db):
    response = client.get(reverse("project-list"))
    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/?next=/"
    login = client.get("/accounts/login/")
    assert "Sign in to Flywheel" in text(login)
    assert 'name="csrfmiddlewaretoken"' in text(login)


def test_signing_in_leads_to_the_project_list_and_signing_out_is_a_post(client, team):
    response = client.post("/accounts/login/", {"username": "owner", "password": "pw-123456"})
    assert response.status_code == 302 and response["Location"] == "/"
    body = text(client.get("/"))
    assert '<form method="post" action="/accounts/logout/">' in body
    assert client.post("/accounts/logout/").status_code == 302
    assert client.get("/").status_code == 302


def test_the_project_list_shows_the_users_projects_with_role_and_counts(client, team, version):
    response = page(client, team[Role.VIEWER], reverse("project-list"))
    body = text(response)
    assert response.status_code == 200
    assert f'<a href="/projects/{team["project"].pk}/">alpha</a>' in body
    assert '<span class="badge role-viewer">viewer</span>' in body
    assert '<td class="num">1</td>\n              <td class="num">0</td>' in body
    assert "beta" not in body  # the outsider's project


def test_creating_a_project_makes_the_user_its_owner(client, db):
    user = make_user("founder")
    client.force_login(user)
    response = client.post(reverse("project-create"), {"name": "gamma", "description": "d"})
    membership = Membership.objects.get(user=user, project__name="gamma")
    assert response["Location"] == f"/projects/{membership.project_id}/"
    assert membership.role == Role.OWNER
    again = client.post(reverse("project-create"), {"name": "gamma"})
    assert "a project named &#x27;gamma&#x27; already exists" in text(again)


# --- the project page ----------------------------------------------------------------------


def test_the_project_page_lists_task_sets_tiers_and_members(client, team, version):
    project = team["project"]
    tier_services.tier_create(
        project=project, by=team["owner"], name="fast", base_model="org/tiny", batch_size=4
    )
    response = page(client, team[Role.LAUNCHER], reverse("project-detail", args=[project.pk]))
    body = text(response)
    assert response.status_code == 200
    ts = version.task_set
    assert f'<a href="/task-sets/{ts.pk}/">arith</a>' in body
    assert f'<a href="/task-sets/{ts.pk}/versions/1/">v1</a>' in body
    assert '<td class="num">3</td>' in body
    assert "<code>org/tiny</code>" in body and '<td class="num">4</td>' in body
    assert '<span>owner</span> <span class="badge role-owner">owner</span>' in body
    assert f'data-ws-path="/ws/projects/{project.pk}/"' in body
    assert 'your role <span class="badge role-launcher">launcher</span>' in body
    assert "New task set" in body and "New tier" in body and "All members" in body


def test_a_viewer_sees_no_buttons_it_cannot_use(client, team, version):
    body = text(page(client, team[Role.VIEWER], reverse("project-detail", args=[team["project"].pk])))
    assert "New task set" not in body and "New tier" not in body
    body = text(page(client, team[Role.VIEWER], reverse("task-set-detail", args=[version.task_set.pk])))
    assert "Import items" not in body
    url = reverse("version-detail", args=[version.task_set.pk, 1])
    assert "Re-split" not in text(page(client, team[Role.VIEWER], url))


def test_a_non_member_gets_404_on_every_page_of_the_project(client, team, version):
    project, ts = team["project"], version.task_set
    tier = tier_services.tier_create(project=project, by=team["owner"], name="fast", base_model="org/tiny")
    urls = [
        reverse("project-detail", args=[project.pk]),
        reverse("project-members", args=[project.pk]),
        reverse("task-set-create", args=[project.pk]),
        reverse("tier-create", args=[project.pk]),
        reverse("task-set-detail", args=[ts.pk]),
        reverse("task-set-import", args=[ts.pk]),
        reverse("version-detail", args=[ts.pk, 1]),
        reverse("version-export", args=[ts.pk, 1]),
        reverse("tier-detail", args=[tier.pk]),
        reverse("tier-edit", args=[tier.pk]),
        reverse("tier-delete", args=[tier.pk]),
    ]
    client.force_login(team["outsider"])
    assert [client.get(url).status_code for url in urls] == [404] * len(urls)
    assert client.post(reverse("tier-delete", args=[tier.pk])).status_code == 404
    assert Tier.objects.filter(pk=tier.pk).exists()


# --- members -------------------------------------------------------------------------------


def test_an_owner_adds_a_member_and_changes_their_role(client, team):
    project = team["project"]
    make_user("newcomer")
    client.force_login(team["owner"])
    url = reverse("project-members", args=[project.pk])
    response = client.post(url, {"username": "newcomer", "role": "viewer"}, follow=True)
    assert "newcomer added as viewer." in text(response)
    newcomer = Membership.objects.get(project=project, user__username="newcomer")
    response = client.post(
        reverse("member-role", args=[project.pk, newcomer.user_id]), {"role": "launcher"}, follow=True
    )
    assert "newcomer is now launcher." in text(response)
    newcomer.refresh_from_db()
    assert newcomer.role == Role.LAUNCHER
    response = client.post(url, {"username": "nobody", "role": "viewer"})
    assert '<p class="field-error" data-field="username">no user named &#x27;nobody&#x27;</p>' in text(
        response
    )


def test_the_last_owner_cannot_be_demoted_or_removed(client, team):
    project, owner = team["project"], team["owner"]
    client.force_login(owner)
    message = "a project needs at least one owner; make someone else owner first"
    response = client.post(
        reverse("member-role", args=[project.pk, owner.pk]), {"role": "viewer"}, follow=True
    )
    assert message in text(response)
    response = client.post(reverse("member-remove", args=[project.pk, owner.pk]), follow=True)
    assert message in text(response)
    assert Membership.objects.get(project=project, user=owner).role == Role.OWNER


def test_only_owners_change_members(client, team):
    project, viewer = team["project"], team[Role.VIEWER]
    body = text(page(client, team[Role.LAUNCHER], reverse("project-members", args=[project.pk])))
    assert "Only owners can add, change or remove members." in body and "Remove" not in body
    response = client.post(reverse("member-remove", args=[project.pk, viewer.pk]))
    assert response.status_code == 403
    assert "does not allow this: manage members and the project itself" in text(response)
    response = client.post(
        reverse("project-members", args=[project.pk]), {"username": "outsider", "role": "owner"}
    )
    assert response.status_code == 403
    assert Membership.objects.filter(project=project).count() == 4


# --- task sets and imports -----------------------------------------------------------------


def test_a_launcher_creates_a_task_set_with_its_first_file_and_lands_on_the_version(client, team):
    client.force_login(team[Role.LAUNCHER])
    body = text(client.get(reverse("task-set-create", args=[team["project"].pk])))
    assert 'enctype="multipart/form-data"' in body and "JSONL or CSV file" in body
    response = client.post(
        reverse("task-set-create", args=[team["project"].pk]),
        {"name": "code", "description": "", "file": jsonl_file(ANSWERS)},
    )
    task_set = team["project"].task_sets.get(name="code")
    assert response["Location"] == f"/task-sets/{task_set.pk}/versions/1/"
    assert task_set.versions.get().item_count == 3


def test_the_task_set_page_lists_its_versions(client, team, version):
    body = text(page(client, team[Role.VIEWER], reverse("task-set-detail", args=[version.task_set.pk])))
    assert f'<a href="/task-sets/{version.task_set.pk}/versions/1/">v1</a>' in body
    assert '<span class="chip">answer <b>3</b></span>' in body
    assert "answers.jsonl" in body and "by owner" in body


def test_a_viewer_cannot_import_or_create_a_tier(client, team, task_set):
    client.force_login(team[Role.VIEWER])
    response = client.post(reverse("task-set-import", args=[task_set.pk]), {"file": jsonl_file(ANSWERS)})
    assert response.status_code == 403
    assert "Your role in this project (viewer) does not allow this: create task sets" in text(response)
    response = client.post(reverse("tier-create", args=[team["project"].pk]), TIER)
    assert response.status_code == 403
    assert StagedImport.objects.count() == 0 and TaskSetVersion.objects.count() == 0
    assert Tier.objects.count() == 0


def test_the_preview_of_a_broken_file_lists_numbered_errors_and_imports_nothing(client, team, task_set):
    client.force_login(team[Role.LAUNCHER])
    response = client.post(reverse("task-set-import", args=[task_set.pk]), {"file": jsonl_file(BROKEN)})
    body = text(response)
    assert response.status_code == 200
    assert '<th class="num">Line</th><th>Field</th><th>Message</th>' in body
    assert (
        '<td class="num">2</td>\n            <td><code>reference</code></td>\n'
        "            <td>is required for an answer item</td>"
    ) in body
    assert '<td class="num">3</td>' in body and "not valid JSON: Expecting property name" in body
    assert "2 errors in total; nothing was imported." in body
    assert "import-confirm" not in body and "Import 1 item" not in body
    assert TaskSetVersion.objects.count() == 0 and StagedImport.objects.count() == 0


def test_a_previewed_import_imports_only_when_confirmed(client, team, task_set, media_root):
    client.force_login(team[Role.LAUNCHER])
    response = client.post(
        reverse("task-set-import", args=[task_set.pk]),
        {"file": jsonl_file(ANSWERS), "split_seed": "7", "heldout_fraction": "0.5"},
    )
    body = text(response)
    staged = StagedImport.objects.get()
    assert '<span class="stat-value" id="item-count">3</span>' in body
    assert '<span class="chip">answer <b>3</b></span>' in body
    assert "<td><code>q0</code></td>" in body and "What is 0 + 0?" in body
    assert f'action="/task-sets/{task_set.pk}/import/{staged.pk}/confirm/"' in body
    assert "Import 3 items" in body
    assert TaskSetVersion.objects.count() == 0
    assert staged.file_format == "jsonl" and staged.original_name == "items.jsonl"
    # In the artifact storage, so a confirm that reaches another web host finds it.
    assert staged.file.name.startswith("uploads/staged-imports/")
    stored = Path(artifacts_storage().path(staged.file.name))
    assert stored.exists()

    response = client.post(
        reverse("import-confirm", args=[task_set.pk, staged.pk]),
        {"split_seed": "7", "heldout_fraction": "0.5"},
    )
    version = TaskSetVersion.objects.get()
    assert response["Location"] == f"/task-sets/{task_set.pk}/versions/1/"
    assert version.item_count == 3 and version.split_seed == 7 and version.heldout_fraction == 0.5
    assert version.source_name == "items.jsonl"
    assert StagedImport.objects.count() == 0 and not stored.exists()
    assert "Imported 3 items as version 1." in text(client.get(response["Location"]))


def test_an_identical_import_creates_no_new_version(client, team, version):
    client.force_login(team[Role.OWNER])
    client.post(reverse("task-set-import", args=[version.task_set.pk]), {"file": jsonl_file(ANSWERS)})
    staged = StagedImport.objects.get()
    response = client.post(reverse("import-confirm", args=[version.task_set.pk, staged.pk]), follow=True)
    assert "The file is identical to version 1; no new version created." in text(response)
    assert TaskSetVersion.objects.count() == 1


def test_a_csv_upload_is_read_as_csv(client, team, task_set):
    from django.core.files.uploadedfile import SimpleUploadedFile

    upload = SimpleUploadedFile("qa.csv", b"prompt,reference\nWhat is 2+2?,4\n")
    client.force_login(team[Role.OWNER])
    body = text(client.post(reverse("task-set-import", args=[task_set.pk]), {"file": upload}))
    assert "Import 1 item" in body and "from qa.csv (CSV)" in body


def test_a_staged_import_belongs_to_its_user_and_task_set(client, team, task_set):
    client.force_login(team[Role.LAUNCHER])
    client.post(reverse("task-set-import", args=[task_set.pk]), {"file": jsonl_file(ANSWERS)})
    staged = StagedImport.objects.get()
    client.force_login(team[Role.OWNER])
    assert client.post(reverse("import-confirm", args=[task_set.pk, staged.pk])).status_code == 404
    other = project_services.task_set_create(project=team["project"], name="other", by=team["owner"])
    client.force_login(team[Role.LAUNCHER])
    assert client.post(reverse("import-confirm", args=[other.pk, staged.pk])).status_code == 404
    assert TaskSetVersion.objects.count() == 0 and StagedImport.objects.count() == 1


# --- the version page ----------------------------------------------------------------------


def test_untrusted_text_in_an_item_renders_escaped(client, team, task_set):
    evil = {
        "id": "x<b>",
        "kind": "agent",
        "instructions": "<script>alert(1)</script>",
        "check_command": "true",
        "max_steps": 2,
        "files": {"a.html": "<img src=x onerror=alert(2)>"},
    }
    report = project_services.task_set_import(
        task_set=task_set, stream=[json.dumps(evil).encode()], file_format="jsonl", by=team["owner"]
    )
    body = text(
        page(client, team[Role.VIEWER], reverse("version-detail", args=[task_set.pk, report.version.number]))
    )
    assert "<script>alert(1)</script>" not in body and "<img src=x" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "<dt>files: a.html</dt>" in body and "&lt;img src=x onerror=alert(2)&gt;" in body
    assert '<code class="item-id">x&lt;b&gt;</code>' in body


def test_the_item_browser_searches_filters_and_paginates(client, team, task_set):
    items = [{"id": f"i{n}", "prompt": f"item {n}", "reference": "r", "split": "train"} for n in range(60)]
    items.append({"id": "needle", "prompt": "find me", "reference": "r", "split": "heldout"})
    project_services.task_set_import(
        task_set=task_set,
        stream=[json.dumps(i).encode() + b"\n" for i in items],
        file_format="jsonl",
        by=team["owner"],
    )
    url = reverse("version-detail", args=[task_set.pk, 1])
    body = text(page(client, team[Role.VIEWER], url))
    assert "61 items; page 1 of 2" in body and body.count('<details class="item">') == 50
    assert 'href="?page=2">Next →</a>' in body
    second = text(client.get(url, {"page": 2}))
    assert second.count('<details class="item">') == 11
    found = text(client.get(url, {"q": "find"}))
    assert "1 item match" in found and '<code class="item-id">needle</code>' in found
    heldout = text(client.get(url, {"split": "heldout", "kind": "answer"}))
    assert heldout.count('<details class="item">') == 1 and '<option value="heldout" selected>' in heldout


def test_the_export_link_downloads_the_version_as_jsonl(client, team, version):
    url = reverse("version-export", args=[version.task_set.pk, 1])
    assert f'href="{url}" download>Download JSONL</a>' in text(
        page(client, team[Role.VIEWER], reverse("version-detail", args=[version.task_set.pk, 1]))
    )
    response = client.get(url)
    assert response["Content-Disposition"] == 'attachment; filename="arith-v1.jsonl"'
    lines = b"".join(response.streaming_content).decode().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["q0", "q1", "q2"]


def test_a_resplit_creates_a_new_version_and_needs_edit(client, team, version):
    url = reverse("version-resplit", args=[version.task_set.pk, 1])
    client.force_login(team[Role.VIEWER])
    assert client.post(url, {"split_seed": "3", "heldout_fraction": "1"}).status_code == 403
    client.force_login(team[Role.LAUNCHER])
    response = client.post(url, {"split_seed": "3", "heldout_fraction": "1"}, follow=True)
    new = TaskSetVersion.objects.get(number=2)
    assert new.split_counts == {"heldout": 3} and new.split_seed == 3
    assert "Re-split as version 2" in text(response)
    response = client.post(url, {"split_seed": "3", "heldout_fraction": "2"}, follow=True)
    assert "Not re-split: heldout_fraction:" in text(response)
    assert TaskSetVersion.objects.count() == 2


# --- tiers ---------------------------------------------------------------------------------


def test_a_launcher_creates_a_tier(client, team):
    client.force_login(team[Role.LAUNCHER])
    response = client.post(reverse("tier-create", args=[team["project"].pk]), TIER)
    tier = Tier.objects.get()
    assert response["Location"] == f"/tiers/{tier.pk}/"
    assert (
        tier.stop == ["</answer>", "END"] and tier.batch_size == 16 and tier.created_by == team[Role.LAUNCHER]
    )
    body = text(client.get(response["Location"]))
    assert '<code class="chip">&lt;/answer&gt;</code>' in body and "<dt>Batch size</dt><dd>16</dd>" in body


def test_an_impossible_tier_is_refused_with_the_reason_next_to_its_field(client, team):
    client.force_login(team[Role.LAUNCHER])
    bad = TIER | {
        "device": "cuda",
        "precision": "int8",
        "speculation": "draft_model",
        "speculative_tokens": "4",
    }
    response = client.post(reverse("tier-create", args=[team["project"].pk]), bad)
    body = text(response)
    assert response.status_code == 200
    assert (
        '<p class="field-error" data-field="precision">'
        "int8 dynamic quantisation runs on the CPU; choose device cpu or auto</p>"
    ) in body
    assert (
        '<p class="field-error" data-field="draft_model">speculation draft_model needs a draft model</p>'
        in body
    )
    assert Tier.objects.count() == 0


def test_a_tier_is_edited_and_deleted(client, team):
    tier = tier_services.tier_create(
        project=team["project"], by=team["owner"], name="fast", base_model="org/tiny", stop=["a"]
    )
    client.force_login(team[Role.LAUNCHER])
    form = text(client.get(reverse("tier-edit", args=[tier.pk])))
    assert 'value="fast"' in form and '<textarea name="stop" cols="40" rows="3"' in form
    assert 'id="id_stop">\na</textarea>' in form
    response = client.post(reverse("tier-edit", args=[tier.pk]), TIER | {"name": "fast", "batch_size": "0"})
    assert '<p class="field-error" data-field="batch_size">must be between 1 and 1024</p>' in text(response)
    tier.refresh_from_db()
    assert tier.batch_size == 8
    response = client.post(reverse("tier-edit", args=[tier.pk]), TIER | {"name": "faster"})
    tier.refresh_from_db()
    assert response.status_code == 302 and tier.name == "faster" and tier.device == "cpu"
    assert "Delete tier faster?" in text(client.get(reverse("tier-delete", args=[tier.pk])))
    response = client.post(reverse("tier-delete", args=[tier.pk]))
    assert response["Location"] == f"/projects/{team['project'].pk}/"
    assert Tier.objects.count() == 0


def test_a_viewer_cannot_edit_or_delete_a_tier(client, team):
    tier = tier_services.tier_create(
        project=team["project"], by=team["owner"], name="fast", base_model="org/tiny"
    )
    client.force_login(team[Role.VIEWER])
    assert client.post(reverse("tier-edit", args=[tier.pk]), TIER).status_code == 403
    assert client.post(reverse("tier-delete", args=[tier.pk])).status_code == 403
    tier.refresh_from_db()
    assert tier.name == "fast" and tier.base_model == "org/tiny"
    page = text(client.get(reverse("tier-detail", args=[tier.pk])))
    assert "Edit" not in page
    assert f'href="/playground/?models=tier-{tier.pk}"' in page  # a viewer may still try it


# --- API tokens ----------------------------------------------------------------------------


def test_a_new_token_is_shown_exactly_once(client, db):
    user = make_user("scripter")
    client.force_login(user)
    response = client.post(reverse("token-list"), {"name": "ci"})
    body = text(response)
    token = ApiToken.objects.get(user=user)
    raw = body.split('<code id="new-token">')[1].split("</code>")[0]
    assert raw.startswith("fw_") and token_digest(raw) == token.digest
    assert "this is the only time it is shown" in body
    assert "no-cache" in response["Cache-Control"]
    listing = text(client.get(reverse("token-list")))
    assert raw not in listing and "new-token" not in listing
    assert f"<code>{token.prefix}…</code>" in listing and "<td>ci</td>" in listing


def test_a_token_gets_a_default_project_among_the_users_own(client, team):
    client.force_login(team["viewer"])
    form = text(client.get(reverse("token-list")))
    assert f'<option value="{team["project"].pk}">' in form
    assert f'<option value="{team["other_project"].pk}">' not in form  # not the viewer's project
    refused = client.post(reverse("token-list"), {"name": "x", "default_project": team["other_project"].pk})
    assert "Select a valid choice" in text(refused) and not ApiToken.objects.filter(name="x").exists()
    listing = text(client.post(reverse("token-list"), {"name": "ft", "default_project": team["project"].pk}))
    assert ApiToken.objects.get(name="ft").default_project == team["project"]
    assert f">{team['project'].name}</a></td>" in listing


def test_a_token_is_revoked_by_its_owner_only(client, db):
    user, other = make_user("scripter"), make_user("other")
    token, _ = project_services.api_token_create(user=user, name="ci")
    client.force_login(other)
    assert client.post(reverse("token-revoke", args=[token.pk])).status_code == 404
    token.refresh_from_db()
    assert token.is_active
    client.force_login(user)
    response = client.post(reverse("token-revoke", args=[token.pk]), follow=True)
    token.refresh_from_db()
    assert not token.is_active
    assert "Token ci revoked" in text(response) and '<span class="badge badge-muted">revoked' in text(
        response
    )


def test_pages_refuse_a_post_without_a_csrf_token(team):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(team["owner"])
    assert client.post(reverse("project-create"), {"name": "gamma"}).status_code == 403
    assert not Membership.objects.filter(project__name="gamma").exists()

"""The REST API: auth, the error shape, projects, members, tiers, tokens, pagination, idempotency."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from core.models import IdempotencyKey
from core.roles import Role
from projects import services as project_services
from projects.models import ApiToken, Membership, Project
from tests.conftest import api_client_for, make_project, make_user
from tiers import services as tier_services
from tiers.models import Tier


def error_of(response) -> dict:
    return response.json()["error"]


def params_of(response) -> list[str | None]:
    return [detail["param"] for detail in error_of(response)["details"]]


TIER = {"name": "fast", "base_model": "org/model-1b", "precision": "bf16", "max_new_tokens": 128}

# --- auth and the error shape --------------------------------------------------------------


def test_a_request_without_credentials_answers_401_in_the_error_shape(db):
    response = APIClient().get("/api/v1/projects")
    assert response.status_code == 401
    assert response.json() == {
        "error": {
            "code": "unauthenticated",
            "message": "Authentication credentials were not provided.",
            "param": None,
            "details": [],
        }
    }
    assert response["WWW-Authenticate"] == 'Bearer realm="api"'


def test_a_revoked_token_answers_401(team):
    token, raw = project_services.api_token_create(user=team["owner"], name="ci")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get("/api/v1/me").status_code == 200
    project_services.api_token_revoke(token=token)
    response = client.get("/api/v1/me")
    assert response.status_code == 401
    assert error_of(response)["message"] == "the token is unknown or revoked"


def test_a_browser_session_also_authenticates(team):
    client = APIClient()
    client.force_login(team["viewer"])
    assert client.get("/api/v1/me").json()["username"] == "viewer"


def test_an_unknown_endpoint_answers_404_in_the_error_shape(team):
    response = api_client_for(team["owner"]).get("/api/v1/nothing-here")
    assert response.status_code == 404
    assert error_of(response)["code"] == "not_found"


def test_a_bad_body_names_every_bad_field(team):
    client = api_client_for(team["owner"])
    response = client.post("/api/v1/task-sets", {"project": "x", "name": ""}, format="json")
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "invalid_request"
    assert params_of(response) == ["project", "name"]
    assert error["param"] == "project"
    assert error["message"] == "project: A valid integer is required. (and 1 more)"


def test_a_bad_query_parameter_answers_400_naming_it(team):
    response = api_client_for(team["owner"]).get("/api/v1/tiers?project=abc")
    assert response.status_code == 400
    assert params_of(response) == ["project"]


# --- me and projects -----------------------------------------------------------------------


def test_me_reports_the_user_and_each_project_role(team):
    project_services.member_add(project=team["other_project"], username="launcher", role=Role.VIEWER)
    body = api_client_for(team["launcher"]).get("/api/v1/me").json()
    assert body["id"] == team["launcher"].pk and body["username"] == "launcher"
    assert body["created_at"].endswith("Z")
    assert body["roles"] == [
        {
            "project": team["project"].pk,
            "project_name": "alpha",
            "role": "launcher",
            "permissions": ["edit", "review", "view"],
        },
        {
            "project": team["other_project"].pk,
            "project_name": "beta",
            "role": "viewer",
            "permissions": ["view"],
        },
    ]


def test_a_user_lists_only_the_projects_they_belong_to(team):
    body = api_client_for(team["viewer"]).get("/api/v1/projects").json()
    assert [project["name"] for project in body["results"]] == ["alpha"]
    assert body["results"][0] == {
        "id": team["project"].pk,
        "name": "alpha",
        "description": "",
        "created_by": team["owner"].pk,
        "created_at": body["results"][0]["created_at"],
    }
    assert body["next"] is None


def test_creating_a_project_makes_the_caller_its_owner(db):
    user = make_user("ada")
    response = api_client_for(user).post(
        "/api/v1/projects", {"name": "gamma", "description": "math"}, format="json"
    )
    assert response.status_code == 201
    project = Project.objects.get(name="gamma")
    assert response.json()["id"] == project.pk and response.json()["description"] == "math"
    assert Membership.objects.get(project=project).role == Role.OWNER


def test_a_taken_project_name_answers_400_naming_the_field(team):
    response = api_client_for(team["outsider"]).post("/api/v1/projects", {"name": "alpha"}, format="json")
    assert response.status_code == 400
    assert error_of(response)["details"] == [
        {"param": "name", "message": "a project named 'alpha' already exists"}
    ]
    assert Project.objects.count() == 2


def test_an_owner_renames_a_project(team):
    url = f"/api/v1/projects/{team['project'].pk}"
    response = api_client_for(team["owner"]).patch(url, {"name": "alpha-2"}, format="json")
    assert response.status_code == 200 and response.json()["name"] == "alpha-2"
    assert Project.objects.get(pk=team["project"].pk).name == "alpha-2"


def test_a_launcher_may_not_rename_or_delete_a_project(team):
    client = api_client_for(team["launcher"])
    url = f"/api/v1/projects/{team['project'].pk}"
    response = client.patch(url, {"name": "mine"}, format="json")
    assert response.status_code == 403
    assert error_of(response)["code"] == "forbidden"
    assert client.delete(url).status_code == 403
    assert Project.objects.get(pk=team["project"].pk).name == "alpha"


def test_another_projects_objects_answer_404(team):
    other = team["other_project"]
    task_set = project_services.task_set_create(project=other, name="theirs", by=team["outsider"])
    tier = tier_services.tier_create(project=other, by=team["outsider"], **TIER)
    client = api_client_for(team["owner"])
    for url in (
        f"/api/v1/projects/{other.pk}",
        f"/api/v1/projects/{other.pk}/members",
        f"/api/v1/task-sets/{task_set.pk}",
        f"/api/v1/tiers/{tier.pk}",
    ):
        response = client.get(url)
        assert response.status_code == 404, url
        assert error_of(response)["code"] == "not_found"
    assert client.delete(f"/api/v1/tiers/{tier.pk}").status_code == 404
    assert Tier.objects.filter(pk=tier.pk).exists()


def test_an_owner_deletes_a_project(team):
    response = api_client_for(team["owner"]).delete(f"/api/v1/projects/{team['project'].pk}")
    assert response.status_code == 204
    assert list(Project.objects.values_list("name", flat=True)) == ["beta"]


# --- members -------------------------------------------------------------------------------


def test_members_are_listed_with_user_ids_and_roles(team):
    body = api_client_for(team["viewer"]).get(f"/api/v1/projects/{team['project'].pk}/members").json()
    assert sorted((m["username"], m["role"]) for m in body["results"]) == [
        ("launcher", "launcher"),
        ("owner", "owner"),
        ("reviewer", "reviewer"),
        ("viewer", "viewer"),
    ]
    first = body["results"][0]
    assert first["project"] == team["project"].pk
    assert first["user"] == Membership.objects.get(pk=first["id"]).user_id


def test_an_owner_adds_a_member_and_changes_their_role(team):
    client = api_client_for(team["owner"])
    project = team["project"]
    added = client.post(
        f"/api/v1/projects/{project.pk}/members", {"username": "outsider", "role": "viewer"}, format="json"
    )
    assert added.status_code == 201
    assert added.json()["user"] == team["outsider"].pk and added.json()["role"] == "viewer"
    changed = client.patch(
        f"/api/v1/projects/{project.pk}/members/{team['outsider'].pk}", {"role": "launcher"}, format="json"
    )
    assert changed.status_code == 200 and changed.json()["role"] == "launcher"
    assert Membership.objects.get(project=project, user=team["outsider"]).role == Role.LAUNCHER


def test_adding_an_unknown_user_with_a_bad_role_names_both_fields(team):
    response = api_client_for(team["owner"]).post(
        f"/api/v1/projects/{team['project'].pk}/members", {"username": "", "role": "boss"}, format="json"
    )
    assert response.status_code == 400
    assert params_of(response) == ["username", "role"]
    assert Membership.objects.filter(project=team["project"]).count() == 4


def test_a_viewer_may_not_add_members(team):
    response = api_client_for(team["viewer"]).post(
        f"/api/v1/projects/{team['project'].pk}/members",
        {"username": "outsider", "role": "owner"},
        format="json",
    )
    assert response.status_code == 403
    assert not Membership.objects.filter(project=team["project"], user=team["outsider"]).exists()


def test_an_owner_removes_a_member(team):
    url = f"/api/v1/projects/{team['project'].pk}/members/{team['reviewer'].pk}"
    assert api_client_for(team["owner"]).delete(url).status_code == 204
    assert not Membership.objects.filter(project=team["project"], user=team["reviewer"]).exists()


def test_removing_or_demoting_the_last_owner_answers_409_and_changes_nothing(team):
    client = api_client_for(team["owner"])
    url = f"/api/v1/projects/{team['project'].pk}/members/{team['owner'].pk}"
    demoted = client.patch(url, {"role": "viewer"}, format="json")
    assert demoted.status_code == 409
    assert error_of(demoted) == {
        "code": "conflict",
        "message": "a project needs at least one owner; make someone else owner first",
        "param": None,
        "details": [],
    }
    assert client.delete(url).status_code == 409
    assert Membership.objects.get(project=team["project"], user=team["owner"]).role == Role.OWNER


def test_a_member_of_another_project_answers_404(team):
    url = f"/api/v1/projects/{team['project'].pk}/members/{team['outsider'].pk}"
    assert api_client_for(team["owner"]).patch(url, {"role": "viewer"}, format="json").status_code == 404


# --- tiers ---------------------------------------------------------------------------------


def test_a_launcher_creates_a_tier_with_defaults_filled_in(team):
    response = api_client_for(team["launcher"]).post(
        "/api/v1/tiers", {**TIER, "project": team["project"].pk, "stop": ["\n\n"]}, format="json"
    )
    assert response.status_code == 201
    body = response.json()
    tier = Tier.objects.get()
    assert body["id"] == tier.pk and body["project"] == team["project"].pk
    assert body["created_by"] == team["launcher"].pk
    assert (body["precision"], body["device"], body["speculation"], body["stop"]) == (
        "bf16",
        "auto",
        "none",
        ["\n\n"],
    )
    assert body["created_at"].endswith("Z")


def test_an_impossible_tier_answers_400_naming_each_field(team):
    response = api_client_for(team["owner"]).post(
        "/api/v1/tiers",
        {
            **TIER,
            "project": team["project"].pk,
            "precision": "int8",
            "device": "cuda",
            "speculation": "draft_model",
            "top_p": 0,
        },
        format="json",
    )
    assert response.status_code == 400
    assert sorted(params_of(response)) == ["draft_model", "precision", "speculative_tokens", "top_p"]
    assert Tier.objects.count() == 0


def test_a_viewer_may_not_create_change_or_delete_a_tier(team):
    tier = tier_services.tier_create(project=team["project"], by=team["owner"], **TIER)
    client = api_client_for(team["viewer"])
    created = client.post(
        "/api/v1/tiers", {**TIER, "name": "x", "project": team["project"].pk}, format="json"
    )
    assert created.status_code == 403
    assert client.patch(f"/api/v1/tiers/{tier.pk}", {"top_k": 5}, format="json").status_code == 403
    assert client.delete(f"/api/v1/tiers/{tier.pk}").status_code == 403
    assert list(Tier.objects.values_list("name", "top_k")) == [("fast", 0)]


def test_a_tier_is_updated_and_deleted(team):
    tier = tier_services.tier_create(project=team["project"], by=team["owner"], **TIER)
    client = api_client_for(team["launcher"])
    patched = client.patch(
        f"/api/v1/tiers/{tier.pk}", {"speculation": "prompt_lookup", "speculative_tokens": 4}, format="json"
    )
    assert patched.status_code == 200
    assert (patched.json()["speculation"], patched.json()["speculative_tokens"]) == ("prompt_lookup", 4)
    refused = client.patch(f"/api/v1/tiers/{tier.pk}", {"speculative_tokens": 99}, format="json")
    assert refused.status_code == 400 and params_of(refused) == ["speculative_tokens"]
    assert Tier.objects.get().speculative_tokens == 4
    assert client.delete(f"/api/v1/tiers/{tier.pk}").status_code == 204
    assert Tier.objects.count() == 0


def test_tiers_are_listed_for_the_callers_projects_and_filtered_by_project(team):
    tier_services.tier_create(project=team["project"], by=team["owner"], **TIER)
    tier_services.tier_create(project=team["other_project"], by=team["outsider"], **TIER)
    project_services.member_add(project=team["other_project"], username="viewer", role=Role.VIEWER)
    client = api_client_for(team["viewer"])
    assert len(client.get("/api/v1/tiers").json()["results"]) == 2
    only = client.get(f"/api/v1/tiers?project={team['project'].pk}").json()["results"]
    assert [tier["project"] for tier in only] == [team["project"].pk]


# --- tokens --------------------------------------------------------------------------------


def test_a_new_token_is_shown_once_and_works(team):
    client = api_client_for(team["viewer"])
    created = client.post("/api/v1/tokens", {"name": "nightly eval"}, format="json")
    assert created.status_code == 201
    raw = created.json()["token"]
    assert raw.startswith("fw_") and created.json()["prefix"] == raw[:10]
    listed = client.get("/api/v1/tokens").json()["results"]
    assert [token["name"] for token in listed] == ["nightly eval", "tests"]
    assert all("token" not in token for token in listed)
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert other.get("/api/v1/me").json()["username"] == "viewer"


def test_a_token_names_a_default_project_of_its_users_only(team):
    client = api_client_for(team["viewer"])
    project = team["project"]
    created = client.post("/api/v1/tokens", {"name": "ft", "default_project": project.pk}, format="json")
    assert created.status_code == 201 and created.json()["default_project"] == project.pk
    assert ApiToken.objects.get(pk=created.json()["id"]).default_project == project
    listed = client.get("/api/v1/tokens").json()["results"]
    assert {token["name"]: token["default_project"] for token in listed} == {"ft": project.pk, "tests": None}
    refused = client.post(
        "/api/v1/tokens", {"name": "x", "default_project": team["other_project"].pk}, format="json"
    )
    assert refused.status_code == 400 and params_of(refused) == ["default_project"]
    too_big = client.post("/api/v1/tokens", {"name": "x", "default_project": 2**64}, format="json")
    assert too_big.status_code == 400 and params_of(too_big) == ["default_project"]
    assert ApiToken.objects.filter(name="x").count() == 0


def test_a_token_is_revoked_and_stops_working(team):
    token, raw = project_services.api_token_create(user=team["owner"], name="ci")
    response = api_client_for(team["owner"]).delete(f"/api/v1/tokens/{token.pk}")
    assert response.status_code == 204
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get("/api/v1/me").status_code == 401


def test_another_users_token_answers_404_and_stays_active(team):
    token, _ = project_services.api_token_create(user=team["owner"], name="ci")
    assert api_client_for(team["viewer"]).delete(f"/api/v1/tokens/{token.pk}").status_code == 404
    assert ApiToken.objects.get(pk=token.pk).is_active


# --- pagination ----------------------------------------------------------------------------


def test_limit_is_capped_and_next_links_walk_every_project_newest_first(db, settings):
    settings.FLYWHEEL_API_MAX_LIMIT = 3
    user = make_user("ada")
    for number in range(7):
        make_project(user, name=f"p{number}")
    client = api_client_for(user)
    page = client.get("/api/v1/projects?limit=100").json()
    names = [project["name"] for project in page["results"]]
    assert len(names) == 3
    while page["next"]:
        page = client.get(page["next"]).json()
        names += [project["name"] for project in page["results"]]
    assert names == ["p6", "p5", "p4", "p3", "p2", "p1", "p0"]


def test_limit_below_the_cap_sets_the_page_size(db):
    user = make_user("ada")
    for number in range(3):
        make_project(user, name=f"p{number}")
    page = api_client_for(user).get("/api/v1/projects?limit=2").json()
    assert [project["name"] for project in page["results"]] == ["p2", "p1"]
    assert page["next"] is not None


# --- idempotency ---------------------------------------------------------------------------


@pytest.fixture
def owner_client(team):
    return api_client_for(team["owner"])


def test_the_same_key_and_body_replay_the_first_response_and_create_one_object(team, owner_client):
    body = {**TIER, "project": team["project"].pk}
    first = owner_client.post("/api/v1/tiers", body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    again = owner_client.post("/api/v1/tiers", body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert Tier.objects.count() == 1


def test_the_same_key_with_another_body_answers_422(team, owner_client):
    owner_client.post("/api/v1/projects", {"name": "gamma"}, format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    response = owner_client.post(
        "/api/v1/projects", {"name": "delta"}, format="json", HTTP_IDEMPOTENCY_KEY="k-2"
    )
    assert response.status_code == 422
    assert error_of(response)["code"] == "idempotency_key_reused"
    assert not Project.objects.filter(name="delta").exists()


def test_a_key_still_in_flight_answers_409(team, owner_client):
    first = owner_client.post(
        "/api/v1/projects", {"name": "gamma"}, format="json", HTTP_IDEMPOTENCY_KEY="k-3"
    )
    assert first.status_code == 201
    IdempotencyKey.objects.filter(key="k-3").update(response_status=None, response_body=None)
    response = owner_client.post(
        "/api/v1/projects", {"name": "gamma"}, format="json", HTTP_IDEMPOTENCY_KEY="k-3"
    )
    assert response.status_code == 409
    assert error_of(response)["code"] == "idempotency_in_flight"
    assert Project.objects.filter(name="gamma").count() == 1


def dead_process_identity() -> str:
    """The identity a process of this host had, after it exited."""
    import subprocess
    import sys

    child = subprocess.run(
        [sys.executable, "-c", "from core.leases import process_identity; print(process_identity())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return child.stdout.strip()


def in_flight(key: str, **marker) -> None:
    IdempotencyKey.objects.filter(key=key).update(response_status=None, response_body=None, **marker)


def test_a_key_whose_request_died_with_its_process_is_released_at_once(team, owner_client):
    body = {"name": "gamma"}
    owner_client.post("/api/v1/projects", body, format="json", HTTP_IDEMPOTENCY_KEY="k-dead")
    Project.objects.filter(name="gamma").delete()  # the dead request never got that far
    lease_left = timezone.now() + timedelta(hours=1)  # a lease cannot save a process that is gone
    in_flight("k-dead", owner=dead_process_identity(), lease_until=lease_left)
    response = owner_client.post("/api/v1/projects", body, format="json", HTTP_IDEMPOTENCY_KEY="k-dead")
    assert response.status_code == 201, response.json()
    assert Project.objects.filter(name="gamma").count() == 1
    again = owner_client.post("/api/v1/projects", body, format="json", HTTP_IDEMPOTENCY_KEY="k-dead")
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.json() == response.json() and Project.objects.filter(name="gamma").count() == 1


def test_a_key_held_by_another_host_waits_for_its_lease_to_lapse(team, owner_client):
    body = {"name": "gamma"}
    owner_client.post("/api/v1/projects", body, format="json", HTTP_IDEMPOTENCY_KEY="k-far")
    Project.objects.filter(name="gamma").delete()
    elsewhere = "another-host:4242:1700000000.000"
    in_flight("k-far", owner=elsewhere, lease_until=timezone.now() + timedelta(seconds=20))
    response = owner_client.post("/api/v1/projects", body, format="json", HTTP_IDEMPOTENCY_KEY="k-far")
    assert response.status_code == 409 and error_of(response)["code"] == "idempotency_in_flight"
    assert not Project.objects.filter(name="gamma").exists()
    in_flight("k-far", owner=elsewhere, lease_until=timezone.now() - timedelta(seconds=1))
    response = owner_client.post("/api/v1/projects", body, format="json", HTTP_IDEMPOTENCY_KEY="k-far")
    assert response.status_code == 201
    assert Project.objects.filter(name="gamma").count() == 1
    marker = IdempotencyKey.objects.get(key="k-far")
    assert marker.response_status == 201 and marker.owner != elsewhere


def test_a_running_request_renews_its_lease_and_keeps_its_key(
    transactional_db, team, owner_client, monkeypatch
):
    """A request longer than the lease keeps its key: its thread renews the lease as it runs."""
    from threading import Event

    from core import api

    monkeypatch.setattr(api, "IN_FLIGHT_LEASE_SECONDS", 0.6)
    renewed, leases = Event(), []
    real_renew = api._renew_key

    def renew(claimed):
        result = real_renew(claimed)
        leases.append(IdempotencyKey.objects.get(pk=claimed.pk).lease_until)
        if len(leases) >= 3:
            renewed.set()
        return result

    monkeypatch.setattr(api, "_renew_key", renew)
    real_create = project_services.project_create

    def slow_create(**kwargs):
        assert renewed.wait(10), "the lease was not renewed while the request ran"
        return real_create(**kwargs)

    monkeypatch.setattr(project_services, "project_create", slow_create)
    response = owner_client.post(
        "/api/v1/projects", {"name": "slow"}, format="json", HTTP_IDEMPOTENCY_KEY="k-slow"
    )
    assert response.status_code == 201
    assert leases == sorted(leases) and len(set(leases)) >= 3


def test_a_replayed_token_creation_never_shows_the_secret_again(team, owner_client):
    first = owner_client.post("/api/v1/tokens", {"name": "ci"}, format="json", HTTP_IDEMPOTENCY_KEY="k-4")
    again = owner_client.post("/api/v1/tokens", {"name": "ci"}, format="json", HTTP_IDEMPOTENCY_KEY="k-4")
    assert first.json()["token"].startswith("fw_")
    assert again.json() == {**first.json(), "token": None}
    assert ApiToken.objects.filter(user=team["owner"], name="ci").count() == 1
    assert first.json()["token"] not in str(IdempotencyKey.objects.get(key="k-4").response_body)

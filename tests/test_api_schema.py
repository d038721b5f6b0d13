"""The OpenAPI schema is the contract: every endpoint is in it, and answers match what it declares."""

import json
import re
from typing import Any

import jsonschema
import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import URLPattern

from costs import api_urls as cost_api_urls
from costs import services as cost_services
from episodes import api_urls as episode_api_urls
from evaluations import api_urls as evaluation_api_urls
from ops import api_urls as ops_api_urls
from projects import api_urls as project_api_urls
from projects import services as project_services
from projects.models import TaskItem
from reviews import api_urls as review_api_urls
from reward_models import api_urls as reward_model_api_urls
from rewards import api_urls as reward_api_urls
from runs import api_urls, services
from sweeps import api_urls as sweep_api_urls
from sweeps.driver import sweep_advance
from tests.conftest import api_client_for
from tests.run_fixtures import lab, make_run  # noqa: F401
from tiers import api_urls as tier_api_urls
from tiers import services as tier_services
from traces import api_urls as trace_api_urls
from webhooks import api_urls as webhook_api_urls
from webhooks import services as webhook_services

HTTP_METHODS = ("get", "post", "put", "patch", "delete")


@pytest.fixture
def schema(db) -> dict:
    client = api_client_for(services.User.objects.create_user(username="reader"))
    response = client.get("/api/v1/schema/", {"format": "json"})
    assert response.status_code == 200
    return json.loads(response.content)


API_PATTERNS = (
    project_api_urls.urlpatterns
    + tier_api_urls.urlpatterns
    + api_urls.urlpatterns
    + reward_api_urls.urlpatterns
    + review_api_urls.urlpatterns
    + webhook_api_urls.urlpatterns
    + trace_api_urls.urlpatterns
    + reward_model_api_urls.urlpatterns
    + evaluation_api_urls.urlpatterns
    + ops_api_urls.urlpatterns
    + cost_api_urls.urlpatterns
    + episode_api_urls.urlpatterns
    + sweep_api_urls.urlpatterns
)


def schema_path(pattern: URLPattern) -> str:
    return "/api/v1/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", str(pattern.pattern))


def test_every_api_url_and_method_is_in_the_schema(schema):
    for pattern in API_PATTERNS:
        path = schema_path(pattern)
        assert path in schema["paths"], path
        view_methods = {m for m in HTTP_METHODS if hasattr(pattern.callback.view_class, m)}
        assert set(schema["paths"][path]) - {"parameters"} == view_methods, path


def test_the_schema_lists_no_endpoint_that_does_not_exist(schema):
    assert sorted(schema["paths"]) == sorted(schema_path(p) for p in API_PATTERNS)


# --- answers against the declared shapes ---------------------------------------------------


def strict(node: Any) -> Any:
    """OpenAPI 3.0 to JSON Schema: `nullable` becomes a null type, and an object may hold only
    the properties it declares, so an undeclared field fails validation."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: strict(value) for key, value in node.items()}
    if node.pop("nullable", False):
        if "enum" in node:
            node["enum"] = [*node["enum"], None]
        if "type" in node:
            node["type"] = [node["type"], "null"]
        else:
            node = {"anyOf": [node, {"type": "null"}]}
    if "properties" in node and "additionalProperties" not in node:
        node["additionalProperties"] = False
    return node


def assert_matches_schema(schema: dict, response, method: str, path: str) -> None:
    operation = schema["paths"][path][method]
    declared = operation["responses"].get(str(response.status_code))
    assert declared is not None, f"{method.upper()} {path} does not declare {response.status_code}"
    body_schema = declared["content"]["application/json"]["schema"]
    validator = jsonschema.Draft202012Validator(
        {**strict(body_schema), "components": strict(schema["components"])}
    )
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(response.json())]
    assert errors == [], f"{method.upper()} {path} {response.status_code}: {errors}"


def test_answers_match_their_declared_shapes(team, schema):
    owner = api_client_for(team["owner"])
    project = team["project"]
    task_set = project_services.task_set_create(project=project, name="arith", by=team["owner"])
    tier = tier_services.tier_create(
        project=project, by=team["owner"], name="fast", base_model="org/m", stop=["##"]
    )
    lines = (
        b'{"id": "a", "prompt": "1+1?", "reference": "2"}\n{"id": "b", "prompt": "2+2?", "reference": "4"}\n'
    )
    import_url = f"/api/v1/task-sets/{task_set.pk}/import"

    def upload(**fields):
        return owner.post(
            import_url, {"file": SimpleUploadedFile("t.jsonl", lines), **fields}, format="multipart"
        )

    dry_run = upload(dry_run="true")
    created = upload()
    unchanged = upload()
    bad = owner.post(
        import_url, {"file": SimpleUploadedFile("t.jsonl", b'{"id": "x"}\n')}, format="multipart"
    )
    version_id = created.json()["id"]
    item_id = TaskItem.objects.filter(version_id=version_id).first().pk
    answers = [
        ("get", "/api/v1/me", owner.get("/api/v1/me")),
        ("get", "/api/v1/projects", owner.get("/api/v1/projects?limit=1")),
        ("post", "/api/v1/projects", owner.post("/api/v1/projects", {"name": "gamma"}, format="json")),
        ("post", "/api/v1/projects", owner.post("/api/v1/projects", {"name": ""}, format="json")),
        ("get", "/api/v1/projects/{id}", owner.get(f"/api/v1/projects/{project.pk}")),
        ("get", "/api/v1/projects/{id}", owner.get(f"/api/v1/projects/{team['other_project'].pk}")),
        ("get", "/api/v1/projects/{id}/members", owner.get(f"/api/v1/projects/{project.pk}/members")),
        (
            "patch",
            "/api/v1/projects/{id}/members/{user_id}",
            owner.patch(
                f"/api/v1/projects/{project.pk}/members/{team['owner'].pk}", {"role": "viewer"}, format="json"
            ),
        ),
        ("get", "/api/v1/task-sets", owner.get("/api/v1/task-sets")),
        ("get", "/api/v1/task-sets/{id}", owner.get(f"/api/v1/task-sets/{task_set.pk}")),
        ("post", "/api/v1/task-sets/{id}/import", dry_run),
        ("post", "/api/v1/task-sets/{id}/import", created),
        ("post", "/api/v1/task-sets/{id}/import", unchanged),
        ("post", "/api/v1/task-sets/{id}/import", bad),
        ("get", "/api/v1/task-sets/{id}/versions", owner.get(f"/api/v1/task-sets/{task_set.pk}/versions")),
        (
            "get",
            "/api/v1/task-sets/{id}/versions/{number}",
            owner.get(f"/api/v1/task-sets/{task_set.pk}/versions/1"),
        ),
        (
            "post",
            "/api/v1/task-sets/{id}/versions/{number}/split",
            owner.post(
                f"/api/v1/task-sets/{task_set.pk}/versions/1/split",
                {"split_seed": 5, "heldout_fraction": 0.5},
                format="json",
            ),
        ),
        ("get", "/api/v1/tasks", owner.get(f"/api/v1/tasks?version={version_id}&limit=1")),
        ("get", "/api/v1/tasks/{id}", owner.get(f"/api/v1/tasks/{item_id}")),
        ("get", "/api/v1/tiers", owner.get("/api/v1/tiers")),
        ("get", "/api/v1/tiers/{id}", owner.get(f"/api/v1/tiers/{tier.pk}")),
        (
            "patch",
            "/api/v1/tiers/{id}",
            owner.patch(f"/api/v1/tiers/{tier.pk}", {"precision": "int8", "device": "cuda"}, format="json"),
        ),
        ("get", "/api/v1/tokens", owner.get("/api/v1/tokens")),
        ("post", "/api/v1/tokens", owner.post("/api/v1/tokens", {"name": "ci"}, format="json")),
        ("get", "/api/v1/tiers", api_client_for(team["viewer"]).get("/api/v1/tiers?project=x")),
    ]
    statuses = [response.status_code for _, _, response in answers]
    assert statuses == [
        *(200, 200, 201, 400, 200, 404, 200, 409),  # me, projects, members
        *(200, 200, 200, 201, 200, 400, 200, 200, 201),  # task sets, imports, versions
        *(200, 200, 200, 200, 400, 200, 201, 400),  # tasks, tiers, tokens
    ]
    for method, path, response in answers:
        assert_matches_schema(schema, response, method, path)


def test_webhook_answers_match_their_declared_shapes(team, schema):
    owner = api_client_for(team["owner"])
    project = team["project"]
    hooks = "/api/v1/webhooks"
    created = owner.post(
        hooks,
        {"project": project.pk, "url": "https://hooks.example.com/a", "statuses": ["failed"]},
        format="json",
    )
    hook = created.json()["id"]
    ping = owner.post(f"{hooks}/{hook}/ping")
    delivery = ping.json()["id"]
    pending = owner.post(f"{hooks}/{hook}/deliveries/{delivery}/redeliver")
    webhook_services.WebhookDelivery.objects.filter(pk=delivery).update(status="failed")
    answers = [
        ("post", "/api/v1/webhooks", created),
        (
            "post",
            "/api/v1/webhooks",
            owner.post(hooks, {"project": project.pk, "url": "ftp://x"}, format="json"),
        ),
        ("get", "/api/v1/webhooks", owner.get(f"{hooks}?project={project.pk}")),
        ("get", "/api/v1/webhooks/{id}", owner.get(f"{hooks}/{hook}")),
        ("get", "/api/v1/webhooks/{id}", api_client_for(team["viewer"]).get(f"{hooks}/{hook}")),
        ("patch", "/api/v1/webhooks/{id}", owner.patch(f"{hooks}/{hook}", {"active": False}, format="json")),
        ("post", "/api/v1/webhooks/{id}/ping", ping),
        ("post", "/api/v1/webhooks/{id}/ping", owner.post(f"{hooks}/{hook}/ping")),
        ("get", "/api/v1/webhooks/{id}/deliveries", owner.get(f"{hooks}/{hook}/deliveries")),
        ("post", "/api/v1/webhooks/{id}/deliveries/{delivery_id}/redeliver", pending),
    ]
    owner.patch(f"{hooks}/{hook}", {"active": True}, format="json")
    redelivered = owner.post(f"{hooks}/{hook}/deliveries/{delivery}/redeliver")
    answers.append(("post", "/api/v1/webhooks/{id}/deliveries/{delivery_id}/redeliver", redelivered))
    statuses = [response.status_code for _, _, response in answers]
    assert statuses == [201, 400, 200, 200, 403, 200, 202, 409, 200, 409, 202]
    for method, path, response in answers:
        assert_matches_schema(schema, response, method, path)
    assert owner.delete(f"{hooks}/{hook}").status_code == 204


def test_cost_answers_match_their_declared_shapes(lab, schema):  # noqa: F811 - the fixture
    owner = api_client_for(lab["owner"])
    run = make_run(lab)
    User.objects.filter(pk=lab["owner"].pk).update(is_staff=True)
    price = owner.post("/api/v1/prices", {"unit": "device_hour", "amount": "2"}, format="json")
    cost_services.usage_record(
        run_id=run.pk, step=1, component="learner", kind="learner", device_class="cpu", device_seconds=3.0
    )
    project = lab["project"].pk
    answers = [
        ("post", "/api/v1/prices", price),
        (
            "post",
            "/api/v1/prices",
            owner.post("/api/v1/prices", {"unit": "x", "amount": "-1"}, format="json"),
        ),
        ("get", "/api/v1/prices", owner.get("/api/v1/prices")),
        ("get", "/api/v1/runs/{id}/cost", owner.get(f"/api/v1/runs/{run.pk}/cost")),
        (
            "patch",
            "/api/v1/runs/{id}/budget",
            owner.patch(f"/api/v1/runs/{run.pk}/budget", {"budget_device_hours": 1.5}, format="json"),
        ),
        ("get", "/api/v1/projects/{id}/costs", owner.get(f"/api/v1/projects/{project}/costs")),
        ("get", "/api/v1/projects/{id}/budget", owner.get(f"/api/v1/projects/{project}/budget")),
        (
            "patch",
            "/api/v1/projects/{id}/budget",
            owner.patch(f"/api/v1/projects/{project}/budget", {"monthly": "10"}, format="json"),
        ),
    ]
    statuses = [response.status_code for _, _, response in answers]
    assert statuses == [201, 400, 200, 200, 200, 200, 200, 200]
    for method, path, response in answers:
        assert_matches_schema(schema, response, method, path)


def test_sweep_answers_match_their_declared_shapes(lab, schema):  # noqa: F811 - the fixture
    owner = api_client_for(lab["owner"])
    sweeps = f"/api/v1/projects/{lab['project'].pk}/sweeps"
    launch = lab["launch"]
    body = {
        "name": "lr",
        "template": {key: launch[key] for key in ("task_set_version", "reward_rule_version", "tier")},
        "parameters": [{"name": "hyperparameters.learning_rate", "values": [1e-4, 3e-4]}],
        "search": "grid",
        "max_money": "5",
    }
    created = owner.post(sweeps, body, format="json")
    sweep = created.json()["sweep"]["id"]
    sweep_advance(sweep_id=sweep)
    answers = [
        ("post", "/api/v1/projects/{id}/sweeps", created),
        ("post", "/api/v1/projects/{id}/sweeps", owner.post(sweeps, body | {"search": "x"}, format="json")),
        ("get", "/api/v1/projects/{id}/sweeps", owner.get(sweeps)),
        ("get", "/api/v1/projects/{id}/sweeps/{sweep_id}", owner.get(f"{sweeps}/{sweep}")),
        ("post", "/api/v1/projects/{id}/sweeps/{sweep_id}/cancel", owner.post(f"{sweeps}/{sweep}/cancel")),
        ("post", "/api/v1/projects/{id}/sweeps/{sweep_id}/cancel", owner.post(f"{sweeps}/{sweep}/cancel")),
    ]
    assert [response.status_code for _, _, response in answers] == [201, 400, 200, 200, 200, 409]
    for method, path, response in answers:
        assert_matches_schema(schema, response, method, path)


def test_an_undeclared_field_fails_the_shape_check(team, schema):
    response = api_client_for(team["owner"]).get("/api/v1/me")
    response.json()["surprise"] = 1  # the test client caches the parsed body
    with pytest.raises(AssertionError, match="surprise"):
        assert_matches_schema(schema, response, "get", "/api/v1/me")

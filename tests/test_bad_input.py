"""Input that used to crash the server (a 500) is the client's error: a 400 in the API's one error
shape naming the field, and nothing is written. Integers beyond 64 bits in every id and integer
parameter the schema declares, JSON nested 10,000 deep, NaN, huge formulas and nested graders."""

import doctest
import json
import time

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from core import strict_json
from projects import services as project_services
from projects.models import Project, TaskItem, TaskSet, TaskSetVersion
from rewards.models import RewardRule, RewardRuleVersion
from tests.conftest import api_client_for
from tests.run_fixtures import lab, make_run, make_trajectory  # noqa: F401

HUGE = str(2**64)  # one past what any 64-bit column holds
INT64_MAX = 2**63 - 1
DEEP = "[" * 10_000 + "]" * 10_000


def error_of(response) -> dict:
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    return response.json()["error"]


def test_the_strict_json_doctests_pass():
    assert doctest.testmod(strict_json).failed == 0


@pytest.fixture
def owner_client(team):
    return api_client_for(team["owner"])


@pytest.fixture
def schema(owner_client) -> dict:
    return json.loads(owner_client.get("/api/v1/schema/", {"format": "json"}).content)


def integer_parameters(schema: dict) -> list[tuple[str, str, str, str]]:
    """(method, path, where, name) for every integer path or query parameter in the schema."""
    found = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                if parameter.get("schema", {}).get("type") == "integer":
                    found.append((method, path, parameter["in"], parameter["name"]))
    return found


@pytest.fixture
def objects(lab, settings) -> dict[str, int]:  # noqa: F811
    """One real object behind each path id, so a query parameter is checked, not a 404."""
    from evaluations import services as suite_services
    from reviews import services as review_services
    from reward_models import services as reward_model_services
    from webhooks import services as webhook_services

    settings.FLYWHEEL_WEBHOOK_ALLOW_PRIVATE = True
    run = make_run(lab)
    make_trajectory(run)
    queue = review_services.queue_create(run=run, name="q", filters={}, by=lab["owner"])
    hook = webhook_services.webhook_create(project=lab["project"], by=lab["owner"], url="http://127.0.0.1:9/")
    reward_model = reward_model_services.reward_model_create(
        project=lab["project"], name="rm", by=lab["owner"]
    )
    entry = {"task_set_version": lab["version"].pk, "reward_rule_version": lab["rule"].versions.get().pk}
    suite = suite_services.suite_create(project=lab["project"], name="s", by=lab["owner"], entries=[entry])
    evaluation = suite_services.suite_evaluate(
        suite_version=suite.versions.get(), by=lab["owner"], tier=lab["tier"]
    )
    return {
        "eval-suites": suite.pk,
        "suite-evaluations": evaluation.pk,
        "projects": lab["project"].pk,
        "task-sets": lab["version"].task_set_id,
        "runs": run.pk,
        "trajectories": run.trajectories.get().pk,
        "reward-rules": lab["rule"].pk,
        "review-queues": queue.pk,
        "webhooks": hook.pk,
        "tiers": lab["tier"].pk,
        "reward-models": reward_model.pk,
    }


def request_for(path: str, where: str, name: str, value: str, objects: dict[str, int]) -> str:
    resource = path.split("/")[3]
    url = path.replace("{" + name + "}", value) if where == "path" else path
    url = url.replace("{id}", str(objects.get(resource, 1))).replace("{number}", "1")
    url = url.replace("{delivery_id}", "1").replace("{user_id}", "1").replace("{step}", "1")
    url = url.replace("{sweep_id}", "1")
    return url + (f"?{name}={value}" if where == "query" else "")


def test_every_integer_parameter_of_the_schema_answers_400_naming_it_for_a_number_beyond_64_bits(
    schema, owner_client, objects
):
    pairs = integer_parameters(schema)
    assert len(pairs) >= 17  # the probe found 17 endpoint/parameter pairs that answered 500
    before = counts()
    failures = []
    for method, path, where, name in pairs:
        url = request_for(path, where, name, HUGE, objects)
        response = getattr(owner_client, method)(url, {} if method == "get" else None, format="json")
        if name == "limit" and response.status_code == 200:
            assert len(response.json()["results"]) <= 200  # capped at FLYWHEEL_API_MAX_LIMIT, as documented
            continue
        if response.status_code != 400:
            failures.append(f"{method.upper()} {url}: {response.status_code}")
            continue
        error = error_of(response)
        if error["param"] != name or "less than or equal to" not in error["message"]:
            failures.append(f"{method.upper()} {url}: {error}")
    assert failures == []
    assert counts() == before


def counts() -> tuple[int, ...]:
    models = (Project, TaskSet, TaskSetVersion, TaskItem, RewardRule, RewardRuleVersion)
    return tuple(model.objects.count() for model in models)


def test_a_page_with_an_id_beyond_64_bits_answers_404(team, client):
    client.force_login(team["owner"])
    assert client.get(f"/projects/{HUGE}/").status_code == 404


def test_an_integer_beyond_64_bits_in_a_json_body_names_the_field(owner_client):
    response = owner_client.post("/api/v1/task-sets", {"project": int(HUGE), "name": "x"}, format="json")
    assert response.status_code == 400
    assert error_of(response)["param"] == "project"
    assert TaskSet.objects.count() == 0


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (DEEP, "nested deeper than 100 levels"),
        ('{"name": ' + "[" * 150 + "]" * 150 + "}", "nested deeper than 100 levels"),
        ('{"name": NaN}', "NaN is not a JSON number"),
        ('{"name": 1e999}', "1e999 is out of range for a number"),
        ('{"name": ' + "9" * 5000 + "}", "an integer of 5000 digits is too long (at most 100)"),
    ],
)
def test_json_bodies_that_crashed_the_parser_answer_400(owner_client, body, reason):
    response = owner_client.generic("POST", "/api/v1/projects", body, content_type="application/json")
    assert response.status_code == 400
    assert error_of(response)["message"] == f"JSON parse error - {reason}"
    assert Project.objects.count() == 2  # the team's two, no more


@pytest.fixture
def task_set(team):
    return project_services.task_set_create(project=team["project"], name="arith", by=team["owner"])


def import_lines(client, task_set, *lines: str):
    upload = SimpleUploadedFile("tasks.jsonl", "".join(line + "\n" for line in lines).encode())
    return client.post(f"/api/v1/task-sets/{task_set.pk}/import", {"file": upload}, format="multipart")


GOOD_LINE = json.dumps({"id": "a", "prompt": "1 + 1?", "reference": "2"})


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt": "p", "reference": "r", "metadata": ' + DEEP + "}", "nested deeper than 100 levels"),
        ('{"prompt": "p", "reference": "r", "metadata": {"x": NaN}}', "NaN is not a JSON number"),
        ('{"prompt": "p", "reference": "r", "metadata": {"x": -Infinity}}', "-Infinity is not a JSON number"),
        ('{"prompt": "p", "reference": "r", "metadata": {"x": 1e400}}', "1e400 is out of range for a number"),
    ],
)
def test_an_import_line_that_crashed_answers_400_naming_its_line_and_imports_nothing(
    owner_client, task_set, line, message
):
    response = import_lines(owner_client, task_set, GOOD_LINE, line)
    assert response.status_code == 400
    error = error_of(response)
    assert error["details"] == [{"line": 2, "param": None, "message": message}]
    assert error["message"] == f"nothing imported: line 2: {message}"
    assert TaskSetVersion.objects.count() == 0 and TaskItem.objects.count() == 0


# --- reward rules: what validation accepts, scoring can evaluate ---------------------------


def multi(formula: str, names: list[str]) -> dict:
    graders = {name: {"type": "string_check", "operation": "eq", "input": "{{ sample.output_text }}",
                      "reference": "{{ item.reference }}"} for name in names}  # fmt: skip
    return {"type": "multi", "graders": graders, "calculate_output": formula}


def create_rule(client, team, spec):
    body = {"project": team["project"].pk, "name": "r", "spec": spec}
    return client.post("/api/v1/reward-rules", body, format="json")


@pytest.mark.parametrize(
    ("formula", "expected"),
    [
        (" + ".join(["a"] * 10_000), "too long"),
        ("-" * 100_000 + "a", "too long"),
        (" + ".join(["a"] * 1_000), "nests 999 operations deep"),
        ("-" * 300 + "a", "nests 300 operations deep"),
    ],
)
def test_a_formula_scoring_could_not_evaluate_is_refused_at_validation(owner_client, team, formula, expected):
    response = create_rule(owner_client, team, multi(formula, ["a"]))
    assert response.status_code == 400
    error = error_of(response)
    assert error["param"] == "spec.calculate_output"
    assert expected in error["message"]
    assert RewardRule.objects.count() == 0


def test_the_largest_formula_validation_accepts_is_evaluated_by_a_dry_run(owner_client, team):
    from rewards.formula import MAX_FORMULA_DEPTH

    names = [f"g{i}" for i in range(MAX_FORMULA_DEPTH + 1)]  # a sum nests one level per term
    formula = " + ".join(names)
    response = create_rule(owner_client, team, multi(formula, names))
    assert response.status_code == 201, response.json()
    rule = response.json()["id"]
    dry_run = owner_client.post(
        f"/api/v1/reward-rules/{rule}/dry-run",
        {"items": [{"id": "i", "prompt": "p", "reference": "x"}], "samples": [{"output_text": "x"}]},
        format="json",
    )
    assert dry_run.status_code == 200, dry_run.json()
    assert dry_run.json()["results"][0]["result"]["total"] == len(names)


def nested_multi(depth: int) -> dict:
    spec = {"type": "string_check", "operation": "eq", "input": "a", "reference": "a"}
    for _ in range(depth):
        spec = {"type": "multi", "graders": {"x": spec}, "calculate_output": "x"}
    return spec


def test_multi_graders_nested_3000_deep_are_refused(owner_client, team):
    leaf = '{"type": "string_check", "operation": "eq", "input": "a", "reference": "a"}'
    spec = '{"type": "multi", "calculate_output": "x", "graders": {"x": ' * 3_000 + leaf + "}}" * 3_000
    body = f'{{"project": {team["project"].pk}, "name": "r", "spec": {spec}}}'
    response = owner_client.generic("POST", "/api/v1/reward-rules", body, content_type="application/json")
    assert response.status_code == 400
    assert error_of(response)["message"] == "JSON parse error - nested deeper than 100 levels"
    assert RewardRule.objects.count() == 0


def test_multi_graders_nested_deeper_than_scoring_allows_are_refused_naming_the_place(owner_client, team):
    from rewards.engine import MAX_MULTI_DEPTH

    response = create_rule(owner_client, team, nested_multi(MAX_MULTI_DEPTH + 1))
    assert response.status_code == 400
    error = error_of(response)
    assert error["param"] == "spec" + ".graders.x" * MAX_MULTI_DEPTH
    assert f"multi graders nest at most {MAX_MULTI_DEPTH} deep" in error["message"]
    assert RewardRule.objects.count() == 0
    accepted = create_rule(owner_client, team, nested_multi(MAX_MULTI_DEPTH))
    assert accepted.status_code == 201, accepted.json()


def test_a_rule_page_refuses_json_nested_too_deep_and_saves_nothing(team, client):
    client.force_login(team["owner"])
    project = team["project"]
    response = client.post(f"/projects/{project.pk}/reward-rules/new/", {"name": "r", "spec": DEEP})
    assert response.status_code == 200
    assert "nested deeper than 100 levels" in response.content.decode()
    assert RewardRule.objects.count() == 0


# --- templates: bounded in time and output -------------------------------------------------

LOOP_10_TO_THE_10 = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
FIFTY_MB = "{% for a in range(100000) %}{{ item.reference }}{% endfor %}"  # 500-char reference


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        (LOOP_10_TO_THE_10, "rendering took longer than 1 s"),
        (FIFTY_MB, "the rendered text would be 10,000,500 characters (at most 10,000,000)"),
        ('{{ "x" * 50000000 }}', "a repeated value would be 50,000,000 characters (at most 10,000,000)"),
        ('{{ "%50000000d" | format(1) }}', "a formatted field would be 50,000,000 characters"),
        ('{{ "{:>50000000}".format(1) }}', "a formatted field would be 50,000,000 characters"),
        ("{{ item.reference | center(50000000) }}", "a call or filter was given 50,000,000"),
        ("{{ 9 ** 999999 }}", "9 ** 999999 is too large a number"),
    ],
)
def test_a_template_that_would_run_away_fails_its_dry_run_with_bad_template(
    owner_client, team, template, reason
):
    spec = {"type": "string_check", "operation": "eq", "input": template, "reference": "x"}
    rule = create_rule(owner_client, team, spec)
    assert rule.status_code == 201, rule.json()
    url = f"/api/v1/reward-rules/{rule.json()['id']}/dry-run"
    body = {"items": [{"id": "i", "prompt": "p", "reference": "r" * 500}], "samples": ["x"]}
    owner_client.patch(
        f"/api/v1/reward-rules/{rule.json()['id']}", {"spec": spec | {"input": "x"}}, format="json"
    )
    owner_client.post(url, body | {"version": 2}, format="json")  # the first dry-run imports the graders
    started = time.monotonic()
    response = owner_client.post(url, body | {"version": 1}, format="json")
    assert time.monotonic() - started < 5  # bounded: the limit, not the template, decides
    assert response.status_code == 200
    result = response.json()["results"][0]["result"]
    (error,) = result["errors"]
    # On a machine busy enough that the time bound trips before the size bound, that bound names it.
    assert error["kind"] == "bad_template", error
    assert reason in error["message"] or "rendering took longer than 1 s" in error["message"], error
    assert result["total"] is None


def test_an_ordinary_template_with_a_loop_and_formatting_renders_as_before():
    from rewards.templating import compile_template

    template = compile_template(
        '{% for s in sample.steps %}{{ "%03d" | format(s) }} {% endfor %}{{ "ab" * 2 }}'
    )
    assert template.repeats is True
    assert template.render({"sample": {"steps": [1, 22]}}) == "001 022 abab"


# --- error shapes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url", ["/api/v1/task-sets/{id}/versions/9/export", "/api/v1/reviews/export?run=999999&kind=sft"]
)
def test_an_export_endpoint_answers_its_errors_as_json_even_when_ndjson_is_asked_for(
    owner_client, task_set, url
):
    response = owner_client.get(url.format(id=task_set.pk), HTTP_ACCEPT="application/x-ndjson")
    assert response.status_code in (400, 404)
    assert response["Content-Type"] == "application/json"
    assert set(error_of(response)) == {"code", "message", "param", "details"}


def test_the_trajectory_group_answers_the_list_its_schema_declares(schema, objects, owner_client):
    declared = schema["paths"]["/api/v1/trajectories/{id}/group"]["get"]["responses"]["200"]
    assert declared["content"]["application/json"]["schema"]["type"] == "array"
    body = owner_client.get(f"/api/v1/trajectories/{objects['trajectories']}/group").json()
    assert [row["id"] for row in body] == [objects["trajectories"]]


# --- a tier's model must be loadable ---------------------------------------------------------


@pytest.fixture
def hub_check(settings, monkeypatch, tmp_path):
    """The check on, a local cache of our own, and a hub that accepts connections and never answers."""
    import socket

    from huggingface_hub import HfApi, constants, try_to_load_from_cache  # noqa: F401 (imported: timed apart)

    settings.FLYWHEEL_HUB_CHECK = True
    settings.FLYWHEEL_HUB_TIMEOUT_SECONDS = 1
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
    yield tmp_path
    silent.close()


def create_tier(client, team, base_model: str):
    body = {"project": team["project"].pk, "name": "t", "base_model": base_model}
    return client.post("/api/v1/tiers", body, format="json")


def test_a_hub_model_that_cannot_be_reached_is_refused_at_creation_without_hanging(
    owner_client, team, hub_check
):
    from tiers.models import Tier

    started = time.monotonic()
    response = create_tier(owner_client, team, "someorg/some-model")
    assert time.monotonic() - started < 4  # the 1 s timeout, not the hub, decides
    assert response.status_code == 400
    error = error_of(response)
    assert error["param"] == "base_model"
    assert error["message"].startswith("base_model: someorg/some-model is not a local directory nor in the")
    assert "the hub could not be reached" in error["message"] and error["message"].endswith(
        "give a local path"
    )
    assert Tier.objects.count() == 0


def test_with_the_hub_off_a_hub_model_is_refused_at_once(owner_client, team, hub_check, monkeypatch):
    from huggingface_hub import constants

    from tiers.models import Tier

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    response = create_tier(owner_client, team, "someorg/some-model")
    assert response.status_code == 400 and "the hub is off (HF_HUB_OFFLINE)" in error_of(response)["message"]
    assert Tier.objects.count() == 0


def test_a_hub_model_in_the_local_cache_or_a_directory_of_that_name_is_accepted(
    owner_client, team, hub_check, monkeypatch
):
    snapshot = hub_check / "hf-cache" / "models--someorg--cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("abc123")
    assert create_tier(owner_client, team, "someorg/cached").status_code == 201
    monkeypatch.chdir(hub_check)
    (hub_check / "someorg" / "local").mkdir(parents=True)
    body = {"project": team["project"].pk, "name": "t2", "base_model": "someorg/local"}
    assert owner_client.post("/api/v1/tiers", body, format="json").status_code == 201


def test_a_model_name_too_long_for_the_hub_or_the_file_system_is_refused_not_a_500(
    owner_client,
    team,
    hub_check,
    lab,  # noqa: F811
):
    response = create_tier(owner_client, team, "0" * 500)
    assert response.status_code == 400
    assert error_of(response)["message"].startswith("base_model: is not a hub id the hub accepts")
    tier = lab["tier"]
    tier.base_model = "/" + "a" * 499  # a path component longer than the system allows
    tier.save()
    run = owner_client.post("/api/v1/runs", lab["launch"], format="json")
    assert run.status_code == 400
    assert error_of(run)["param"] == "tier.base_model"

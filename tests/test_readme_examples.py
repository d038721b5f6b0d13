"""Every README example of a task line and of a reward rule runs as printed: each task line imports
over REST and dry-runs, each rule is created and dry-runs on a README item it can grade. None
answers 500 (the namespace example, `tests` as a list, once did on the dry-run)."""

import json
import re
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from projects import services as project_services
from projects.published_formats import PRESETS, SIGNATURE_FIELDS, recognise_line
from rewards import services as reward_services
from rewards.graders.base import REGISTRY
from tests.conftest import api_client_for

ROOT = Path(__file__).resolve().parent.parent
# The documentation as printed: the README and the site's pages.
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TASK_FIELDS = {"prompt", "messages", "instructions", "kind"} | {
    field
    for signatures in SIGNATURE_FIELDS.values()
    for signature in signatures
    for field in ((signature,) if isinstance(signature, str) else signature)
}


def readme_objects() -> list[tuple[str, dict]]:
    """("page.md:line", object) for every JSON object the documentation prints: the lines of
    ```json blocks (or a block as one object), and the `{...}` spans inline that parse as JSON."""
    return [
        (f"{path.name}:{line}", value)
        for path in DOCUMENTS
        if path.name != "api.md"  # generated from the schema: shapes, not examples
        for line, value in document_objects(path.read_text())
    ]


def document_objects(text: str) -> list[tuple[int, dict]]:
    found = []
    for block in re.finditer(r"```json\n(.*?)```", text, re.S):
        start = text[: block.start()].count("\n") + 2
        try:
            found.append((start, json.loads(block.group(1))))
        except json.JSONDecodeError:
            for offset, line in enumerate(block.group(1).splitlines()):
                if line.strip():
                    found.append((start + offset, json.loads(line)))
    for span in re.finditer(r"`(\{[^`]*\})`", text):
        try:
            value = json.loads(span.group(1))
        except json.JSONDecodeError:  # a shape such as {"input", "output"}, not an example
            continue
        found.append((text[: span.start()].count("\n") + 1, value))
    return [(line, value) for line, value in found if isinstance(value, dict)]


def is_rule(value: dict) -> bool:
    return value.get("type") in {*REGISTRY, "multi"}


def is_task_line(value: dict) -> bool:
    return not is_rule(value) and bool(TASK_FIELDS & set(value))


TASK_LINES = [(line, value) for line, value in readme_objects() if is_task_line(value)]
RULES = [(line, value) for line, value in readme_objects() if is_rule(value)]


def test_the_readme_holds_task_lines_of_every_kind_and_format_and_rules_to_check():
    own = [value for _, value in TASK_LINES if recognise_line(value) is None]
    assert {item_kind(value) for value in own} == {"answer", "code", "agent"}
    assert {recognise_line(value) for _, value in TASK_LINES} == {None, *PRESETS}
    assert len(TASK_LINES) >= 14 and len(RULES) >= 4


def item_kind(value: dict) -> str:
    return value.get("kind") or ("answer" if "reference" in value else "code")


def sample_for(kind: str) -> dict:
    if kind == "code":
        return {"output_text": "```python\ndef add(a, b):\n    return a + b\n```\n"}
    if kind == "agent":
        return {"output_text": "done", "steps": [{"kind": "command", "valid": True}]}
    return {"output_text": "5"}


@pytest.mark.parametrize(("line", "value"), TASK_LINES, ids=[line for line, _ in TASK_LINES])
def test_each_readme_task_line_imports_and_dry_runs(team, line, value):
    client = api_client_for(team["launcher"])
    task_set = project_services.task_set_create(
        project=team["project"], name=f"readme-{line}", by=team["owner"]
    )
    upload = SimpleUploadedFile("readme.jsonl", (json.dumps(value) + "\n").encode())
    imported = client.post(f"/api/v1/task-sets/{task_set.pk}/import", {"file": upload}, format="multipart")
    assert imported.status_code == 201, (line, imported.json())
    kind = item_kind(value)
    spec = {"type": "unit_tests", "name": "tests"} if kind == "code" else {"type": "steps", "name": "steps"}
    if kind == "answer":
        spec = {
            "type": "string_check",
            "name": "exact",
            "input": "{{sample.output_text}}",
            "reference": "{{item.reference}}",
            "operation": "eq",
        }
    rule = reward_services.reward_rule_create(
        project=team["project"], name=f"r{line}", spec=spec, by=team["owner"]
    )
    body = {"items": [value], "samples": [sample_for(kind)]}
    response = client.post(f"/api/v1/reward-rules/{rule.pk}/dry-run", body, format="json")
    assert response.status_code == 200, (line, response.json())
    assert response.json()["summary"]["count"] == 1


def item_for_rule(spec: dict) -> dict:
    """A README task line the rule can grade: an agent item for agent_check, else a code item."""
    wanted = "agent" if "agent_check" in json.dumps(spec) else "code"
    return next(value for _, value in TASK_LINES if item_kind(value) == wanted)


@pytest.mark.parametrize(("line", "spec"), RULES, ids=[line for line, _ in RULES])
def test_each_readme_rule_is_accepted_and_dry_runs(team, line, spec):
    client = api_client_for(team["launcher"])
    created = client.post(
        "/api/v1/reward-rules",
        {"project": team["project"].pk, "name": f"readme {line}", "spec": spec},
        format="json",
    )
    assert created.status_code == 201, (line, created.json())
    item = item_for_rule(spec)
    body = {"items": [item], "samples": [sample_for(item_kind(item))]}
    response = client.post(f"/api/v1/reward-rules/{created.json()['id']}/dry-run", body, format="json")
    assert response.status_code == 200, (line, response.json())

"""Writes the REST API reference page of the docs site from the OpenAPI schema (drf-spectacular).

The page is generated, never edited: `make docs` runs this before `mkdocs build --strict`, so the
reference cannot drift from the code. One section per tag; per operation its method and path, its
summary, its parameters and the schema of its request body and its success response.

    python scripts/api_reference.py docs/reference/api.md
"""

import os
import sys
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("get", "post", "put", "patch", "delete")


def load_schema() -> dict:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    from drf_spectacular.generators import SchemaGenerator

    return SchemaGenerator().get_schema(request=None, public=True)


def schema_name(schema: Mapping) -> str:
    """A short name for a schema: its component name, or its type.

    >>> schema_name({"$ref": "#/components/schemas/RunDetail"}), schema_name({"type": "integer"})
    ('RunDetail', 'integer')
    >>> schema_name({"type": "array", "items": {"$ref": "#/components/schemas/Item"}})
    'array of Item'
    """
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if schema.get("type") == "array":
        return f"array of {schema_name(schema.get('items', {}))}"
    if "allOf" in schema or "oneOf" in schema:
        parts = schema.get("allOf") or schema.get("oneOf") or []
        return " or ".join(schema_name(part) for part in parts)
    return str(schema.get("type", "object"))


def cell(text: object) -> str:
    """Text safe inside one Markdown table cell.

    >>> cell("a | b\\nc")
    'a \\\\| b c'
    """
    return " ".join(str(text).split()).replace("|", "\\|")


def body_schema(operation: Mapping) -> str | None:
    content = operation.get("requestBody", {}).get("content", {})
    for media_type in ("application/json", "multipart/form-data"):
        if media_type in content:
            return schema_name(content[media_type].get("schema", {}))
    return None


def success_schema(operation: Mapping) -> tuple[str, str | None]:
    for status, response in sorted(operation.get("responses", {}).items()):
        if status.startswith("2"):
            content = response.get("content", {})
            for media_type, media in content.items():
                return status, f"{schema_name(media.get('schema', {}))} ({media_type})"
            return status, None
    return "", None


def render_operation(method: str, path: str, operation: Mapping) -> list[str]:
    lines = [f"### `{method.upper()} {path}`", ""]
    if operation.get("summary"):
        lines += [cell(operation["summary"]), ""]
    if operation.get("description"):
        lines += [operation["description"].strip(), ""]
    parameters = operation.get("parameters", [])
    if parameters:
        lines += ["| parameter | in | type | required | description |", "| --- | --- | --- | --- | --- |"]
        for parameter in parameters:
            kind = schema_name(parameter.get("schema", {}))
            required = "yes" if parameter.get("required") else "no"
            description = cell(parameter.get("description", ""))
            name, where = parameter["name"], parameter["in"]
            lines.append(f"| `{name}` | {where} | {kind} | {required} | {description} |")
        lines.append("")
    body = body_schema(operation)
    if body:
        lines += [f"Request body: `{body}`", ""]
    status, response = success_schema(operation)
    if status:
        lines += [f"Success: `{status}`" + (f", `{response}`" if response else ""), ""]
    return lines


def render_component(name: str, component: Mapping) -> list[str]:
    """A component schema as a table of its fields (an enum as its values).

    >>> render_component("Kind", {"enum": ["a", "b"], "type": "string"})
    ['### Kind', '', 'One of: `a`, `b`', '']
    """
    lines = [f"### {name}", ""]
    if "enum" in component:
        return lines + ["One of: " + ", ".join(f"`{value}`" for value in component["enum"]), ""]
    if component.get("description"):
        lines += [cell(component["description"]), ""]
    properties = component.get("properties", {})
    if properties:
        required = set(component.get("required", []))
        lines += ["| field | type | required | description |", "| --- | --- | --- | --- |"]
        for field, spec in properties.items():
            flags = " (read-only)" if spec.get("readOnly") else ""
            lines.append(
                f"| `{field}` | {schema_name(spec)}{flags} | {'yes' if field in required else 'no'} "
                f"| {cell(spec.get('description', ''))} |"
            )
        lines.append("")
    return lines


def render(schema: Mapping) -> str:
    by_tag: dict[str, list[tuple[str, str, Mapping]]] = defaultdict(list)
    for path, item in schema["paths"].items():
        for method in METHODS:
            if method in item:
                tag = (item[method].get("tags") or ["other"])[0]
                by_tag[tag].append((method, path, item[method]))
    info = schema.get("info", {})
    lines = [
        "# REST API reference",
        "",
        "<!-- Generated by scripts/api_reference.py from the OpenAPI schema; do not edit. -->",
        "",
        f"{cell(info.get('title', 'Flywheel API'))} {cell(info.get('version', ''))}. Conventions "
        "(auth, errors, pagination, idempotency) are in [the REST guide](../guides/automate.md); "
        "the machine-readable schema is served at `/api/v1/schema/` and browsable at `/api/v1/docs/` "
        "on every server.",
        "",
    ]
    for tag in sorted(by_tag):
        lines += [f"## {tag}", ""]
        for method, path, operation in by_tag[tag]:
            lines += render_operation(method, path, operation)
    lines += ["## Schemas", ""]
    for name, component in sorted(schema.get("components", {}).get("schemas", {}).items()):
        lines += render_component(name, component)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(load_schema()))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

"""Grader templates: `{{ item.reference }}`, `{{ sample.output_text }}`, as in OpenAI's grader JSON.

Two namespaces exist, `item` (the task item as stored: prompt, reference, tests, metadata, ...) and
`sample` (output_text, output_json, files, steps, tokens, metadata). Templates are Jinja, rendered
in a sandboxed environment with StrictUndefined: a name that does not exist is an error, never an
empty string. Objects and lists render as JSON, None as an empty string.

A template that is one plain variable path (the common case) is rendered by a direct lookup that
gives the same result as Jinja, at a fraction of the cost.
"""

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from jinja2 import StrictUndefined, TemplateError, nodes
from jinja2.meta import find_undeclared_variables
from jinja2.sandbox import ImmutableSandboxedEnvironment

from rewards.graders.base import SAMPLE_FIELDS

NAMESPACES = ("item", "sample")
PLAIN_PATH = re.compile(r"^\{\{\s*([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\s*\}\}$")


class TemplateRenderError(Exception):
    """A template named something the item or sample does not have, or failed to render."""


def finalize(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return value


ENVIRONMENT = ImmutableSandboxedEnvironment(
    undefined=StrictUndefined, autoescape=False, finalize=finalize, keep_trailing_newline=True
)


@dataclass(frozen=True)
class Template:
    source: str
    path: tuple[str, ...] | None  # a plain `{{ a.b }}`: rendered by lookup
    compiled: Any  # a jinja2.Template, or None for literal text and plain paths

    def render(self, variables: dict) -> str:
        """The text, with item and sample values in place.

        >>> compile_template("{{ item.reference }}!").render({"item": {"reference": "42"}})
        '42!'
        >>> compile_template("{{ sample.output_json }}").render({"sample": {"output_json": {"a": 1}}})
        '{"a": 1}'
        """
        if self.path is not None:
            return lookup(self.path, variables)
        if self.compiled is None:
            return self.source
        try:
            return self.compiled.render(variables)
        except TemplateError as exc:
            raise TemplateRenderError(f"template {self.source!r}: {exc.message}") from None
        except Exception as exc:  # noqa: BLE001  (a filter on a wrong type: the rule's template is at fault)
            raise TemplateRenderError(f"template {self.source!r}: {type(exc).__name__}: {exc}") from None


def lookup(path: tuple[str, ...], variables: dict) -> str:
    value: Any = variables
    for depth, part in enumerate(path):
        if isinstance(value, dict) and part in value:
            value = value[part]
        else:
            where = ".".join(path[: depth + 1])
            raise TemplateRenderError(f"template {{{{ {'.'.join(path)} }}}}: {where} is undefined")
    value = finalize(value)
    return value if isinstance(value, str) else str(value)


@lru_cache(maxsize=4096)
def compile_template(source: str) -> Template:
    """A template ready to render; raises TemplateRenderError when it does not parse."""
    plain = PLAIN_PATH.match(source)
    if plain:
        return Template(source, tuple(plain.group(1).split(".")), None)
    if "{{" not in source and "{%" not in source and "{#" not in source:
        return Template(source, None, None)
    try:
        return Template(source, None, ENVIRONMENT.from_string(source))
    except TemplateError as exc:
        raise TemplateRenderError(f"template {source!r}: {exc.message}") from None


def template_problems(source: str, *, item_fields: set[str] | None = None) -> list[str]:
    """What is wrong with a template, before any item is at hand.

    Unknown namespaces and unknown sample fields are always caught; unknown item fields only when
    the item fields are known (a rule for one kind of task), else at scoring time.

    >>> template_problems("{{ itme.reference }}")
    ["unknown variable 'itme': templates reach item.* and sample.*"]
    >>> template_problems("{{ sample.output_txt }}")
    ["sample has no field 'output_txt' (it has output_text, output_json, files, steps, tokens, metadata)"]
    >>> template_problems("{{ item.reference }} vs {{ sample.output_text }}")
    []
    """
    try:
        tree = ENVIRONMENT.parse(source)
    except TemplateError as exc:
        return [f"does not parse: {exc.message}"]
    problems = [
        f"unknown variable '{name}': templates reach item.* and sample.*"
        for name in sorted(find_undeclared_variables(tree))
        if name not in NAMESPACES
    ]
    for namespace, attribute in attribute_uses(tree):
        if namespace == "sample" and attribute not in SAMPLE_FIELDS:
            problems.append(f"sample has no field '{attribute}' (it has {', '.join(SAMPLE_FIELDS)})")
        if namespace == "item" and item_fields is not None and attribute not in item_fields:
            problems.append(f"item has no field '{attribute}' (it has {', '.join(sorted(item_fields))})")
    return problems


def attribute_uses(tree: nodes.Template) -> list[tuple[str, str]]:
    """(namespace, field) for every `item.x`, `sample.x`, `item["x"]` in the template."""
    uses = []
    for node in tree.find_all((nodes.Getattr, nodes.Getitem)):
        if not isinstance(node.node, nodes.Name) or node.node.name not in NAMESPACES:
            continue
        if isinstance(node, nodes.Getattr):
            uses.append((node.node.name, node.attr))
        elif isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
            uses.append((node.node.name, node.arg.value))
    return uses

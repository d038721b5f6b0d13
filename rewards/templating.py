"""Grader templates: `{{ item.reference }}`, `{{ sample.output_text }}`, as in OpenAI's grader JSON.

Two namespaces exist, `item` (the task item as stored: prompt, reference, tests, metadata, ...) and
`sample` (output_text, output_json, files, steps, tokens, metadata). Templates are Jinja, rendered
in a sandboxed environment with StrictUndefined: a name that does not exist is an error, never an
empty string. Objects and lists render as JSON, None as an empty string.

A template that is one plain variable path (the common case) is rendered by a direct lookup that
gives the same result as Jinja, at a fraction of the cost.

Rendering is bounded, since a template is user text run in the web process (dry-runs) and the
workers: at most MAX_RENDER_SECONDS of work and MAX_RENDER_CHARS of output, and no single
operation (`"x" * n`, `9 ** 9 ** 9`, `"%99999999d" | format(1)`, `center(n)`) may build more.
A template over a bound fails with TemplateRenderError (GraderError "bad_template"), saying which.
"""

import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache, wraps
from typing import Any

from jinja2 import StrictUndefined, TemplateError, nodes
from jinja2.meta import find_undeclared_variables
from jinja2.sandbox import ImmutableSandboxedEnvironment

from rewards.graders.base import SAMPLE_FIELDS

NAMESPACES = ("item", "sample")
MAX_RENDER_SECONDS = 1.0
MAX_RENDER_CHARS = 10_000_000
MAX_POWER_BITS = 100_000  # 2 ** 100_000 has 30,103 digits: more than any reward needs
# A width or precision in a %-format or a format spec: "%99999999d", "{:>99999999}".
FORMAT_WIDTHS = re.compile(r"%[-+ #0*]*(\d+)|%[-+ #0*]*\d*\.(\d+)|\{[^{}]*:[^{}]*?(\d+)")
PLAIN_PATH = re.compile(r"^\{\{\s*([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\s*\}\}$")


class TemplateRenderError(Exception):
    """A template named something the item or sample does not have, or failed to render."""


class RenderLimitError(Exception):
    """A template went past a bound on its work or its output."""


def too_big(count: int, what: str) -> None:
    if count > MAX_RENDER_CHARS:
        raise RenderLimitError(f"{what} would be {count:,} characters (at most {MAX_RENDER_CHARS:,})")


def check_format_widths(text: Any) -> None:
    if isinstance(text, str) and ("%" in text or "{" in text):
        for match in FORMAT_WIDTHS.finditer(text):
            too_big(max(int(group) for group in match.groups() if group), "a formatted field")


def check_arguments(args: tuple, kwargs: dict) -> None:
    """A number in a call (`center(n)`, `indent(n)`, `ljust(n)`) sizes what it builds."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_RENDER_CHARS:
            raise RenderLimitError(
                f"a call or filter was given {value:,}: more than a rendered text may hold "
                f"({MAX_RENDER_CHARS:,} characters)"
            )


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The sandbox, with the operators and calls that can build huge values checked first."""

    intercepted_binops = frozenset({"*", "**", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.filters = {name: bounded_filter(function) for name, function in self.filters.items()}

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for sequence, count in ((left, right), (right, left)):
                if isinstance(sequence, (str, list, tuple)) and isinstance(count, int):
                    too_big(len(sequence) * count, "a repeated value")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
            if right * abs(left).bit_length() > MAX_POWER_BITS:
                raise RenderLimitError(f"{left} ** {right} is too large a number")
        elif operator == "%":
            check_format_widths(left)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context, __obj, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (Jinja's names)
        check_arguments(args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value: Any):
        wrapped = super().wrap_str_format(value)  # a str's format or format_map, sandboxed
        if wrapped is not None:
            check_format_widths(value.__self__)
        return wrapped


def bounded_filter(function):
    @wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        check_arguments(args[1:], kwargs)  # args[0] is the value filtered (or the environment)
        if function.__name__ == "do_format":
            check_format_widths(next((arg for arg in args if isinstance(arg, str)), ""))
        return function(*args, **kwargs)

    return bounded


def render_bounded(compiled: Any, variables: dict, *, repeats: bool) -> str:
    """Render within MAX_RENDER_SECONDS and MAX_RENDER_CHARS, or raise RenderLimitError.

    A template that `repeats` (loops, macros) has its time checked on every line of its compiled
    code (a trace function on the template's frames only), so even a loop that outputs nothing
    stops at the deadline; one without runs each of its few statements once, untraced.
    """
    if not repeats:
        return collect(compiled.generate(variables))
    deadline = time.monotonic() + MAX_RENDER_SECONDS

    def on_line(frame, event: str, arg: Any):
        if time.monotonic() > deadline:
            raise RenderLimitError(f"rendering took longer than {MAX_RENDER_SECONDS:g} s")
        return on_line

    def on_call(frame, event: str, arg: Any):
        return on_line if frame.f_code.co_filename == "<template>" else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        return collect(compiled.generate(variables))
    finally:
        sys.settrace(previous)


def collect(parts: Iterator[str]) -> str:
    kept, size = [], 0
    for part in parts:
        size += len(part)
        too_big(size, "the rendered text")
        kept.append(part)
    return "".join(kept)


REPEATING = (nodes.For, nodes.Macro, nodes.CallBlock)


def finalize(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return value


ENVIRONMENT = BoundedSandbox(
    undefined=StrictUndefined, autoescape=False, finalize=finalize, keep_trailing_newline=True
)


@dataclass(frozen=True)
class Template:
    source: str
    path: tuple[str, ...] | None  # a plain `{{ a.b }}`: rendered by lookup
    compiled: Any  # a jinja2.Template, or None for literal text and plain paths
    repeats: bool = False  # it loops or defines macros: its rendering time is watched

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
            return render_bounded(self.compiled, variables, repeats=self.repeats)
        except RenderLimitError as exc:
            raise TemplateRenderError(f"template {shown(self.source)}: {exc}") from None
        except TemplateError as exc:
            raise TemplateRenderError(f"template {shown(self.source)}: {exc.message}") from None
        except Exception as exc:  # noqa: BLE001  (a filter on a wrong type: the rule's template is at fault)
            message = f"{type(exc).__name__}: {exc}"
            raise TemplateRenderError(f"template {shown(self.source)}: {message}") from None


def shown(source: str, limit: int = 200) -> str:
    """The template as an error message quotes it: its start, when it is long."""
    return repr(source if len(source) <= limit else source[:limit] + "...")


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
        # find_all, not find: jinja2 types find with one node class, and this is a tuple of them.
        repeats = next(ENVIRONMENT.parse(source).find_all(REPEATING), None) is not None
        return Template(source, None, ENVIRONMENT.from_string(source), repeats)
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
        if isinstance(node, nodes.Getattr):
            owner, field = node.node, node.attr
        elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
            owner, field = node.node, node.arg.value
        else:
            continue
        if isinstance(owner, nodes.Name) and owner.name in NAMESPACES and isinstance(field, str):
            uses.append((owner.name, field))
    return uses

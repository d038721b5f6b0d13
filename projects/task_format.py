"""The task item file format: parse JSONL and CSV lines into validated, normalised items.

Pure functions, no database: the import service streams a file through `read_items` and decides
what to store. Every problem is reported with its line and field so a user can fix the file.

A line of JSONL is one object. Common fields: `kind` (answer, code or agent; default answer),
`id` (a stable identifier; default: derived from the content), `split` (train or heldout; default:
the seeded rule), `metadata` (any object). Then, by kind:

- answer: `prompt`, `reference`
- code: `prompt`, and tests in one of the formats of `sandboxes.formats` (`tests`, or
  `io_tests`, or pytest files in `setup_files`); `entry_point` (required for candidate-style
  tests); optional `test_format`, `test_setup_code`, `io_compare`, `float_tolerance`,
  `reference_solution`, `setup_files`, `sandbox`. An item whose tests hold no test in any format
  is refused here, with its line and field. `tests` may be a list of assert lines (MBPP's
  `test_list`): they are joined into one source.
- agent: `instructions`, `check_command`, `max_steps`, optional `files`, `sandbox`, `tools` (the
  built-in tools it offers, by name or as OpenAI function objects; all by default), `test_file`
  (what `run_tests` runs), `system`, `messages` (a demonstration conversation, as exports write),
  `mcp_servers` (MCP servers started in the episode's sandbox, whose tools are offered beside the
  built-ins: `inference.mcp_tools`)

A line without `kind` in one of the field's published layouts (HumanEval, MBPP, APPS,
CodeContests, LiveCodeBench: `projects.published_formats`) is recognised by its fields and mapped to
a code item; an import's `format` may also force one layout for every line.

An answer or code item may hold a conversation instead of a `prompt`: `messages`, a list of
`{"role": "system" | "user" | "assistant", "content": str}` ending with the user's turn (a system
message only first). Tiers that chat render it with the model's chat template
(`inference.chat`); the item's searchable text is its last user message.

`sandbox` says what the item's code needs of its sandbox: `image` (a local Docker image; Docker
backend only) and `limits` (any of the sandbox limits, e.g. {"wall_seconds": 60, "memory_mb": 2048}),
which replace the grader's or the episode's defaults for that item.
"""

import csv
import hashlib
import io
import json
import posixpath
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from core import strict_json
from inference.chat import messages_problems, prompt_summary
from inference.mcp_tools import mcp_servers_problems
from inference.tool_chat import tools_problem
from projects.published_formats import (
    PRESETS,
    TITLES,
    LineError,
    published_field,
    recognise_line,
    to_code_item,
)
from sandboxes.formats import COMPARE_MODES, FORMATS, item_test_problems
from sandboxes.interface import image_problem, limits_problems

KINDS = ("answer", "code", "agent")
ARTICLE = {"answer": "an", "code": "a", "agent": "an"}
SPLITS = ("train", "heldout")
COMMON_FIELDS = {"kind", "id", "split", "metadata"}
MAX_ID_LENGTH = 200
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class FieldSpec:
    required: bool
    kind: type | tuple[type, ...]


KIND_FIELDS: dict[str, dict[str, FieldSpec]] = {
    "answer": {
        "prompt": FieldSpec(True, str),
        "messages": FieldSpec(False, list),
        "reference": FieldSpec(True, str),
    },
    "code": {
        "prompt": FieldSpec(True, str),
        "messages": FieldSpec(False, list),
        "tests": FieldSpec(False, (str, list)),
        "entry_point": FieldSpec(False, str),
        "test_format": FieldSpec(False, str),
        "test_setup_code": FieldSpec(False, str),
        "io_tests": FieldSpec(False, list),
        "io_compare": FieldSpec(False, str),
        "float_tolerance": FieldSpec(False, (int, float)),
        "reference_solution": FieldSpec(False, str),
        "setup_files": FieldSpec(False, dict),
        "sandbox": FieldSpec(False, dict),
    },
    "agent": {
        "instructions": FieldSpec(True, str),
        "check_command": FieldSpec(True, str),
        "max_steps": FieldSpec(True, int),
        "files": FieldSpec(False, dict),
        "sandbox": FieldSpec(False, dict),
        "tools": FieldSpec(False, list),
        "test_file": FieldSpec(False, str),
        "system": FieldSpec(False, str),
        "messages": FieldSpec(False, list),
        "mcp_servers": FieldSpec(False, list),
    },
}
TEXT_FIELD = {"answer": "prompt", "code": "prompt", "agent": "instructions"}


@dataclass
class ItemError:
    line: int
    field: str | None
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line, "param": self.field, "message": self.message}

    def __str__(self) -> str:
        where = f"line {self.line}" + (f", field '{self.field}'" if self.field else "")
        return f"{where}: {self.message}"


@dataclass
class ParsedItem:
    line: int
    external_id: str
    kind: str
    split: str | None  # None: to be assigned by the seeded rule
    text: str
    data: dict[str, Any] = field(default_factory=dict)


def _type_name(kind: type | tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", dict: "an object", list: "a list"}
    if kind == (int, float):
        return "a number"
    if kind == (str, list):
        return "a string or a list of strings"
    return names.get(kind, str(kind)) if isinstance(kind, type) else "a value"


def _check_files(line: int, name: str, files: dict[str, Any]) -> list[ItemError]:
    errors = []
    for path, content in files.items():
        normal = posixpath.normpath(path)
        if path.startswith("/") or normal.startswith("..") or normal in ("", "."):
            errors.append(ItemError(line, f"{name}.{path}", "must be a relative path inside the workspace"))
        if not isinstance(content, str):
            errors.append(ItemError(line, f"{name}.{path}", "file content must be a string"))
    return errors


def validate_item(line: int, raw: Any, preset: str = "auto") -> tuple[ParsedItem | None, list[ItemError]]:
    """Validate one decoded item; return the normalised item, or the list of what is wrong.

    `preset`: auto (a line without `kind` in a published format is recognised by its fields),
    flywheel (Flywheel's own lines only), or one of `published_formats.PRESETS` (every line).
    """
    source = _published_source(raw, preset)
    if source is not None:
        return _validate_published(line, raw, source)
    if not isinstance(raw, dict):
        return None, [ItemError(line, None, "each line must be a JSON object")]
    kind = raw.get("kind", "answer")
    if kind not in KINDS:
        return None, [ItemError(line, "kind", f"must be one of {', '.join(KINDS)}; got {kind!r}")]
    specs = KIND_FIELDS[kind]
    if "messages" in specs and raw.get("messages") is not None:  # the conversation replaces `prompt`
        specs = specs | {"prompt": FieldSpec(False, str)}
    errors: list[ItemError] = []
    for name in sorted(set(raw) - COMMON_FIELDS - set(specs)):
        errors.append(ItemError(line, name, f"unknown field for {ARTICLE[kind]} {kind} item"))
    for name, spec in specs.items():
        value = raw.get(name)
        if value is None:
            if spec.required:
                also = (
                    " (or give messages, a conversation)" if name == "prompt" and "messages" in specs else ""
                )
                errors.append(ItemError(line, name, f"is required for {ARTICLE[kind]} {kind} item{also}"))
            continue
        if not isinstance(value, spec.kind) or isinstance(value, bool):
            errors.append(ItemError(line, name, f"must be {_type_name(spec.kind)}"))
        elif spec.required and isinstance(value, str) and not value.strip():
            errors.append(ItemError(line, name, "must not be empty"))
    errors += _check_common(line, raw)
    if kind == "code" and isinstance(raw.get("tests"), list):
        if all(isinstance(test, str) for test in raw["tests"]):
            raw = {**raw, "tests": "\n".join(test.rstrip("\n") for test in raw["tests"]) + "\n"}
        else:
            errors.append(ItemError(line, "tests", "must be a string or a list of strings"))
    if not errors:
        errors += _check_kind_rules(line, kind, raw)
    if errors:
        return None, errors
    data = {name: raw[name] for name in specs if raw.get(name) is not None}
    if "metadata" in raw:
        data["metadata"] = raw["metadata"]
    external_id = raw.get("id") or derived_id(kind, data)
    text = prompt_summary(data["messages"]) if "messages" in data else data[TEXT_FIELD[kind]]
    return ParsedItem(line, str(external_id), kind, raw.get("split"), text, data), []


def _published_source(raw: Any, preset: str) -> str | None:
    if preset in PRESETS:
        return preset
    return recognise_line(raw) if preset == "auto" and isinstance(raw, dict) else None


def _validate_published(line: int, raw: Any, source: str) -> tuple[ParsedItem | None, list[ItemError]]:
    """A published line, mapped to a code item; problems name the published field."""
    title = TITLES[source]
    if not isinstance(raw, dict):
        return None, [ItemError(line, None, f"each line must be a JSON object ({title} line)")]
    try:
        mapped = to_code_item(raw, source)
    except LineError as exc:
        return None, [ItemError(line, exc.field, f"{exc.message} ({title} line)")]
    parsed, errors = validate_item(line, mapped, "flywheel")
    return parsed, [
        ItemError(error.line, published_field(source, error.field), f"{error.message} ({title} line)")
        for error in errors
    ]


def _check_common(line: int, raw: dict[str, Any]) -> list[ItemError]:
    errors = []
    item_id = raw.get("id")
    if item_id is not None and (
        not isinstance(item_id, (str, int)) or isinstance(item_id, bool) or str(item_id) == ""
    ):
        errors.append(ItemError(line, "id", "must be a non-empty string or integer"))
    elif item_id is not None and len(str(item_id)) > MAX_ID_LENGTH:
        errors.append(ItemError(line, "id", f"must be at most {MAX_ID_LENGTH} characters"))
    split = raw.get("split")
    if split is not None and split not in SPLITS:
        errors.append(ItemError(line, "split", f"must be train or heldout; got {split!r}"))
    if "metadata" in raw and not isinstance(raw["metadata"], dict):
        errors.append(ItemError(line, "metadata", "must be an object"))
    return errors


def _check_sandbox(line: int, sandbox: dict[str, Any]) -> list[ItemError]:
    errors = [
        ItemError(line, f"sandbox.{name}", "unknown field (known: image, limits)")
        for name in sorted(set(sandbox) - {"image", "limits"})
    ]
    if "image" in sandbox and (problem := image_problem(sandbox["image"])):
        errors.append(ItemError(line, "sandbox.image", problem))
    for name, problem in limits_problems(sandbox.get("limits", {})):
        errors.append(ItemError(line, f"sandbox.limits.{name}".rstrip("."), problem))
    return errors


def _check_messages(line: int, raw: dict[str, Any]) -> list[ItemError]:
    if raw.get("messages") is None:
        return []
    if raw.get("prompt") is not None:
        return [ItemError(line, "messages", "give either prompt or messages, not both")]
    return [ItemError(line, name, problem) for name, problem in messages_problems(raw["messages"])]


def _check_kind_rules(line: int, kind: str, raw: dict[str, Any]) -> list[ItemError]:
    errors = _check_sandbox(line, raw.get("sandbox") or {})
    if kind in ("answer", "code"):
        errors += _check_messages(line, raw)
    if kind == "code":
        if "entry_point" in raw and not IDENTIFIER.match(raw["entry_point"]):
            errors.append(ItemError(line, "entry_point", "must be a Python identifier"))
        if raw.get("test_format") is not None and raw["test_format"] not in FORMATS:
            message = f"must be one of {', '.join(FORMATS)}; got {raw['test_format']!r}"
            errors.append(ItemError(line, "test_format", message))
        if raw.get("io_compare") is not None and raw["io_compare"] not in COMPARE_MODES:
            message = f"must be one of {', '.join(COMPARE_MODES)}; got {raw['io_compare']!r}"
            errors.append(ItemError(line, "io_compare", message))
        tolerance = raw.get("float_tolerance")
        if tolerance is not None and not 0 <= tolerance <= 1:
            errors.append(ItemError(line, "float_tolerance", "must be between 0 and 1"))
        errors += _check_files(line, "setup_files", raw.get("setup_files") or {})
        if not errors:
            errors += [ItemError(line, name, message) for name, message in item_test_problems(raw)]
        return errors
    if kind == "agent":
        if raw["max_steps"] < 1:
            errors.append(ItemError(line, "max_steps", "must be at least 1"))
        if "tools" in raw and (problem := tools_problem(raw["tools"])):
            errors.append(ItemError(line, "tools", problem))
        if "test_file" in raw and raw["test_file"] not in (raw.get("files") or {}):
            errors.append(ItemError(line, "test_file", "must name one of the item's files"))
        errors += _check_agent_messages(line, raw.get("messages") or [])
        if "mcp_servers" in raw:
            problems = mcp_servers_problems(raw["mcp_servers"], raw.get("files") or {})
            errors += [
                ItemError(line, f"mcp_servers.{name}".rstrip("."), message) for name, message in problems
            ]
        return errors + _check_files(line, "files", raw.get("files") or {})
    return errors


ROLES = ("system", "user", "assistant", "tool")


def _check_agent_messages(line: int, messages: list) -> list[ItemError]:
    """An agent item's `messages` (a demonstration conversation): objects with a known role."""
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            return [
                ItemError(line, f"messages.{index}", f"must be an object with a role ({', '.join(ROLES)})")
            ]
        if not isinstance(message.get("content", ""), str) and message.get("content") is not None:
            return [ItemError(line, f"messages.{index}.content", "must be a string")]
    return []


def derived_id(kind: str, data: dict[str, Any]) -> str:
    """A stable id from the content, so re-imports and splits agree without an explicit id."""
    digest = hashlib.sha256(canonical_json({"kind": kind, **data}).encode()).hexdigest()
    return f"{kind}-{digest[:16]}"


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def read_jsonl(
    lines: Iterable[str], preset: str = "auto"
) -> Iterator[tuple[ParsedItem | None, list[ItemError]]]:
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            raw = strict_json.loads(line)  # NaN, overflowing numbers, 10,000-deep nesting: refused
        except strict_json.JsonInputError as exc:
            where = f" at column {exc.colno}" if exc.colno is not None else ""
            yield None, [ItemError(number, None, f"{exc.reason}{where}")]
            continue
        yield validate_item(number, raw, preset)


CSV_COLUMNS = {"prompt", "reference", "id", "split"}


def read_csv(lines: Iterable[str]) -> Iterator[tuple[ParsedItem | None, list[ItemError]]]:
    """CSV holds `answer` items only: columns prompt, reference, and optional id and split."""
    reader = csv.DictReader(lines)
    header = reader.fieldnames or []
    missing = {"prompt", "reference"} - set(header)
    unknown = set(header) - CSV_COLUMNS
    if missing or unknown:
        problems = [ItemError(1, name, "required column is missing") for name in sorted(missing)]
        problems += [ItemError(1, name, "unknown column") for name in sorted(unknown)]
        yield None, problems
        return
    line_number = 1
    for row in reader:
        line_number = reader.line_num
        raw = {key: value for key, value in row.items() if value not in (None, "")}
        if None in row:
            yield None, [ItemError(line_number, None, "more values than columns")]
            continue
        yield validate_item(line_number, {"kind": "answer", **raw})


def read_items(
    stream: io.BufferedIOBase | Iterable[bytes], file_format: str, preset: str = "auto"
) -> Iterator[tuple[ParsedItem | None, list[ItemError]]]:
    """Decode a byte stream line by line; never holds the whole file in memory."""
    text = _decode_lines(stream)
    if file_format == "csv":
        return read_csv(text)
    return read_jsonl(text, preset)


def _decode_lines(stream: Iterable[bytes]) -> Iterator[str]:
    for number, raw_line in enumerate(stream, start=1):
        try:
            yield raw_line.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            raise FileFormatError(ItemError(number, None, f"not UTF-8 text ({exc.reason})")) from None


class FileFormatError(Exception):
    def __init__(self, error: ItemError) -> None:
        super().__init__(str(error))
        self.error = error


def guess_format(filename: str) -> str:
    return "csv" if filename.lower().endswith(".csv") else "jsonl"


# What an import's `format` may say: the file's syntax (jsonl, csv), or how its JSONL lines are
# read: auto (Flywheel's lines, and published lines recognised by their fields), flywheel (only
# Flywheel's own), or one published format for every line.
IMPORT_FORMATS = ("auto", "jsonl", "csv", "flywheel", *PRESETS)
LINE_PRESETS = ("auto", "flywheel", *PRESETS)


def resolve_format(choice: str | None, filename: str) -> tuple[str, str]:
    """(file format, line preset) for an import's `format` and the file's name.

    >>> resolve_format(None, "tasks.csv"), resolve_format("auto", "he.jsonl")
    (('csv', 'auto'), ('jsonl', 'auto'))
    >>> resolve_format("humaneval", "he.txt"), resolve_format("jsonl", "x.csv")
    (('jsonl', 'humaneval'), ('jsonl', 'auto'))
    """
    if choice in (None, "", "auto"):
        return guess_format(filename), "auto"
    if choice in ("jsonl", "csv"):
        return choice, "auto"
    return "jsonl", choice


def stable_split(external_id: str, *, seed: int, heldout_fraction: float) -> str:
    """The seeded, stable rule: an item's split depends only on its id and the seed.

    >>> stable_split("item-1", seed=0, heldout_fraction=0.0)
    'train'
    >>> stable_split("item-1", seed=0, heldout_fraction=1.0)
    'heldout'
    """
    digest = hashlib.sha256(f"{seed}:{external_id}".encode()).digest()
    position = int.from_bytes(digest[:8], "big") / 2**64
    return "heldout" if position < heldout_fraction else "train"


def item_line(item_id: str, kind: str, split: str, data: dict[str, Any]) -> str:
    """One exported JSONL line; importing it gives back the same item."""
    ordered = {"id": item_id, "kind": kind, "split": split}
    ordered.update({key: data[key] for key in KIND_FIELDS[kind] if key in data})
    if "metadata" in data:
        ordered["metadata"] = data["metadata"]
    return json.dumps(ordered, ensure_ascii=False) + "\n"

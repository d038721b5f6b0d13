"""The field's task files as they ship: HumanEval, MBPP, APPS-style and LiveCodeBench-style lines,
recognised by their fields and mapped onto Flywheel's code items, unchanged on disk.

Pure functions, no database. `to_code_item` turns one published line into the raw dict of a
Flywheel `code` item (then validated like any other line), with provenance in `metadata`
(`source`: the format, `task_id`: the original id, and the line's other fields). A problem is
reported with the published field's own name, so a user can find it in their file.

- `humaneval`: `task_id`, `prompt`, `canonical_solution`, `test`, `entry_point` → candidate tests
  (`check(candidate)`), the reference is `prompt + canonical_solution`.
- `mbpp`: original (`text`, `code`, `test_list`, `test_setup_code`, `challenge_test_list`) or
  sanitized (`prompt`, `code`, `test_imports`, `test_list`) → namespace tests; the prompt is the
  description and the tests, as the MBPP paper prompts (the tests name the function).
- `apps`: `question`, `solutions` (a JSON string or a list), `input_output` (a JSON string of
  `inputs` / `outputs`, with `fn_name` for call-based problems) or `inputs` / `outputs` directly,
  `starter_code` → io tests compared by whitespace-separated tokens (call-based: namespace asserts).
- `codecontests`: DeepMind's layout: `name`, `description`, `public_tests` / `private_tests` /
  `generated_tests` (each `{"input": [...], "output": [...]}`), `solutions` (`{"language": [...],
  "solution": [...]}`, the first Python 3 one is the reference), `time_limit` → io tests
  (whitespace-separated tokens), each with the problem's time limit.
- `livecodebench`: `question_content`, `public_test_cases` / `private_test_cases` (JSON strings of
  `{input, output, testtype}`), `starter_code`, `metadata` (a JSON string with `func_name`) →
  io tests (`stdin`) or namespace asserts on `Solution().func_name(...)` (`functional`).
"""

import ast
import json
from collections.abc import Callable
from typing import Any

PRESETS = ("humaneval", "mbpp", "apps", "codecontests", "livecodebench")
# A line without `kind` that holds one of these fields (or all of a tuple's) is read in that
# format ("auto"), so a published line that lacks a field is refused naming it.
SIGNATURE_FIELDS: dict[str, tuple[str | tuple[str, ...], ...]] = {
    "humaneval": ("canonical_solution", ("test", "entry_point")),
    "mbpp": ("test_list",),
    "livecodebench": ("question_content", "public_test_cases"),
    "codecontests": (("description", "public_tests"),),
    "apps": ("question", "input_output"),
}
TITLES = {
    "humaneval": "HumanEval",
    "mbpp": "MBPP",
    "apps": "APPS",
    "codecontests": "CodeContests",
    "livecodebench": "LiveCodeBench",
}


class LineError(ValueError):
    """A published line that cannot be mapped; `field` is the published field's name."""

    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def recognise_line(raw: dict[str, Any]) -> str | None:
    """The published format a line is in, from its fields; None for Flywheel's own lines.

    >>> recognise_line({"task_id": "HumanEval/0", "prompt": "def f():", "canonical_solution": "",
    ...     "test": "", "entry_point": "f"})
    'humaneval'
    >>> recognise_line({"text": "Add.", "code": "", "test_list": []})
    'mbpp'
    >>> recognise_line({"kind": "code", "prompt": "p", "tests": "assert 1"}) is None
    True
    """
    if "kind" in raw:
        return None
    for name, signatures in SIGNATURE_FIELDS.items():
        for signature in signatures:
            if all(field in raw for field in ((signature,) if isinstance(signature, str) else signature)):
                return name
    return None


# Where a Flywheel field's problem is found in each published layout.
FIELD_NAMES = {
    "humaneval": {"tests": "test", "reference_solution": "canonical_solution", "id": "task_id"},
    "mbpp": {"tests": "test_list", "reference_solution": "code", "id": "task_id", "prompt": "text"},
    "apps": {"io_tests": "input_output", "tests": "input_output", "prompt": "question", "id": "problem_id"},
    "codecontests": {"io_tests": "public_tests", "prompt": "description", "id": "name"},
    "livecodebench": {
        "io_tests": "public_test_cases",
        "tests": "public_test_cases",
        "prompt": "question_content",
        "id": "question_id",
    },
}


def published_field(preset: str, field: str | None) -> str | None:
    """The published name of a Flywheel field a mapped item's problem names."""
    if field is None:
        return None
    head, _, rest = field.partition(".")
    name = FIELD_NAMES[preset].get(head, head)
    return f"{name}.{rest}" if rest else name


def to_code_item(raw: dict[str, Any], preset: str) -> dict[str, Any]:
    """A published line as the raw dict of a Flywheel code item; LineError names what is wrong."""
    return MAPPERS[preset](raw)


def _text(raw: dict[str, Any], name: str) -> str:
    """A required string field, not blank."""
    value = raw.get(name)
    if value is None:
        raise LineError(name, "is required")
    if not isinstance(value, str):
        raise LineError(name, "must be a string")
    if not value.strip():
        raise LineError(name, "must not be empty")
    return value


def _optional_text(raw: dict[str, Any], name: str) -> str:
    """An optional string field; "" when it is absent."""
    value = raw.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise LineError(name, "must be a string")
    return value


def _strings(raw: dict[str, Any], name: str, *, required: bool = True) -> list[str]:
    value = raw.get(name)
    if value is None:
        if required:
            raise LineError(name, "is required")
        return []
    if not isinstance(value, list) or not all(isinstance(entry, str) for entry in value):
        raise LineError(name, "must be a list of strings")
    return value


def _task_id(raw: dict[str, Any], name: str) -> str | int | None:
    value = raw.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value) == "":
        raise LineError(name, "must be a non-empty string or integer")
    return value


def _provenance(raw: dict[str, Any], preset: str, id_field: str, used: set[str]) -> dict[str, Any]:
    """`source` and `task_id`, then the line's other fields (its own `source`, as CodeContests has,
    kept as `<format>_source`)."""
    extra = {
        (f"{preset}_{key}" if key in ("source", "task_id") else key): value
        for key, value in raw.items()
        if key not in used | {id_field, "split", "metadata"}
    }
    return {"source": preset, "task_id": raw.get(id_field), **extra}


def _with_common(item: dict[str, Any], raw: dict[str, Any], task_id: Any) -> dict[str, Any]:
    if task_id is not None:
        item["id"] = str(task_id)
    if "split" in raw:
        item["split"] = raw["split"]
    return item


def from_humaneval(raw: dict[str, Any]) -> dict[str, Any]:
    used = {"prompt", "canonical_solution", "test", "entry_point"}
    prompt = _text(raw, "prompt")
    solution = _text(raw, "canonical_solution")
    item = {
        "kind": "code",
        "prompt": prompt,
        "tests": _text(raw, "test"),
        "test_format": "candidate",
        "entry_point": _text(raw, "entry_point"),
        "reference_solution": prompt + solution,
        "metadata": _provenance(raw, "humaneval", "task_id", used),
    }
    return _with_common(item, raw, _task_id(raw, "task_id"))


def from_mbpp(raw: dict[str, Any]) -> dict[str, Any]:
    sanitized = "text" not in raw and "prompt" in raw
    description = _text(raw, "prompt" if sanitized else "text")
    tests = _strings(raw, "test_list")
    if not tests:
        raise LineError("test_list", "must hold at least one assert")
    setup = "\n".join(_strings(raw, "test_imports", required=False))
    if not sanitized:
        setup = _optional_text(raw, "test_setup_code")
    code = _text(raw, "code")
    used = {"text", "prompt", "code", "test_list", "test_setup_code", "test_imports"}
    item = {
        "kind": "code",
        "prompt": f"{description}\nYour code should pass these tests:\n\n" + "\n".join(tests),
        "tests": tests,
        "test_format": "namespace",
        "reference_solution": code,
        "metadata": _provenance(raw, "mbpp", "task_id", used),
    }
    if entry_point := _called_definition(code, tests):
        item["entry_point"] = entry_point
    if setup.strip():
        item["test_setup_code"] = setup
    return _with_common(item, raw, _task_id(raw, "task_id"))


def _called_definition(code: str, tests: list[str]) -> str | None:
    """The function of the reference that the tests call: MBPP names no entry point."""
    try:
        defined = [node.name for node in ast.parse(code).body if isinstance(node, ast.FunctionDef)]
        called = {
            node.func.id
            for node in ast.walk(ast.parse("\n".join(tests)))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        }
    except (SyntaxError, ValueError):
        return None
    return next((name for name in defined if name in called), None)


def _json_field(raw: dict[str, Any], name: str, kind: type) -> Any:
    """A field the format ships as a JSON string (or already decoded)."""
    value = raw.get(name)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise LineError(name, f"must be JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(value, kind):
        raise LineError(name, f"must be {'a JSON object' if kind is dict else 'a JSON list'}")
    return value


def _lines_text(value: Any, name: str) -> str:
    """An APPS input or output: a string, or a list of lines."""
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "\n".join(line.rstrip("\n") for line in value) + "\n"
    if not isinstance(value, str):
        raise LineError(name, "must be a string or a list of lines")
    return value


def from_apps(raw: dict[str, Any]) -> dict[str, Any]:
    question = _text(raw, "question")
    if "input_output" in raw:
        source, cases = "input_output", _json_field(raw, "input_output", dict)
    elif "inputs" in raw or "outputs" in raw:
        source, cases = "inputs", {"inputs": raw.get("inputs"), "outputs": raw.get("outputs")}
    else:
        raise LineError("input_output", "is required (or give inputs and outputs)")
    inputs, outputs = cases.get("inputs"), cases.get("outputs")
    where = source if source == "input_output" else None
    for name, value in (("inputs", inputs), ("outputs", outputs)):
        if not isinstance(value, list) or not value:
            raise LineError(f"{where}.{name}" if where else name, "must be a non-empty list")
    if len(inputs) != len(outputs):
        message = f"{len(inputs)} inputs but {len(outputs)} outputs"
        raise LineError(f"{where}.outputs" if where else "outputs", message)
    starter = _optional_text(raw, "starter_code")
    item: dict[str, Any] = {"kind": "code", "prompt": _with_starter(question, starter)}
    if fn_name := cases.get("fn_name"):
        callee = _callee(fn_name, starter, f"{where or 'input_output'}.fn_name")
        item |= {
            "tests": [
                _call_assert(callee, args, _unwrapped(out)) for args, out in zip(inputs, outputs, strict=True)
            ]
        }
        item |= {"test_format": "namespace", "entry_point": callee.split(".")[-1]}
    else:
        prefix = f"{where}." if where else ""
        item["io_tests"] = [
            {
                "input": _lines_text(given, f"{prefix}inputs.{index}"),
                "output": _lines_text(wanted, f"{prefix}outputs.{index}"),
            }
            for index, (given, wanted) in enumerate(zip(inputs, outputs, strict=True))
        ]
        item |= {"test_format": "io", "io_compare": "whitespace"}
    if solution := _first_solution(raw):
        item["reference_solution"] = solution
    used = {"question", "input_output", "inputs", "outputs", "solutions", "starter_code"}
    item["metadata"] = _provenance(raw, "apps", "problem_id", used)
    return _with_common(item, raw, _task_id(raw, "problem_id"))


CODECONTESTS_PYTHON3 = 3  # the `language` code of a Python 3 solution
CODECONTESTS_TESTS = ("public_tests", "private_tests", "generated_tests")


def from_codecontests(raw: dict[str, Any]) -> dict[str, Any]:
    description = _text(raw, "description")
    limit = _time_limit(raw.get("time_limit"))
    cases: list[dict[str, Any]] = []
    for name in CODECONTESTS_TESTS:
        cases += _contest_cases(raw, name, required=name == "public_tests")
    if not cases:
        raise LineError(
            "public_tests", "must hold at least one test (with private_tests and generated_tests)"
        )
    if limit is not None:
        cases = [case | {"time_limit": limit} for case in cases]
    item: dict[str, Any] = {
        "kind": "code",
        "prompt": description,
        "io_tests": cases,
        "test_format": "io",
        "io_compare": "whitespace",
    }
    if solution := _python3_solution(raw.get("solutions")):
        item["reference_solution"] = solution
    # The solutions are the bulk of a line, and the reference is kept; the rest is provenance.
    used = {"description", "solutions", "incorrect_solutions", *CODECONTESTS_TESTS}
    item["metadata"] = _provenance(raw, "codecontests", "name", used)
    return _with_common(item, raw, _task_id(raw, "name"))


def _contest_cases(raw: dict[str, Any], name: str, *, required: bool) -> list[dict[str, str]]:
    tests = raw.get(name)
    if tests is None and not required:
        return []
    if not isinstance(tests, dict):
        raise LineError(name, 'must be an object {"input": [...], "output": [...]}')
    inputs, outputs = _contest_strings(tests, name, "input"), _contest_strings(tests, name, "output")
    if len(inputs) != len(outputs):
        raise LineError(f"{name}.output", f"{len(inputs)} inputs but {len(outputs)} outputs")
    return [{"input": given, "output": wanted} for given, wanted in zip(inputs, outputs, strict=True)]


def _contest_strings(tests: dict[str, Any], name: str, key: str) -> list[str]:
    value = tests.get(key)
    if not isinstance(value, list) or not all(isinstance(entry, str) for entry in value):
        raise LineError(f"{name}.{key}", "must be a list of strings")
    return value


def _time_limit(value: Any) -> float | None:
    """CodeContests' `{"seconds": s, "nanos": n}`, in seconds (None when absent or unusable)."""
    if not isinstance(value, dict):
        return None
    parts = (value.get("seconds") or 0, value.get("nanos") or 0)
    if not all(isinstance(part, (int, float)) and not isinstance(part, bool) for part in parts):
        return None
    seconds = parts[0] + parts[1] / 1e9
    return float(seconds) if 0 < seconds <= 600 else None


def _python3_solution(solutions: Any) -> str | None:
    if not isinstance(solutions, dict):
        return None
    pairs = zip(solutions.get("language") or [], solutions.get("solution") or [], strict=False)
    return next((code for language, code in pairs if language == CODECONTESTS_PYTHON3), None)


def _unwrapped(output: Any) -> Any:
    """APPS wraps a call-based problem's return value in a one-element list."""
    return output[0] if isinstance(output, list) and len(output) == 1 else output


def _first_solution(raw: dict[str, Any]) -> str | None:
    if raw.get("solutions") in (None, ""):
        return None
    solutions = _json_field(raw, "solutions", list)
    if not all(isinstance(solution, str) for solution in solutions):
        raise LineError("solutions", "must be a list of strings")
    return solutions[0] if solutions else None


def _with_starter(question: str, starter: str) -> str:
    if not starter.strip():
        return question
    return f"{question}\n\nStart from this code:\n```python\n{starter.rstrip()}\n```\n"


def _callee(name: Any, starter: str, field: str) -> str:
    if not isinstance(name, str) or not name.isidentifier():
        raise LineError(field, "must be a Python identifier")
    return f"Solution().{name}" if "class Solution" in starter else name


def _call_assert(callee: str, args: Any, expected: Any) -> str:
    arguments = ", ".join(repr(arg) for arg in args) if isinstance(args, list) else repr(args)
    return f"assert {callee}({arguments}) == {expected!r}"


def from_livecodebench(raw: dict[str, Any]) -> dict[str, Any]:
    question = _text(raw, "question_content")
    cases = _lcb_cases(raw, "public_test_cases")
    if raw.get("private_test_cases") not in (None, "", []):
        cases += _lcb_cases(raw, "private_test_cases")
    if not cases:
        raise LineError("public_test_cases", "must hold at least one test case")
    types = {case["testtype"] for _, case in cases}
    if len(types) > 1:
        raise LineError("public_test_cases", "mixes stdin and functional test cases; give one kind")
    starter = _optional_text(raw, "starter_code")
    item: dict[str, Any] = {"kind": "code", "prompt": _with_starter(question, starter)}
    metadata = _json_field(raw, "metadata", dict) if raw.get("metadata") not in (None, "") else {}
    if types == {"functional"}:
        callee = _callee(metadata.get("func_name"), starter, "metadata.func_name")
        item["tests"] = [_lcb_assert(callee, case, where) for where, case in cases]
        item |= {"test_format": "namespace", "entry_point": callee.split(".")[-1]}
    else:
        item["io_tests"] = [{"input": case["input"], "output": case["output"]} for _, case in cases]
        item |= {"test_format": "io", "io_compare": "whitespace"}
    used = {"question_content", "public_test_cases", "private_test_cases", "starter_code", "metadata"}
    item["metadata"] = _provenance(raw, "livecodebench", "question_id", used) | {
        key: value for key, value in metadata.items() if key not in ("source", "task_id")
    }
    return _with_common(item, raw, _task_id(raw, "question_id"))


def _lcb_cases(raw: dict[str, Any], name: str) -> list[tuple[str, dict[str, str]]]:
    value = raw.get(name)
    if isinstance(value, str) and value and value.lstrip()[:1] not in "[{":
        raise LineError(name, "must be JSON (LiveCodeBench's compressed release: decode it to JSON first)")
    cases = _json_field(raw, name, list)
    out = []
    for index, case in enumerate(cases):
        where = f"{name}.{index}"
        if not isinstance(case, dict):
            raise LineError(where, "must be an object {input, output, testtype}")
        for key in ("input", "output"):
            if not isinstance(case.get(key), str):
                raise LineError(f"{where}.{key}", "must be a string")
        if case.get("testtype", "stdin") not in ("stdin", "functional"):
            raise LineError(f"{where}.testtype", "must be stdin or functional")
        out.append((where, {**case, "testtype": case.get("testtype", "stdin")}))
    return out


def _lcb_assert(callee: str, case: dict[str, str], where: str) -> str:
    """A functional case: one JSON value per input line, the output a JSON value."""
    try:
        args = [json.loads(line) for line in case["input"].split("\n") if line.strip()]
    except json.JSONDecodeError:
        raise LineError(f"{where}.input", "must be one JSON value per line (functional tests)") from None
    try:
        expected = json.loads(case["output"])
    except json.JSONDecodeError:
        raise LineError(f"{where}.output", "must be a JSON value (functional tests)") from None
    return _call_assert(callee, args, expected)


MAPPERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "humaneval": from_humaneval,
    "mbpp": from_mbpp,
    "apps": from_apps,
    "codecontests": from_codecontests,
    "livecodebench": from_livecodebench,
}

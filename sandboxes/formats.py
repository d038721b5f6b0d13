"""The test formats a code item's tests come in, how each is recognised, and which tests each holds.

Pure functions over source text (no sandbox, no Django), shared by the importer (which refuses an
item whose tests hold no test in any format), the graders and the sandbox host (which plans the
tests a run must report). The fork server (`runtime/server.py`) splits the same source the same way.

- `flywheel`: the tests import the solution (`from solution import f`); top-level `test_*`
  functions, else each top-level statement holding an `assert`, is a test.
- `candidate` (HumanEval and its descendants): the tests define `check(candidate)`, and may call
  it themselves (`check(f)`); the harness calls it with the solution's `entry_point`. Each
  statement of check's body that holds an assert is a test named "check line N".
- `namespace` (MBPP and its descendants): bare asserts that call the function by name, run with
  the solution's definitions in scope, after the item's optional `test_setup_code`.
- `io` (competitive programming): `io_tests`, a list of {"input", "output"}; the solution runs as
  a program once per case, its stdout compared with `io_compare` (exact, whitespace or float).
- `pytest`: test files in `setup_files` (`test_*.py`, `*_test.py`) run by pytest, where the
  sandbox's image has it.
"""

import ast
import functools
import math
import posixpath
import re
from collections.abc import Mapping

FORMATS = ("flywheel", "candidate", "namespace", "io", "pytest")
COMPARE_MODES = ("exact", "whitespace", "float")
DEFAULT_FLOAT_TOLERANCE = 1e-6
PYTEST_FILE = re.compile(r"(^|/)(test_[^/]*|[^/]*_test)\.py$")
# What the workspace holds at a test file's path when the harness keeps the tests (run_tests'
# `source`, run_pytest's `tests`): their expected values stay out of the solution's reach.
TESTS_PLACEHOLDER = "# The tests run from the harness's memory: this file is only their placeholder.\n"
IMPORTS_SOLUTION = re.compile(r"^\s*(from\s+solution\s+import|import\s+solution\b)", re.MULTILINE)


class TestFormatError(ValueError):
    """The tests hold no test in the format asked for (or in any); the message says why."""

    __test__ = False


def parse_tests(source: str, path: str) -> ast.Module:
    try:
        return ast.parse(source, path)
    except SyntaxError as exc:
        raise TestFormatError(f"{path} line {exc.lineno}: the tests do not parse: {exc.msg}") from None
    except ValueError as exc:  # NUL bytes
        raise TestFormatError(f"{path}: the tests do not parse: {exc}") from None


def holds_assert(node: ast.AST) -> bool:
    """An assert in the statement, not counting those in functions or classes it defines."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.Assert):
            return True
        for child in ast.iter_child_nodes(current):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                stack.append(child)
    return False


def names_used(node: ast.AST) -> set[str]:
    return {child.id for child in ast.walk(node) if isinstance(child, ast.Name)}


def check_function(tree: ast.Module) -> ast.FunctionDef | None:
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "check"]
    return found[-1] if found else None


def check_is_whole(check: ast.FunctionDef) -> bool:
    """A check whose body returns, yields or rebinds outer names runs as one test, never split."""
    stack: list[ast.AST] = list(check.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom, ast.Nonlocal, ast.Global, ast.Await)):
            return True
        stack.extend(
            child
            for child in ast.iter_child_nodes(node)
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))
        )
    return False


def candidate_tests(check: ast.FunctionDef) -> list[ast.stmt]:
    """The statements of check's body that are tests: those holding an assert, else those that
    call the candidate; [] means the whole check is one test."""
    if check_is_whole(check) or not check.args.args:
        return []
    asserting = [statement for statement in check.body if holds_assert(statement)]
    if asserting:
        return asserting
    parameter = check.args.args[0].arg
    return [statement for statement in check.body if parameter in names_used(statement)]


def recognise(
    tests: str | None, *, io_tests: object = None, setup_files: Mapping | None = None
) -> str | None:
    """The format the tests are written in, or None when they hold no test in any.

    >>> recognise("from solution import f\\nassert f(1) == 2\\n")
    'flywheel'
    >>> recognise("def check(candidate):\\n    assert candidate(1) == 2\\n\\ncheck(f)\\n")
    'candidate'
    >>> recognise("assert f(1) == 2\\n")
    'namespace'
    >>> recognise(None, io_tests=[{"input": "1\\n", "output": "2\\n"}])
    'io'
    >>> recognise("", setup_files={"tests/test_app.py": "def test_a():\\n    assert True\\n"})
    'pytest'
    >>> recognise("x = 1\\n") is None
    True
    """
    if isinstance(io_tests, list) and io_tests:
        return "io"
    if isinstance(tests, str) and tests.strip():
        try:
            tree = ast.parse(tests)
        except (SyntaxError, ValueError):
            return None
        check = check_function(tree)
        if check is not None and not IMPORTS_SOLUTION.search(tests):
            return "candidate"
        if any(holds_assert(node) for node in tree.body) or top_level_test_functions(tree):
            return "flywheel" if IMPORTS_SOLUTION.search(tests) else "namespace"
        if check is not None:
            return "candidate"
    if pytest_files(setup_files or {}):
        return "pytest"
    return None


def top_level_test_functions(tree: ast.Module) -> list[str]:
    names = [
        node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test")
    ]
    return list(dict.fromkeys(names))


def pytest_files(files: Mapping) -> dict[str, str]:
    return {
        path: content
        for path, content in files.items()
        if isinstance(content, str) and PYTEST_FILE.search(posixpath.normpath(path))
    }


@functools.lru_cache(maxsize=512)  # a task's tests are planned once, not on every run
def plan_tests(source: str, path: str, style: str | None = None) -> tuple[str, tuple[str, ...]]:
    """(style, names of the tests a run must report) for a Python test source.

    Styles: "functions" (top-level test_* functions), "asserts" (each top-level statement holding
    an assert, "line N"), "candidate" ("check line N" per test statement of check, or "check").
    None: functions, else asserts.

    >>> plan_tests("def test_a():\\n    assert 1\\n", "t.py")
    ('functions', ('test_a',))
    >>> plan_tests("x = 1\\nassert x == 1\\nfor y in [1]:\\n    assert y\\n", "t.py")
    ('asserts', ('line 2', 'line 3'))
    >>> check = "def check(c):\\n    n = 2\\n    assert c(n) == 4\\n    assert c(3) == 9\\n"
    >>> plan_tests(check, "t.py", "candidate")
    ('candidate', ('check line 3', 'check line 4'))
    """
    tree = parse_tests(source, path)
    if style == "candidate":
        return "candidate", candidate_plan(tree, path)
    if style in (None, "functions") and (functions := top_level_test_functions(tree)):
        return "functions", tuple(functions)
    if style == "functions":
        raise TestFormatError(f"{path}: holds no top-level test_* function")
    return "asserts", tuple(f"line {node.lineno}" for node in tree.body if holds_assert(node))


def candidate_plan(tree: ast.Module, path: str) -> tuple[str, ...]:
    check = check_function(tree)
    if check is None:
        raise TestFormatError(f"{path}: candidate-style tests must define check(candidate)")
    if not check.args.args:
        raise TestFormatError(f"{path} line {check.lineno}: check must take the candidate as its argument")
    statements = candidate_tests(check)
    if statements:
        return tuple(f"check line {statement.lineno}" for statement in statements)
    parameter = check.args.args[0].arg
    if not check_is_whole(check) and not any(map(holds_assert, check.body)):
        if not any(parameter in names_used(statement) for statement in check.body):
            raise TestFormatError(
                f"{path} line {check.lineno}: check holds no assert and never calls {parameter}"
            )
    return ("check",)


# -- standard input / output ----------------------------------------------------------------------


def io_cases_problems(cases: object) -> list[tuple[str, str]]:
    """What is wrong with an item's io_tests, as (field, message) pairs.

    >>> io_cases_problems([{"input": "1", "output": "2"}, {"input": 3}])
    [('io_tests.1.input', 'must be a string'), ('io_tests.1.output', 'is required')]
    """
    if not isinstance(cases, list) or not cases:
        return [("io_tests", 'must be a non-empty list of {"input": ..., "output": ...} cases')]
    problems = []
    for index, case in enumerate(cases):
        where = f"io_tests.{index}"
        if not isinstance(case, dict):
            problems.append((where, 'must be an object {"input": ..., "output": ...}'))
            continue
        for name in sorted(set(case) - {"input", "output", "time_limit", "name"}):
            problems.append((f"{where}.{name}", "unknown field (known: input, output, time_limit, name)"))
        for name in ("input", "output"):
            if name not in case:
                problems.append((f"{where}.{name}", "is required"))
            elif not isinstance(case[name], str):
                problems.append((f"{where}.{name}", "must be a string"))
        limit = case.get("time_limit")
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 < limit <= 600
        ):
            problems.append((f"{where}.time_limit", "must be a number of seconds between 0 and 600"))
    return problems


def outputs_match(
    actual: str, expected: str, mode: str = "exact", tolerance: float = DEFAULT_FLOAT_TOLERANCE
) -> bool:
    """Whether a program's stdout matches the expected output.

    exact: the same text, line endings and trailing newlines aside; whitespace: the same
    whitespace-separated tokens; float: the same tokens, numbers within `tolerance` (absolute or
    relative).

    >>> outputs_match("3\\n", "3"), outputs_match("1  2\\n", "1 2")
    (True, False)
    >>> outputs_match("1  2", "1 2", "whitespace")
    True
    >>> outputs_match("0.3333333", "0.333333333", "float"), outputs_match("0.34", "0.33", "float")
    (True, False)
    """
    if mode == "exact":
        return normal_lines(actual) == normal_lines(expected)
    got, want = actual.split(), expected.split()
    if mode == "whitespace" or len(got) != len(want):
        return got == want
    return all(tokens_close(a, b, tolerance) for a, b in zip(got, want, strict=True))


def normal_lines(text: str) -> str:
    return text.replace("\r\n", "\n").rstrip("\n")


def tokens_close(actual: str, expected: str, tolerance: float) -> bool:
    if actual == expected:
        return True
    try:
        a, b = float(actual), float(expected)
    except ValueError:
        return False
    if math.isnan(a) or math.isnan(b):
        return False
    return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance)


# -- pytest -----------------------------------------------------------------------------------------


def pytest_plan(files: Mapping) -> tuple[str, ...]:
    """The tests pytest must report, "path::test" and "path::Class::test", read from the files.

    >>> source = "def test_x():\\n    pass\\nclass TestY:\\n    def test_z(self):\\n        pass\\n"
    >>> pytest_plan({"tests/test_a.py": source})
    ('tests/test_a.py::test_x', 'tests/test_a.py::TestY::test_z')
    """
    names = []
    for path, source in sorted(pytest_files(files).items()):
        tree = parse_tests(source, path)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                names.append(f"{path}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                names += [
                    f"{path}::{node.name}::{method.name}"
                    for method in node.body
                    if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and method.name.startswith("test")
                ]
    return tuple(dict.fromkeys(names))


# -- what an item says --------------------------------------------------------------------------------


def item_format(item: Mapping) -> str | None:
    """The item's format: what it says (`test_format`), else what its tests are recognised as."""
    declared = item.get("test_format")
    if declared:
        return declared
    return recognise(item.get("tests"), io_tests=item.get("io_tests"), setup_files=item.get("setup_files"))


def item_test_problems(item: Mapping) -> list[tuple[str, str]]:
    """Why a code item's tests hold no test in their format, as (field, message); [] when they do.

    >>> item_test_problems({"tests": "x = 1\\n", "entry_point": "f"})[0][0]
    'tests'
    >>> tests = "def check(candidate):\\n    assert candidate(1)\\n"
    >>> item_test_problems({"tests": tests, "entry_point": "f"})
    []
    """
    declared = item.get("test_format")
    test_format = item_format(item)
    if test_format is None:
        return [
            (
                "tests",
                "holds no test in any format: no test_* function or assert (Flywheel's own, or "
                "namespace style), no check(candidate) (candidate style), no io_tests, and no "
                "test_*.py in setup_files (pytest)",
            )
        ]
    tests = item.get("tests")
    if test_format == "io":
        return io_cases_problems(item.get("io_tests"))
    if test_format == "pytest":
        files = item.get("setup_files") or {}
        try:
            plan = pytest_plan(files)
        except TestFormatError as exc:
            return [("setup_files", str(exc))]
        return [] if plan else [("setup_files", "holds no test_*.py file with a test function for pytest")]
    if not isinstance(tests, str) or not tests.strip():
        return [("tests", f"is required for {test_format} tests")]
    style = "candidate" if test_format == "candidate" else None
    try:
        _, names = plan_tests(tests, "tests", style)
    except TestFormatError as exc:
        return [("tests", str(exc).removeprefix("tests").lstrip(": "))]
    if test_format == "candidate" and not item.get("entry_point"):
        return [("entry_point", "is required for candidate-style tests: check() is called with it")]
    if not names:
        what = "no test_* function and no assert" if declared != "candidate" else "no test"
        return [("tests", f"hold {what} in the {test_format} format")]
    return []

"""Tests the host decides: the asserts of a test source that compare a call's result with a literal.

The sandbox evaluates only the call. Each rewritable `assert <expr> == <literal>` (also `!=`, `is`
and `is not` None/True/False, bare `assert <expr>` and `assert not <expr>`) is sent to the sandbox
as `assert __flywheel_value__(i, (<expr>))`: the harness serialises the result to plain data
(numbers, strings, bytes, lists, tuples, sets, dicts, None, bools, each of exactly its built-in
type) and reports it, and the host decodes it into values of its own and compares them here with the
expected literal, which never enters the sandbox. No object the solution made takes part in a
comparison, and a forged "passed" record means nothing: the host reads values, never verdicts, for
these tests. A test is decided here only when every assert in it is rewritable and a direct
statement of the test; the others ("unrewritable") keep the in-sandbox harness's verdict.

Pure functions over source text (no sandbox, no Django); line numbers are kept, so the tests keep
their names ("line N", "check line N", test_* functions).
"""

import ast
import dataclasses
import functools
import json
import math
from collections.abc import Mapping, Sequence

from sandboxes.formats import candidate_tests, check_function, holds_assert
from sandboxes.interface import Outcome, TestCaseResult

VALUE_NAME = "__flywheel_value__"
SINGLETONS = (None, True, False)
MAX_DEPTH = 100


class ValueRecordError(ValueError):
    """A value record the host cannot decode into plain data."""


@dataclasses.dataclass(frozen=True)
class ValueCheck:
    index: int
    op: str  # "==", "!=", "is", "is not", "truthy", "falsy"
    expected: object  # plain data, from the test's literal
    source: str  # the assert as written, for messages
    line: int = 0

    def holds(self, actual: object) -> bool:
        """Whether the decoded `actual` satisfies the assert (host values on both sides).

        >>> ValueCheck(0, "==", 3, "").holds(3), ValueCheck(0, "is", None, "").holds(0)
        (True, False)
        """
        if self.op == "==":
            return bool(actual == self.expected)
        if self.op == "!=":
            return bool(actual != self.expected)
        if self.op == "is":
            return actual is self.expected
        if self.op == "is not":
            return actual is not self.expected
        if self.op in ("abs<", "abs<=", "isclose"):
            return close_enough(self.op, actual, self.expected)
        return bool(actual) == (self.op == "truthy")


def close_enough(op: str, actual: object, expected: object) -> bool:
    """A number within the tolerance the test wrote (a non-number never is).

    >>> close_enough("abs<", 0.5000001, (0.5, 1e-6)), close_enough("isclose", "2", (2.0, 1e-9, 0.0))
    (True, False)
    """
    if not (type(actual) is int or type(actual) is float) or not isinstance(expected, tuple):
        return False
    try:
        if op == "isclose":
            target, rel_tol, abs_tol = expected
            return math.isclose(actual, target, rel_tol=rel_tol, abs_tol=abs_tol)
        target, tolerance = expected
        difference = abs(actual - target)
        return difference < tolerance if op == "abs<" else difference <= tolerance
    except (TypeError, ValueError, OverflowError):
        return False


@dataclasses.dataclass(frozen=True)
class ValuePlan:
    source: str  # the tests as sent to the sandbox
    checks: tuple[ValueCheck, ...]
    units: Mapping[str, tuple[int, ...]]  # test name -> indices of its checks (host-decided tests)
    unrewritable: tuple[str, ...]  # tests whose verdict stays the in-sandbox harness's
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict)  # pytest: path -> tests sent


def is_literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def rewritable(node: ast.Assert) -> tuple[ast.expr, str, object] | None:
    """(the expression the sandbox evaluates, the comparison, the expected value), or None.

    >>> rewritable(ast.parse("assert f(1) == [1, 2]").body[0])[1:]
    ('==', [1, 2])
    >>> rewritable(ast.parse("assert 3 != f(1)").body[0])[1:]
    ('!=', 3)
    >>> rewritable(ast.parse("assert f(1) < 3").body[0]) is None
    True
    """
    test = node.test
    close = closeness(test)
    if close is not None:
        return close
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return test.operand, "falsy", None
    if not isinstance(test, ast.Compare):
        return test, "truthy", None
    if len(test.ops) != 1:
        return None
    left, right, op = test.left, test.comparators[0], test.ops[0]
    if isinstance(op, (ast.Eq, ast.NotEq)):
        if is_literal(right):
            actual, expected = left, right
        elif is_literal(left):
            actual, expected = right, left
        else:
            return None  # both sides computed: the reference would have to run (not here)
        return actual, "==" if isinstance(op, ast.Eq) else "!=", ast.literal_eval(expected)
    if isinstance(op, (ast.Is, ast.IsNot)) and isinstance(right, ast.Constant):
        if any(right.value is singleton for singleton in SINGLETONS):
            return left, "is" if isinstance(op, ast.Is) else "is not", right.value
    return None


def closeness(test: ast.expr) -> tuple[ast.expr, str, object] | None:
    """`abs(<expr> - y) < tol` (or `<=`) and `math.isclose(<expr>, y, rel_tol=..., abs_tol=...)`,
    y and the tolerances literals: the float comparisons the tests spell out.

    >>> closeness(ast.parse("abs(f(1) - 0.5) < 1e-6", mode="eval").body)[1:]
    ('abs<', (0.5, 1e-06))
    >>> closeness(ast.parse("math.isclose(f(1), 2.0, rel_tol=1e-3)", mode="eval").body)[1:]
    ('isclose', (2.0, 0.001, 0.0))
    """
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.Lt, ast.LtE))
        and is_literal(test.comparators[0])
        and isinstance(test.left, ast.Call)
        and isinstance(test.left.func, ast.Name)
        and test.left.func.id == "abs"
        and len(test.left.args) == 1
        and not test.left.keywords
        and isinstance(test.left.args[0], ast.BinOp)
        and isinstance(test.left.args[0].op, ast.Sub)
        and is_literal(test.left.args[0].right)
        and not is_literal(test.left.args[0].left)
    ):
        op = "abs<" if isinstance(test.ops[0], ast.Lt) else "abs<="
        expected: tuple[object, ...] = (
            ast.literal_eval(test.left.args[0].right),
            ast.literal_eval(test.comparators[0]),
        )
        return test.left.args[0].left, op, expected
    if (
        isinstance(test, ast.Call)
        and isinstance(test.func, ast.Attribute)
        and isinstance(test.func.value, ast.Name)
        and (test.func.value.id, test.func.attr) == ("math", "isclose")
        and len(test.args) == 2
        and is_literal(test.args[1])
        and not is_literal(test.args[0])
        and all(k.arg in ("rel_tol", "abs_tol") and is_literal(k.value) for k in test.keywords)
    ):
        options = {k.arg: ast.literal_eval(k.value) for k in test.keywords}
        expected = (ast.literal_eval(test.args[1]), options.get("rel_tol", 1e-9), options.get("abs_tol", 0.0))
        return test.args[0], "isclose", expected
    return None


def compares_inside(node: ast.AST) -> bool:
    """An expression that compares by itself (`==`, `and`/`or`, an explicit `x.__eq__(y)`): the
    sandbox would decide that comparison with the solution's objects, so the host cannot take it.

    >>> compares_inside(ast.parse("f(1) == 2 or f(1) == 3")), compares_inside(ast.parse("f([1, 2])"))
    (True, False)
    """
    for child in ast.walk(node):
        if isinstance(child, (ast.Compare, ast.BoolOp)):
            return True
        if isinstance(child, ast.Attribute) and child.attr.startswith("__"):
            return True
    return False


def unit_asserts(statements: Sequence[ast.stmt]) -> list[ast.Assert] | None:
    """The test's asserts when each is a direct, rewritable statement of it; None otherwise."""
    direct = [statement for statement in statements if isinstance(statement, ast.Assert)]
    everywhere = [
        node for statement in statements for node in ast.walk(statement) if isinstance(node, ast.Assert)
    ]
    if not direct or len(everywhere) != len(direct):
        return None
    for node in direct:
        found = rewritable(node)
        if found is None or compares_inside(found[0]):
            return None
    return direct


def units_of(tree: ast.Module, style: str, names: Sequence[str]) -> dict[str, list[ast.stmt]]:
    """Each test's statements, by the names plan_tests gives them."""
    if style == "functions":
        functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
        return {name: functions[name].body for name in names if name in functions}
    if style == "asserts":
        return {f"line {node.lineno}": [node] for node in tree.body if holds_assert(node)}
    check = check_function(tree)
    if check is None:
        return {}
    return {f"check line {statement.lineno}": [statement] for statement in candidate_tests(check)}


@functools.lru_cache(maxsize=512)  # an item's tests are planned once, not on every run
def value_plan(source: str, path: str, style: str, names: tuple[str, ...]) -> ValuePlan:
    """The tests with each host-decidable assert replaced by a value report (see the module).

    >>> plan = value_plan("from solution import f\\nassert f(1) == 2\\nassert f(2) < 3\\n", "t.py", "asserts",
    ...                   ("line 2", "line 3"))
    >>> plan.source.splitlines()[1], dict(plan.units), plan.unrewritable
    ('assert __flywheel_value__(0, (f(1)))', {'line 2': (0,)}, ('line 3',))
    """
    unchanged = ValuePlan(source, (), {}, tuple(names))
    try:
        tree = ast.parse(source, path)
    except (SyntaxError, ValueError):
        return unchanged
    units = units_of(tree, style, names)
    checks: list[ValueCheck] = []
    decided: dict[str, tuple[int, ...]] = {}
    edits: list[tuple[ast.Assert, ast.expr, int]] = []
    for name in names:
        asserts = unit_asserts(units.get(name, []))
        if asserts is None:
            continue
        indices = []
        for node in asserts:
            actual, op, expected = rewritable(node)  # type: ignore[misc]
            index = len(checks)
            written = ast.get_source_segment(source, node) or ast.unparse(node)
            checks.append(ValueCheck(index, op, expected, written, node.lineno))
            edits.append((node, actual, index))
            indices.append(index)
        decided[name] = tuple(indices)
    if not decided:
        return unchanged
    rewritten = replaced(source, edits)
    try:
        ast.parse(rewritten, path)
    except (SyntaxError, ValueError):
        return unchanged
    return ValuePlan(rewritten, tuple(checks), decided, tuple(name for name in names if name not in decided))


def pytest_units(tree: ast.Module, path: str) -> dict[str, list[ast.stmt]]:
    """The statements of each plain pytest test (named as pytest_plan names it) the host can decide:
    an undecorated `test*` function without parameters, or such a method (`self` only) of an
    undecorated `Test*` class. Fixtures, parametrised tests and names defined twice stay the
    sandbox's (a test pytest runs more than once, or with values it injects, has no one value).

    >>> tree = ast.parse("def test_a():\\n    pass\\nclass TestB:\\n    def test_c(self):\\n        pass\\n"
    ...                  "def test_d(tmp_path):\\n    pass\\n")
    >>> sorted(pytest_units(tree, "t.py"))
    ['t.py::TestB::test_c', 't.py::test_a']
    """
    units: dict[str, list[ast.stmt]] = {}
    seen: set[str] = set()
    twice: set[str] = set()

    def take(name: str, function: ast.FunctionDef, parameters: int) -> None:
        (twice if name in seen else seen).add(name)
        arguments = function.args
        if (
            function.decorator_list
            or len(arguments.args) != parameters
            or arguments.posonlyargs
            or arguments.kwonlyargs
            or arguments.vararg
            or arguments.kwarg
        ):
            return
        units[name] = function.body

    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            take(f"{path}::{node.name}", node, 0)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for method in node.body:
                if isinstance(method, ast.FunctionDef) and method.name.startswith("test"):
                    name = f"{path}::{node.name}::{method.name}"
                    if not node.decorator_list:
                        take(name, method, 1)
                    else:
                        seen.add(name)
        elif isinstance(node, (ast.AsyncFunctionDef, ast.ClassDef)):
            seen.add(f"{path}::{node.name}")
    return {name: body for name, body in units.items() if name not in twice}


@functools.lru_cache(maxsize=256)  # an item's test files are planned once, not on every run
def pytest_value_plan(files: tuple[tuple[str, str], ...], names: tuple[str, ...]) -> ValuePlan:
    """pytest test files (path, source) with each host-decidable test's asserts replaced by value
    reports, as value_plan does for one source; `sources` holds the files as the sandbox gets them.

    >>> source = "from solution import f\\ndef test_x():\\n    assert f(1) == 2\\n"
    >>> source += "def test_y():\\n    assert f(2) < 3\\n"
    >>> plan = pytest_value_plan((("test_a.py", source),), ("test_a.py::test_x", "test_a.py::test_y"))
    >>> plan.sources["test_a.py"].splitlines()[2], dict(plan.units), plan.unrewritable
    ('    assert __flywheel_value__(0, (f(1)))', {'test_a.py::test_x': (0,)}, ('test_a.py::test_y',))
    """
    checks: list[ValueCheck] = []
    decided_units: dict[str, tuple[int, ...]] = {}
    sources: dict[str, str] = {}
    for path, source in files:
        sources[path] = source
        try:
            tree = ast.parse(source, path)
        except (SyntaxError, ValueError):
            continue  # pytest reports the file's error; the sandbox decides its tests (they fail)
        units = pytest_units(tree, path)
        file_checks: list[ValueCheck] = []
        file_units: dict[str, tuple[int, ...]] = {}
        edits: list[tuple[ast.Assert, ast.expr, int]] = []
        for name, body in units.items():
            asserts = unit_asserts(body) if name in names else None
            if asserts is None:
                continue
            indices = []
            for node in asserts:
                actual, op, expected = rewritable(node)  # type: ignore[misc]
                index = len(checks) + len(file_checks)
                written = ast.get_source_segment(source, node) or ast.unparse(node)
                file_checks.append(ValueCheck(index, op, expected, written, node.lineno))
                edits.append((node, actual, index))
                indices.append(index)
            file_units[name] = tuple(indices)
        if not edits:
            continue
        rewritten = replaced(source, edits)
        try:
            ast.parse(rewritten, path)
        except (SyntaxError, ValueError):
            continue
        sources[path] = rewritten
        checks += file_checks
        decided_units |= file_units
    return ValuePlan(
        "",
        tuple(checks),
        decided_units,
        tuple(name for name in names if name not in decided_units),
        sources,
    )


def replaced(source: str, edits: list[tuple[ast.Assert, ast.expr, int]]) -> str:
    """Each assert's text replaced by its value report, padded so that every line keeps its number."""
    data = source.encode()
    starts = [0] + [position + 1 for position, byte in enumerate(data) if byte == 0x0A]
    for node, actual, index in sorted(
        edits, key=lambda edit: (edit[0].lineno, edit[0].col_offset), reverse=True
    ):
        expression = ast.get_source_segment(source, actual) or ast.unparse(actual)
        padding = "\n" * ((node.end_lineno or node.lineno) - node.lineno - expression.count("\n"))
        text = f"assert {VALUE_NAME}({index}, ({expression}{padding}))".encode()
        begin = starts[node.lineno - 1] + node.col_offset
        end = starts[(node.end_lineno or node.lineno) - 1] + (node.end_col_offset or 0)
        data = data[:begin] + text + data[end:]
    return data.decode()


# -- the values reported -------------------------------------------------------------------------------

SEQUENCES = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}


def decode(raw: object, depth: int = 0) -> object:
    """A value record's plain data as the host's own objects; ValueRecordError when malformed.

    >>> decode({"tuple": [1, {"list": ["a"]}, None]})
    (1, ['a'], None)
    >>> decode({"dict": [[{"frozenset": [1]}, True]]})
    {frozenset({1}): True}
    """
    if depth > MAX_DEPTH:
        raise ValueRecordError("nested too deep")
    if raw is None or type(raw) in (bool, int, float, str):
        return raw
    if type(raw) is dict and len(raw) == 1:
        ((tag, body),) = raw.items()
        try:
            if tag in SEQUENCES and type(body) is list:
                return SEQUENCES[tag](decode(element, depth + 1) for element in body)
            if tag == "dict" and type(body) is list:
                return {
                    decode(pair[0], depth + 1): decode(pair[1], depth + 1)
                    for pair in body
                    if type(pair) is list and len(pair) == 2 or fail("a dict entry is not a pair")
                }
            if tag == "bytes" and type(body) is str:
                return bytes.fromhex(body)
        except TypeError as exc:  # an unhashable set element or dict key
            raise ValueRecordError(str(exc)) from None
    raise ValueRecordError(f"not plain data: {json.dumps(raw)[:200]}")


def fail(message: str) -> bool:
    raise ValueRecordError(message)


def safe_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 1000 else text[:1000] + "…"


def reported_values(report: str, nonce: str) -> dict[int, dict]:
    """The first value record of this run for each check index (a record the code forged can only
    carry a value it computed, as returning it would)."""
    found: dict[int, dict] = {}
    for line in report.splitlines():
        if '"value"' not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict) or event.get("nonce") != nonce or event.get("event") != "value":
            continue
        index = event.get("index")
        if type(index) is int and index not in found:
            found[index] = event
    return found


def judged(check: ValueCheck, event: dict | None) -> tuple[bool, str, str | None]:
    """(holds, message, actual as text) for one check and its value record (None: none came)."""
    if event is None:
        return False, f"line {check.line}: no value came back: {check.source}", None
    if "error" in event:
        return False, f"line {check.line}: {str(event['error'])[:500]}: {check.source}", None
    try:
        actual = decode(event.get("value"))
    except ValueRecordError as exc:
        return False, f"line {check.line}: the value reported is not plain data ({exc})", None
    shown = safe_repr(actual)
    if check.holds(actual):
        return True, "", shown
    return False, f"line {check.line}: {check.source}", shown


def expected_text(check: ValueCheck) -> str:
    if check.op == "truthy":
        return "a true value"
    if check.op == "falsy":
        return "a false value"
    return (
        safe_repr(check.expected) if check.op in ("==", "is") else f"{check.op} {safe_repr(check.expected)}"
    )


def decided(
    tests: Sequence[TestCaseResult], plan: ValuePlan, report: str, nonce: str
) -> tuple[TestCaseResult, ...]:
    """The harness's results with each host-decided test's outcome replaced by the host's verdict:
    a pass only when every one of its checks got a value that holds. A test that got no value keeps
    the harness's account of why (a timeout, an exception), never its pass."""
    values = reported_values(report, nonce)
    results = []
    for test in tests:
        indices = plan.units.get(test.name)
        if indices is None:
            results.append(dataclasses.replace(test, decided_by="sandbox"))
            continue
        verdict = TestCaseResult(test.name, Outcome.PASS, test.duration, decided_by="host")
        for index in indices:
            check = plan.checks[index]
            holds, message, actual = judged(check, values.get(index))
            if holds:
                continue
            if index not in values and test.outcome != Outcome.PASS:
                # no value: the harness saw why (the call raised or ran too long)
                verdict = dataclasses.replace(test, decided_by="host")
            else:
                verdict = TestCaseResult(
                    test.name, Outcome.FAIL, test.duration, message, expected_text(check), actual, "host"
                )
            break
        results.append(verdict)
    return tuple(results)

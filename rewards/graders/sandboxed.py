"""Graders that run code: unit_tests, agent_check and python, always inside a sandbox from the pool.

- unit_tests: a code item's tests run against the sample's solution (sample.files["solution.py"],
  else the last fenced Python block of its text), in the item's test format (Flywheel's own,
  candidate, namespace, io or pytest: sandboxes/formats.py). The tests are the item's pristine
  copy, whatever the sample wrote over them; the score is the pass rate (`score: "pass_rate"`) or
  1.0 only when every test passes (`score: "all_pass"`, what benchmarks report as pass@1; the
  default of the benchmark formats). Tests whose asserts compare a call with a literal are decided
  by the host from the values the sandbox reports (sandboxes/values.py); tests a stub of the
  solution passes carry no credit.
- agent_check: an agent item's check_command, in the episode's sandbox when the caller still
  holds it, else in a fresh one seeded with the item's files and then the sample's; either way the
  test and check files are restored to the item's copy first. 1.0 when it exits 0.
- python: the rule author's `grade(sample, item) -> float`, run in a sandbox child, never in a web
  or worker process. `sample` is a dict with output_text, output_json, output_tools, choices (as
  OpenAI passes them) and files, steps, tokens, metadata.

A timeout of the graded code is the model's (or the grader's) doing: GraderError "sandbox_timeout"
and a 0. A sandbox that fails to start or answer is infrastructure: the sample is errored.
"""

import dataclasses
import hashlib
import json
import secrets
from typing import Any

from rewards.graders.base import Field, GradingError, as_number, grader
from rewards.graders.workspace import (
    SOLUTION_FILE,
    STARTUP_FILE,
    TEST_FILE,
    TEST_NAME,
    protected_files,
    solution_source,
)
from sandboxes.formats import (
    COMPARE_MODES,
    DEFAULT_FLOAT_TOLERANCE,
    TESTS_PLACEHOLDER,
    TestFormatError,
    item_format,
    pytest_files,
)
from sandboxes.interface import (
    Limits,
    Outcome,
    SandboxPathError,
    SandboxSpec,
    StopReason,
    TestRunResult,
    task_spec,
)
from sandboxes.services import sandbox_pool

DEFAULT_SECONDS = 10.0
SCORE_MODES = ("pass_rate", "all_pass")


def limits(seconds: float | None) -> Limits:
    seconds = float(seconds or DEFAULT_SECONDS)
    return Limits(cpu_seconds=seconds, wall_seconds=seconds)


def pool_of(context: Any):
    if context.pool is not None:
        return context.pool

    return sandbox_pool()


def check_seconds(spec: dict) -> list[tuple[str, str]]:
    problems = []
    for name in ("timeout", "per_test_seconds"):
        value = spec.get(name)
        if isinstance(value, (int, float)) and not 0 < value <= 600:
            problems.append((name, "must be between 0 and 600 seconds"))
    return problems


def write_sample_files(
    sandbox: Any, files: dict[str, str], skip: set[str], *, tests_too: bool = True
) -> None:
    """The sample's files into the workspace, but those in `skip` and, without `tests_too`, test
    files, conftest.py and interpreter start-up files (the detectors flag them either way)."""
    for path, content in files.items():
        if path in skip or not isinstance(content, str):
            continue
        if not tests_too and (TEST_NAME.search(path) or STARTUP_FILE.search(path)):
            continue
        try:
            sandbox.write_file(path, content)
        except SandboxPathError:
            continue  # a path outside the workspace: the model's file is simply not there


@grader(
    "unit_tests",
    check=check_seconds,
    uses_sandbox=True,
    solution_file=Field(str, required=False, default=SOLUTION_FILE),
    timeout=Field((int, float), required=False, default=DEFAULT_SECONDS),
    per_test_seconds=Field((int, float), required=False),
    score=Field(str, required=False, choices=SCORE_MODES),
    compare=Field(str, required=False, choices=COMPARE_MODES),
    float_tolerance=Field((int, float), required=False),
)
def unit_tests(
    context: Any,
    solution_file: str = SOLUTION_FILE,
    timeout: float | None = None,
    per_test_seconds: float | None = None,
    score: str | None = None,
    compare: str | None = None,
    float_tolerance: float | None = None,
) -> float:
    """The fraction of the code item's tests that pass against the sample's solution, run in a sandbox
    (`score: "all_pass"`: 1.0 when every test passes, else 0.0). `compare` and `float_tolerance`
    are the io format's output comparison when the item names none.

    (Runs in a sandbox: the engine tests show it; a doctest here would need one.)

    >>> unit_tests.__name__
    'unit_tests'
    """
    item = context.item
    if item.get("kind") != "code":
        raise GradingError("grader_exception", "unit_tests grades code items: this item is not one")
    test_format = item_format(item)
    if test_format is None:
        raise GradingError("grader_exception", "the item's tests hold no test in any format")
    context.notes["test_format"] = test_format
    files = dict(item.get("setup_files") or {})
    if isinstance(item.get("tests"), str) and test_format not in ("io", "pytest"):
        files[TEST_FILE] = item["tests"]
    files = placeholders(files, test_format)
    spec = task_spec(files, limits(timeout), item.get("sandbox"))
    with pool_of(context).acquire(spec) as sandbox:
        try:
            free = stub_passed(
                sandbox, item, test_format, solution_file, per_test_seconds, compare, float_tolerance
            )
        except (TestFormatError, ValueError) as exc:  # the item's tests do not parse
            raise GradingError("grader_exception", str(exc)) from None
        write_sample_files(sandbox, context.sample.files, {solution_file}, tests_too=False)
        solution = {solution_file: solution_source(context.sample, solution_file)}
        try:
            result = run_item_tests(
                sandbox,
                item,
                test_format,
                solution_file,
                solution,
                per_test_seconds,
                compare,
                float_tolerance,
            )
        except (TestFormatError, ValueError) as exc:  # the item's tests do not parse
            raise GradingError("grader_exception", str(exc)) from None
    if free:
        result = dataclasses.replace(
            result,
            tests=tuple(dataclasses.replace(test, credit=test.name not in free) for test in result.tests),
        )
    context.notes["test_run"] = result
    if not result.tests:
        raise GradingError("grader_exception", "the item's tests hold no test in their format")
    timed_out = [test.name for test in result.tests if test.outcome == Outcome.TIMEOUT]
    if test_format != "io" and (timed_out or result.execution.stop_reason == StopReason.TIMEOUT):
        where = ", ".join(timed_out) or "the test run"
        raise GradingError("sandbox_timeout", f"{where} ran past the time limit", score=0.0)
    credited = [test for test in result.tests if test.credit]
    if not credited:  # a stub passes every test: they cannot tell a solution from nothing
        context.notes["stub_passes_every_test"] = True
        return 0.0
    if (score or DEFAULT_SCORE[test_format]) == "all_pass":
        return 1.0 if result.all_passed else 0.0
    return sum(test.passed for test in credited) / len(credited)


# The benchmark formats score as their benchmarks do (every test passes, else 0); partial credit is
# the rule's `score: "pass_rate"`.
DEFAULT_SCORE = {
    "flywheel": "pass_rate",
    "pytest": "pass_rate",
    "candidate": "all_pass",
    "namespace": "all_pass",
    "io": "all_pass",
}
STUB_BODIES = ("return None", "raise NotImplementedError('a stub')")
STUB_CACHE_SIZE = 4096
STUB_PASSED: dict[str, frozenset[str]] = {}  # the tests each item's stubs pass, by the tests' hash
STUB_CHECK_KEY = "stub_check"  # on a stored item (TaskItem.stub_check): {"tests": [...], "passed": [...]}


def stub_passed(
    sandbox: Any,
    item: dict,
    test_format: str,
    solution_file: str,
    per_test_seconds: float | None,
    compare: str | None,
    float_tolerance: float | None,
) -> frozenset[str]:
    """The names of the item's tests that a stub of the solution passes (a function that returns
    None, one that raises): those tests pay nothing. The result stored with the item at import
    (`stub_check`) when the rule runs the tests as the import did; else run once per item's tests
    in this process, in the pristine workspace before the sample's files are written."""
    stored = stored_stub_passes(item)
    if stored is not None and solution_file == SOLUTION_FILE and compare is None and float_tolerance is None:
        return stored
    key = hashlib.sha256(
        json.dumps(
            [
                test_format,
                solution_file,
                item.get("tests"),
                item.get("io_tests"),
                item.get("entry_point"),
                item.get("test_setup_code"),
                item.get("setup_files"),
                item.get("io_compare"),
                compare,
            ],
            sort_keys=True,
            default=str,
        ).encode()
    ).hexdigest()
    if key in STUB_PASSED:
        return STUB_PASSED[key]
    _, passed = stub_run(
        sandbox, item, test_format, solution_file, per_test_seconds, compare, float_tolerance
    )
    if len(STUB_PASSED) >= STUB_CACHE_SIZE:
        STUB_PASSED.clear()
    STUB_PASSED[key] = passed
    return passed


def stored_stub_passes(item: dict) -> frozenset[str] | None:
    """The tests a stub passes, as stored with the item at import; None when not checked (yet).

    >>> sorted(stored_stub_passes({"stub_check": {"tests": ["line 1", "line 2"], "passed": ["line 2"]}}))
    ['line 2']
    >>> stored_stub_passes({"stub_check": {"error": "the sandbox failed"}}) is None
    True
    """
    stored = item.get(STUB_CHECK_KEY)
    if not isinstance(stored, dict) or not isinstance(stored.get("passed"), list):
        return None
    return frozenset(name for name in stored["passed"] if isinstance(name, str))


def stub_run(
    sandbox: Any,
    item: dict,
    test_format: str,
    solution_file: str,
    per_test_seconds: float | None,
    compare: str | None,
    float_tolerance: float | None,
) -> tuple[tuple[str, ...], frozenset[str]]:
    """(every test's name, those either stub passes), then the workspace reset to the item's."""
    names: dict[str, None] = {}
    passed: set[str] = set()
    for body in STUB_BODIES:
        stub = {solution_file: stub_source(item, test_format, body)}
        result = run_item_tests(
            sandbox, item, test_format, solution_file, stub, per_test_seconds, compare, float_tolerance
        )
        names |= dict.fromkeys(test.name for test in result.tests)
        passed |= {test.name for test in result.tests if test.passed}
    sandbox.reset()
    return tuple(names), frozenset(passed)


def stub_check(item: dict, pool: Any, *, timeout: float | None = None) -> dict | None:
    """What a stub of the solution passes among a code item's tests, run as the unit_tests grader
    runs them by default: {"tests": every name, "passed": the names a stub passes}, stored with the
    item at import (`stub_check`); {"error": why} when the tests do not run; None for items that
    are not stubbed (not code, no tests). A sandbox that fails raises InfrastructureError."""
    if item.get("kind") != "code":
        return None
    test_format = item_format(item)
    if test_format is None:
        return None
    files = dict(item.get("setup_files") or {})
    if isinstance(item.get("tests"), str) and test_format != "io":
        files[TEST_FILE] = item["tests"]
    # The workspace the grader gives a sample: test files are placeholders, the harness has the tests.
    spec = task_spec(placeholders(files, test_format), limits(timeout), item.get("sandbox"))
    with pool.acquire(spec) as sandbox:
        try:
            names, passed = stub_run(sandbox, item, test_format, SOLUTION_FILE, None, None, None)
        except (TestFormatError, ValueError) as exc:  # the item's tests do not parse
            return {"error": str(exc)[:2000]}
    return {"tests": list(names), "passed": [name for name in names if name in passed]}


def stub_source(item: dict, test_format: str, body: str) -> str:
    """A solution that does nothing: each name the tests could call from it, with `body`.

    >>> print(stub_source({"entry_point": "f"}, "io", "return None"))
    pass
    <BLANKLINE>
    """
    if test_format == "io":
        return "pass\n" if body == STUB_BODIES[0] else "raise NotImplementedError('a stub')\n"
    tests = item.get("tests")
    if test_format == "pytest":  # the names the test files call or import from the solution
        tests = "\n".join(pytest_files(item.get("setup_files") or {}).values())
    names = {item.get("entry_point") or ""} | called_names(tests)
    functions = "".join(
        f"def {name}(*args, **kwargs):\n    {body}\n\n\n" for name in sorted(names) if name.isidentifier()
    )
    return (
        functions
        + f"def __getattr__(name):\n    def stub(*args, **kwargs):\n        {body}\n\n    return stub\n"
    )


def called_names(tests: object) -> set[str]:
    """Names the tests call or import from the solution that they do not define themselves."""
    import ast
    import builtins

    if not isinstance(tests, str):
        return set()
    try:
        tree = ast.parse(tests)
    except (SyntaxError, ValueError):
        return set()
    defined = {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
    } | {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    called = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "solution"
        for alias in node.names
    }
    return (called - defined - set(dir(builtins))) | imported


def placeholders(files: dict[str, str], test_format: str) -> dict[str, str]:
    """The workspace's files with each test file a placeholder: the harness takes the tests from the
    item (run_item_tests), never from the workspace, so their expected values are not there for the
    solution to read, and a placeholder rewritten or deleted is still flagged.

    >>> placeholders({"test_solution.py": "assert f(1) == 2", "data.txt": "1"}, "flywheel")["data.txt"]
    '1'
    """
    tests = pytest_files(files) if test_format == "pytest" else {TEST_FILE: ""}
    return {path: TESTS_PLACEHOLDER if path in tests else content for path, content in files.items()}


def run_item_tests(
    sandbox: Any,
    item: dict,
    test_format: str,
    solution_file: str,
    solution: dict[str, str],
    per_test_seconds: float | None,
    compare: str | None,
    float_tolerance: float | None,
) -> TestRunResult:
    """The item's tests in its format, against the solution (written in the same round trip)."""
    if test_format == "io":
        return sandbox.run_io_tests(
            item["io_tests"],
            program=solution_file,
            compare=item.get("io_compare") or compare or "exact",
            tolerance=float(item.get("float_tolerance") or float_tolerance or DEFAULT_FLOAT_TOLERANCE),
            per_case_seconds=per_test_seconds,
            files=solution,
        )
    if test_format == "pytest":
        tests = pytest_files(item.get("setup_files") or {})
        return sandbox.run_pytest(files=solution, tests=tests, host_decides=True)
    return sandbox.run_tests(
        TEST_FILE,
        source=item["tests"],
        style="candidate" if test_format == "candidate" else None,
        entry_point=item.get("entry_point") or "",
        inject=test_format == "namespace",
        setup_code=item.get("test_setup_code") or "",
        solution=solution_file.removesuffix(".py").replace("/", "."),
        per_test_seconds=per_test_seconds,
        files=solution,
        host_decides=True,
    )


@grader(
    "agent_check",
    check=check_seconds,
    uses_sandbox=True,
    timeout=Field((int, float), required=False, default=DEFAULT_SECONDS),
)
def agent_check(context: Any, timeout: float | None = None) -> float:
    """1.0 when the agent item's check_command exits 0 in the episode's final workspace, else 0.0.

    >>> agent_check.__name__
    'agent_check'
    """
    item = context.item
    command = item.get("check_command")
    if item.get("kind") != "agent" or not isinstance(command, str):
        raise GradingError(
            "grader_exception", "agent_check grades agent items: this item has no check_command"
        )
    pristine = {path: content for path, content in protected_files(item).items() if content}
    spec = task_spec(item.get("files") or {}, limits(timeout), item.get("sandbox"))
    seconds = spec.limits.wall_seconds  # the item's, if it asks for some, else the rule's
    if context.sandbox is not None:
        for path, content in pristine.items():
            context.sandbox.write_file(path, content)
        result = context.sandbox.exec(command, timeout=seconds)
    else:
        with pool_of(context).acquire(spec) as sandbox:
            write_sample_files(sandbox, context.sample.files, set(pristine))
            result = sandbox.exec(command)
    if result.stop_reason == StopReason.TIMEOUT:
        raise GradingError("sandbox_timeout", f"the check command ran past {seconds:g} s", score=0.0)
    return 1.0 if result.ok else 0.0


HARNESS = """
import json as _json, sys as _sys
_payload = _json.loads(_sys.stdin.read())
_namespace = {"__name__": "grader"}
exec(compile(_payload["source"], "grader.py", "exec"), _namespace)
_result = _namespace["grade"](_payload["sample"], _payload["item"])
_sys.stdout.write("\\n" + _payload["nonce"] + _json.dumps({"result": _result}, default=repr) + "\\n")
"""


def check_python(spec: dict) -> list[tuple[str, str]]:
    import ast

    source = spec.get("source")
    if not isinstance(source, str):
        return []
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [("source", f"line {exc.lineno}: does not parse: {exc.msg}")]
    grades = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "grade"]
    if not grades or len(grades[0].args.args) != 2:
        return [("source", "must define grade(sample, item) at the top level")]
    return []


@grader(
    "python",
    check=check_python,
    openai=True,
    uses_sandbox=True,
    source=Field(str),
    image_tag=Field(str, required=False),
    timeout=Field((int, float), required=False, default=DEFAULT_SECONDS),
)
def python(context: Any, source: str, image_tag: str | None = None, timeout: float | None = None) -> float:
    """What the rule author's grade(sample, item) returns, run inside a sandbox. (`image_tag`, OpenAI's
    choice of image, is kept for the round trip but not used: the configured sandbox runs it.)

    >>> python.__name__
    'python'
    """
    sample = context.sample
    nonce = "flywheel-result-" + secrets.token_hex(8) + ":"
    payload = {
        "source": source,
        "nonce": nonce,
        "item": context.item,
        "sample": {**sample.to_dict(), "output_tools": [], "choices": []},
    }
    with pool_of(context).acquire(SandboxSpec(limits=limits(timeout))) as sandbox:
        result = sandbox.run_python(HARNESS, stdin=json.dumps(payload))
    if result.stop_reason == StopReason.TIMEOUT:
        raise GradingError("sandbox_timeout", f"grade() ran past {timeout or DEFAULT_SECONDS:g} s", score=0.0)
    lines = [line for line in result.stdout.splitlines() if line.startswith(nonce)]
    if not result.ok or not lines:
        last = (
            result.stderr.strip().splitlines() or [f"exit code {result.exit_code}, {result.stop_reason}"]
        )[-1]
        raise GradingError("grader_exception", f"grade() failed: {last[:500]}")
    value = json.loads(lines[-1][len(nonce) :])["result"]
    number = as_number(value) if isinstance(value, (int, float)) else None
    if number is None:
        raise GradingError("invalid_output", f"grade() returned {str(value)[:100]!r}, not a number")
    return number

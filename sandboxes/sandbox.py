"""A sandbox: one isolated fork server, its workspace, and the operations callers use.

The backends (bubblewrap, Docker) only differ in how the server is started and stopped; everything
a caller does goes through the server's channel, so both behave the same way.
"""

import json
import secrets
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .channel import Channel, Transport
from .formats import (
    DEFAULT_FLOAT_TOLERANCE,
    TESTS_PLACEHOLDER,
    outputs_match,
    plan_tests,
    pytest_files,
    pytest_plan,
)
from .interface import (
    ExecResult,
    FileEntry,
    FileMap,
    FilePairs,
    Finding,
    InfrastructureError,
    Limits,
    Outcome,
    SandboxSpec,
    StopReason,
    TestCaseResult,
    TestRunResult,
    as_bytes,
    file_pairs,
)
from .seccomp import SeccompUnavailableError, seccomp_program
from .values import decided, pytest_value_plan, value_plan

__all__ = ["Sandbox", "ServiceOutput", "plan_tests", "sandbox_cpu_seconds"]
IO_RUNNER = "solution.py"

SERVER_SOURCE = (Path(__file__).parent / "runtime" / "server.py").read_text()
_cpu_lock = threading.Lock()
_cpu_seconds = 0.0


def sandbox_cpu_seconds() -> float:
    """CPU-seconds that code has used in this process's sandboxes so far: read it before and after
    some work to charge that work (run budgets count sandbox CPU, not wall time)."""
    with _cpu_lock:
        return _cpu_seconds


def _cpu_charge(seconds: float) -> None:
    global _cpu_seconds
    with _cpu_lock:
        _cpu_seconds += seconds


SERVER_MEMORY_MB = 64  # what a sandbox's memory budget adds for the server and a small workspace's cache
SERVER_PIDS = 8  # what its process budget adds to max_processes: the server, bwrap's monitor, headroom
START_TIMEOUT = 30.0
OP_TIMEOUT = 10.0
EXEC_GRACE = 5.0  # beyond the execution's own deadline, for killing and reaping
SERVICE_LINE_CAP = 4 << 20  # a service's stdout line past this stops it


@dataclass(frozen=True)
class ServiceOutput:
    """What a service wrote since the last talk: its whole lines, and whether it has ended."""

    lines: bytes
    exited: bool
    exit_code: int | None
    signal: int | None
    stderr: str  # the tail of what it wrote on stderr
    overflow: bool  # a line past the cap: the service was stopped


def server_command(python: str, *, seccomp: str) -> list[str]:
    """How a backend starts the server in the sandbox: with the seccomp filter, unless it is off."""
    command = [python, "-I", "-c", SERVER_SOURCE, "/workspace"]
    if seccomp == "off":
        return command
    try:
        return command + ["--seccomp", seccomp_program()]
    except SeccompUnavailableError as exc:
        raise InfrastructureError(str(exc)) from None


class Sandbox:
    """Base of the backends. Use through a pool: `with pool.acquire(spec) as sandbox: ...`."""

    backend = ""
    nproc_overhead = 1  # processes of the sandbox's uid besides the code's: the server, a monitor

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self.limits: Limits = spec.limits
        self.channel: Channel | None = None
        self.broken = False
        self.files: FilePairs = file_pairs(spec.files)  # already pairs (SandboxSpec sorted them)
        self.files_digest = spec.files_digest
        self.server_pid = 0
        # Set when the pool takes the sandbox back: the next use resets it first, in the same round
        # trip when that use runs code (one round trip less per check than a reset on return).
        self.stale = False
        self.pending_install: list[tuple[str, bytes]] | None = None  # files to install with the next use
        # One request at a time on the channel: a service's client may talk from another thread.
        self.lock = threading.RLock()

    # -- lifecycle (backends implement _launch and _terminate) ---------------------------------

    def start(self) -> "Sandbox":
        try:
            self.channel = Channel(self._launch())
            ready, _ = self.channel.receive(time.monotonic() + START_TIMEOUT)
            self.server_pid = ready["pid"]
            self.install(self.spec.files)
        except BaseException:
            self.close()
            raise
        return self

    def _launch(self) -> Transport:
        raise NotImplementedError

    def _terminate(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.broken = True
        if self.channel is not None:
            self.channel.transport.close()
        self._terminate()

    def _call(self, head: dict, blob: bytes = b"", *, timeout: float = OP_TIMEOUT) -> tuple[dict, bytes]:
        with self.lock:
            return self._call_locked(head, blob, timeout)

    def _call_locked(self, head: dict, blob: bytes, timeout: float) -> tuple[dict, bytes]:
        if self.broken or self.channel is None:
            raise InfrastructureError(f"{self.backend} sandbox is closed or broken; acquire another")
        if self.pending_install is not None and head["op"] != "ping":
            pairs, self.pending_install = self.pending_install, None
            self.stale = False  # installing resets
            if head["op"] == "exec":
                entries = [[path, 0o644, len(content)] for path, content in pairs]
                head = {**head, "install": entries, "nproc_overhead": self.nproc_overhead}
                blob = b"".join(content for _, content in pairs) + blob
            elif head["op"] != "install":
                self.install(pairs)
        if self.stale and head["op"] != "ping":
            self.stale = False
            if head["op"] == "exec":
                head = {**head, "reset_first": True}
            elif head["op"] not in ("install", "reset"):
                self.reset()
        try:
            return self.channel.call(head, blob, timeout=timeout)
        except InfrastructureError:
            self.broken = True
            raise

    # -- workspace -----------------------------------------------------------------------------

    def install(self, files: Iterable[tuple[str, bytes | str]] | FileMap, *, lazily: bool = False) -> float:
        """Make `files` the pristine state and reset to it; returns the server's reset seconds.
        `lazily` (the pool): sent with the next use instead, in the same round trip when it runs code."""
        items = files.items() if isinstance(files, Mapping) else files
        pairs = [(path, as_bytes(content)) for path, content in items]
        if lazily:
            self.pending_install = pairs
            self.files = tuple(sorted(pairs))
            self.files_digest = SandboxSpec(files=self.files).files_digest
            return 0.0
        self.pending_install = None
        head = {
            "op": "install",
            "files": [[path, 0o644, len(content)] for path, content in pairs],
            "nproc_overhead": self.nproc_overhead,
        }
        reply, _ = self._call(head, b"".join(content for _, content in pairs))
        self.files = tuple(sorted(pairs))
        self.files_digest = SandboxSpec(files=self.files).files_digest
        return reply["seconds"]

    def reset(self) -> float:
        """Back to the pristine files, with every process gone; returns the server's seconds."""
        reply, _ = self._call({"op": "reset"})
        return reply["seconds"]

    def write_file(self, path: str, content: bytes | str, *, mode: int = 0o644) -> None:
        self._call({"op": "write", "path": path, "mode": mode}, as_bytes(content))

    def read_file(self, path: str, *, max_bytes: int = 16 << 20) -> bytes:
        """The file's bytes; raises FileNotFoundError, or SandboxPathError for a refused path."""
        _, data = self._call({"op": "read", "path": path, "max_bytes": max_bytes})
        return data

    def list_files(self, *, max_entries: int = 10000) -> list[FileEntry]:
        """Every entry under the workspace, depth first; symlinks are listed, never followed."""
        reply, _ = self._call({"op": "list", "max_entries": max_entries})
        return [FileEntry(path, kind, size) for path, kind, size in reply["entries"]]

    def health(self) -> bool:
        """The server answers a ping promptly; a sandbox that fails this is replaced, never reused."""
        if self.broken:
            return False
        try:
            self._call({"op": "ping"}, timeout=5.0)
        except InfrastructureError:
            return False
        return True

    # -- services: long-lived processes with their stdio kept open (MCP servers) --------------

    def service_start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> int:
        """Start argv in the workspace under the sandbox's limits (its CPU time counted over its
        whole life), in a session of its own that executions leave alone; returns its handle.
        A program that cannot be run exits with 127 and says why on stderr (`service_talk`)."""
        if not argv:
            raise ValueError("a service needs a command")
        head = {"op": "spawn", "argv": list(argv), "env": dict(env or {}), "limits": self._limits_head()}
        reply, _ = self._call(head)
        return int(reply["handle"])

    def service_talk(
        self, handle: int, data: bytes = b"", *, wait: float, line_cap: int = SERVICE_LINE_CAP
    ) -> ServiceOutput:
        """Write data to the service's stdin, then wait up to `wait` seconds for a whole line of
        its stdout; every whole line it has written so far comes back. A line longer than
        `line_cap` stops the service (`overflow`)."""
        head = {"op": "talk", "handle": handle, "wait": max(0.0, wait), "line_cap": line_cap}
        reply, lines = self._call(head, data, timeout=wait + EXEC_GRACE)
        return ServiceOutput(
            lines=lines,
            exited=bool(reply["exited"]),
            exit_code=reply.get("exit_code"),
            signal=reply.get("signal"),
            stderr=reply.get("stderr", "").encode("latin-1").decode(errors="replace"),
            overflow=bool(reply.get("overflow")),
        )

    def service_stop(self, handle: int) -> None:
        """Kill the service and whatever it started."""
        self._call({"op": "stop", "handle": handle})

    def _limits_head(self) -> dict:
        limits = self.limits
        return {
            "cpu_seconds": limits.cpu_seconds,
            "memory_mb": limits.memory_mb,
            "max_processes": limits.max_processes,
            "max_open_files": limits.max_open_files,
            "max_file_size_mb": limits.max_file_size_mb,
        }

    # -- execution -----------------------------------------------------------------------------

    def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        output_cap: int | None = None,
        stdin: bytes | str = b"",
        files: FileMap | None = None,
    ) -> ExecResult:
        """Run a shell command (a string, through /bin/sh -c) or an argv list inside the sandbox.
        `files` are written to the workspace first, in the same round trip."""
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        if not argv:
            raise ValueError("exec needs a command")
        reply = self._execute({"kind": "argv", "argv": argv}, timeout, output_cap, as_bytes(stdin), files)
        return exec_result(reply)

    def run_python(
        self,
        code: str,
        *,
        timeout: float | None = None,
        output_cap: int | None = None,
        stdin: bytes | str = b"",
        files: FileMap | None = None,
    ) -> ExecResult:
        """Run a Python snippet in a fresh child forked from the warm server (no interpreter start).
        `files` are written to the workspace first, in the same round trip."""
        head = {"kind": "python", "code": code}
        return exec_result(self._execute(head, timeout, output_cap, as_bytes(stdin), files))

    def run_tests(
        self,
        path: str,
        *,
        source: str | None = None,
        style: str | None = None,
        entry_point: str = "",
        inject: bool = False,
        setup_code: str = "",
        solution: str = "solution",
        timeout: float | None = None,
        per_test_seconds: float | None = None,
        output_cap: int | None = None,
        files: FileMap | None = None,
        host_decides: bool = False,
    ) -> TestRunResult:
        """Run a test file and return one result per test.

        The tests that run are the pristine ones: `source` if given, else the file's initial content
        from the spec, never the workspace copy the code under test could have rewritten. A file
        with `test_*` functions runs each of them; otherwise each top-level statement holding an
        assert is a test named "line N". `style="candidate"` calls the file's check(candidate) with
        the `solution` module's `entry_point`; `inject` puts the solution's names in the tests'
        scope (namespace style), after `setup_code`. A test that never reports (the code exited
        first) is an error, never a pass. `files` (the solution, say) are written to the workspace
        first, in the same round trip. `host_decides`: each test whose asserts compare a value with
        a literal is decided by the host from the values reported (sandboxes/values.py); the
        expected literals never enter the sandbox.
        """
        source = self.pristine_source(path) if source is None else source
        style, names = plan_tests(source, path, style)
        plan = value_plan(source, path, style, names) if host_decides else None
        nonce = secrets.token_hex(16)
        head = {
            "kind": "tests",
            "path": path,
            "source": plan.source if plan else source,
            "style": style,
            "names": names,
            "nonce": nonce,
            "per_test_seconds": per_test_seconds,
            "entry_point": entry_point,
            "inject": inject,
            "setup_code": setup_code,
            "solution": solution,
            "protected": [path],
        }
        reply = self._execute(head, timeout, output_cap, b"", files)
        execution = exec_result(reply, nonce)
        tests = assemble_tests(names, reply["report"], nonce, execution)
        if plan is None:
            return TestRunResult(tests=tests, execution=execution, unrewritable=tuple(names))
        return TestRunResult(
            tests=decided(tests, plan, reply["report"], nonce),
            execution=execution,
            unrewritable=plan.unrewritable,
        )

    def run_io_tests(
        self,
        cases: Sequence[dict],
        *,
        program: str = IO_RUNNER,
        compare: str = "exact",
        tolerance: float = DEFAULT_FLOAT_TOLERANCE,
        per_case_seconds: float | None = None,
        files: FileMap | None = None,
    ) -> TestRunResult:
        """Run `program` as __main__ once per case ({"input", "output"}, optional "time_limit"),
        each in a fresh child with its own time limit, and compare its stdout with the case's
        output (`compare`: exact, whitespace or float within `tolerance`). Tests are "case N".
        The run's execution is the first case that did not exit cleanly, else the last case's."""
        tests, worst, last = [], None, None
        findings: list[Finding] = []
        for index, case in enumerate(cases, start=1):
            seconds = case.get("time_limit") or per_case_seconds or self.limits.wall_seconds
            nonce = secrets.token_hex(16)
            head = {"kind": "program", "path": program, "nonce": nonce}
            reply = self._execute(head, seconds, None, as_bytes(case["input"]), files if index == 1 else None)
            execution = exec_result(reply, nonce)
            last = execution
            findings += execution.findings
            if worst is None and not execution.ok:
                worst = execution
            tests.append(io_case_result(f"case {index}", case, execution, compare, tolerance, seconds))
        execution = worst or last or exec_result_empty()
        return TestRunResult(
            tests=tuple(tests), execution=execution, extra_findings=tuple(dict.fromkeys(findings))
        )

    def run_pytest(
        self,
        *,
        timeout: float | None = None,
        output_cap: int | None = None,
        files: FileMap | None = None,
        tests: Mapping[str, str] | None = None,
        host_decides: bool = False,
    ) -> TestRunResult:
        """Run pytest over the test files (its image must have pytest); one result per test function
        read from the files (a parametrised test passes when every case does).

        The test files are `tests` (path -> source), else the sandbox's initial test files. pytest
        compiles them from the harness's memory, where they arrive before any of the workspace's
        code runs: in the workspace each is a placeholder (written here if the spec has none), so
        the solution cannot read the expected values there, and a placeholder rewritten or deleted
        is flagged (`test_files_modified`). `host_decides`: as run_tests, for each plain test
        function or method whose asserts compare a value with a literal (sandboxes/values.py).
        """
        initial = {path: content.decode(errors="replace") for path, content in self.files}
        test_files = pytest_files(initial if tests is None else tests)
        names = pytest_plan(test_files)
        plan = pytest_value_plan(tuple(sorted(test_files.items())), names) if host_decides else None
        sources = dict(plan.sources) if plan is not None else test_files
        placeholders = {path: TESTS_PLACEHOLDER for path in test_files if path not in initial}
        nonce = secrets.token_hex(16)
        argv = ["python3", "-c", PYTEST_RUNNER, *sorted({name.split("::", 1)[0] for name in names})]
        stdin = json.dumps({"nonce": nonce, "sources": sources}).encode()
        head = {"kind": "argv", "argv": argv}
        reply = self._execute(head, timeout, output_cap, stdin, {**placeholders, **(files or {})})
        execution = exec_result(reply, nonce)
        if "No module named pytest" in execution.stderr:
            raise InfrastructureError(
                f"the sandbox's image has no pytest ({self.spec.image or 'the default'})"
            )
        results = pytest_results(names, reply["report"], nonce, execution)
        if plan is None:
            return TestRunResult(tests=results, execution=execution)
        return TestRunResult(
            tests=decided(results, plan, reply["report"], nonce),
            execution=execution,
            unrewritable=plan.unrewritable,
        )

    def pristine_source(self, path: str) -> str:
        for initial_path, content in self.files:
            if initial_path == path:
                return content.decode()
        raise ValueError(
            f"{path} is not one of the sandbox's initial files; pass source= with the tests to run"
        )

    def _execute(
        self, head: dict, timeout: float | None, output_cap: int | None, stdin: bytes, files: FileMap | None
    ) -> dict:
        limits = self.limits
        pairs = [(path, as_bytes(content)) for path, content in (files or {}).items()]
        wall = limits.wall_seconds if timeout is None else timeout
        head = {
            "op": "exec",
            **head,
            "files": [[path, 0o644, len(content)] for path, content in pairs],
            "timeout": wall,
            "output_cap": limits.max_output_bytes if output_cap is None else output_cap,
            "limits": self._limits_head(),
        }
        blob = b"".join(content for _, content in pairs) + stdin  # the files, then stdin
        reply, _ = self._call(head, blob, timeout=wall + EXEC_GRACE)
        _cpu_charge(float(reply.get("cpu_seconds") or 0.0))
        return reply


def exec_result(reply: dict, nonce: str = "") -> ExecResult:
    return ExecResult(
        exit_code=reply["exit_code"],
        stdout=reply["stdout"].encode("latin-1").decode(errors="replace"),
        stderr=reply["stderr"].encode("latin-1").decode(errors="replace"),
        stdout_truncated=reply["stdout_truncated"],
        stderr_truncated=reply["stderr_truncated"],
        wall_seconds=reply["wall_seconds"],
        cpu_seconds=reply["cpu_seconds"],
        peak_memory_mb=reply["peak_memory_mb"],
        stop_reason=StopReason(reply["stop_reason"]),
        signal=reply["signal"],
        findings=findings_of(reply, nonce),
    )


def findings_of(reply: dict, nonce: str) -> tuple[Finding, ...]:
    """What the server saw in the workspace after the run, and, with the run's nonce, what the
    harness saw the code do (the code can add reports, never forge one without the nonce)."""
    found = [
        Finding(str(detector), str(evidence)[:500]) for detector, evidence in reply.get("findings") or ()
    ]
    if nonce:
        for line in (reply.get("report") or "").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("nonce") == nonce and event.get("event") == "suspect":
                found.append(Finding(str(event.get("detector")), str(event.get("evidence"))[:500]))
    return tuple(dict.fromkeys(found))


def exec_result_empty() -> ExecResult:
    return ExecResult(None, "", "", False, False, 0.0, 0.0, 0.0, StopReason.EXITED)


def io_case_result(
    name: str, case: dict, execution: ExecResult, compare: str, tolerance: float, seconds: float
) -> TestCaseResult:
    expected, actual = case["output"], execution.stdout
    if execution.stop_reason == StopReason.TIMEOUT:
        outcome, message = Outcome.TIMEOUT, f"ran past its {seconds:g} s limit"
    elif execution.stop_reason != StopReason.EXITED or execution.exit_code != 0:
        last = (execution.stderr.strip().splitlines() or [""])[-1][:500]
        outcome = Outcome.ERROR
        message = f"{execution.stop_reason}, exit code {execution.exit_code}" + (f": {last}" if last else "")
    elif outputs_match(actual, expected, compare, tolerance):
        outcome, message = Outcome.PASS, ""
    else:
        outcome, message = Outcome.FAIL, f"the output differs from the expected output ({compare} comparison)"
    return TestCaseResult(
        name,
        outcome,
        execution.wall_seconds,
        message,
        expected=None if outcome == Outcome.PASS else expected[:2000],
        actual=None if outcome == Outcome.PASS else actual[:2000],
    )


PYTEST_RUNNER = r"""
import ast, json, linecache, os, posixpath, sys, types

# The run's nonce and the test files come on stdin, read before any of the workspace's code runs:
# the files on disk are placeholders, so the tests' expected values are nowhere the code can read.
PAYLOAD = json.loads(sys.stdin.buffer.read() or b"{}")
NONCE, SOURCES = PAYLOAD.get("nonce", ""), PAYLOAD.get("sources", {})
del PAYLOAD

import pytest
from _pytest.assertion.rewrite import rewrite_asserts


def emit(line):
    try:
        os.write(3, (line + "\n").encode())
    except OSError:
        pass


def out_of_memory(report):
    if report.failed and "MemoryError" in str(report.longrepr):
        emit('{"event": "oom"}')


class NotPlainError(Exception):
    pass


def plain(value, depth=0):
    # the server's plain() (runtime/server.py): exact built-in types only
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is float or kind is str:
        return value
    if depth > 100:
        raise NotPlainError("a value nested deeper than 100 levels")
    if kind is list or kind is tuple or kind is set or kind is frozenset:
        return {kind.__name__: [plain(element, depth + 1) for element in value]}
    if kind is dict:
        return {"dict": [[plain(key, depth + 1), plain(item, depth + 1)] for key, item in value.items()]}
    if kind is bytes:
        return {"bytes": value.hex()}
    raise NotPlainError(f"a {kind.__module__}.{kind.__qualname__} is not plain data")


def flywheel_value(index, value):
    event = {"nonce": NONCE, "event": "value", "index": index}
    try:
        event["value"] = plain(value)
        line = json.dumps(event)
    except NotPlainError as exc:
        line = json.dumps({**event, "error": str(exc)})
    except (ValueError, RecursionError) as exc:
        line = json.dumps({**event, "error": "the value does not serialise: " + type(exc).__name__})
    emit(line)
    return True


class MemoryModule(pytest.Module):
    # A test file compiled from the harness's memory (pytest's assertion rewriting kept).
    def _getobj(self):
        path = str(self.path)
        source = SOURCES[posixpath.normpath(os.path.relpath(path))]
        tree = ast.parse(source, path)
        rewrite_asserts(tree, source.encode(), path, self.config)
        name = os.path.splitext(os.path.basename(path))[0]
        module = types.ModuleType(name)
        module.__file__ = path
        module.__dict__["__flywheel_value__"] = flywheel_value
        linecache.cache[path] = (len(source), None, source.splitlines(True), path)
        directory = os.path.dirname(path)
        if directory not in sys.path:
            sys.path.insert(0, directory)
        sys.modules[name] = module
        exec(compile(tree, path, "exec"), module.__dict__)
        return module


class FlywheelReport:
    @pytest.hookimpl(tryfirst=True)
    def pytest_pycollect_makemodule(self, module_path, parent):
        if posixpath.normpath(os.path.relpath(str(module_path))) in SOURCES:
            return MemoryModule.from_parent(parent, path=module_path)
        return None

    def pytest_collectreport(self, report):
        out_of_memory(report)

    def pytest_runtest_logreport(self, report):
        out_of_memory(report)
        if report.when == "call" or report.outcome != "passed":
            message = ""
            if report.outcome != "passed":
                crash = getattr(report.longrepr, "reprcrash", None)
                message = crash.message if crash is not None else str(report.longrepr)[-2000:]
            event = {"nonce": NONCE, "event": "end", "name": report.nodeid, "outcome": report.outcome,
                     "when": report.when, "message": message[:2000], "duration": report.duration}
            emit(json.dumps(event))


arguments = ["-q", "-p", "no:cacheprovider", "-o", "addopts=", *sys.argv[1:]]
sys.exit(pytest.main(arguments, plugins=[FlywheelReport()]))
"""


def pytest_results(
    names: Sequence[str], report: str, nonce: str, execution: ExecResult
) -> tuple[TestCaseResult, ...]:
    """One result per planned test: passed when every reported case of it passed."""
    reported: dict[str, list[dict]] = {}
    for line in report.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("nonce") == nonce and event.get("event") == "end":
            base = str(event.get("name", "")).split("[", 1)[0]
            reported.setdefault(base, []).append(event)
    results = []
    for name in names:
        events = reported.get(name)
        if not events:
            results.append(unreported(name, False, "", execution))
            continue
        failed = next((event for event in events if event.get("outcome") != "passed"), None)
        duration = sum(float(event.get("duration") or 0.0) for event in events)
        if failed is None:
            results.append(TestCaseResult(name, Outcome.PASS, duration))
            continue
        outcome = (
            Outcome.FAIL
            if failed.get("when") == "call" and failed.get("outcome") == "failed"
            else Outcome.ERROR
        )
        if failed.get("outcome") == "skipped":
            outcome = Outcome.ERROR
        results.append(TestCaseResult(name, outcome, duration, str(failed.get("message", ""))[:2000]))
    return tuple(results)


def assemble_tests(
    names: Sequence[str], report: str, nonce: str, execution: ExecResult
) -> tuple[TestCaseResult, ...]:
    """One result per expected test, from the report lines that carry this run's nonce."""
    results: dict[str, TestCaseResult] = {}
    running, collect_error = None, ""
    for line in report.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict) or event.get("nonce") != nonce:
            continue
        name = event.get("name")
        if event.get("event") == "collect_error":
            collect_error = str(event.get("message", ""))[:2000]
        elif event.get("event") == "start" and name in names:
            running = name
        elif event.get("event") == "end" and isinstance(name, str) and name in names and name not in results:
            outcome = event.get("outcome")
            results[name] = TestCaseResult(
                name=name,
                outcome=Outcome(outcome) if outcome in set(Outcome) else Outcome.ERROR,
                duration=float(event.get("duration") or 0.0),
                message=str(event.get("message", ""))[:2000],
                expected=text_or_none(event.get("expected")),
                actual=text_or_none(event.get("actual")),
            )
            running = None
    return tuple(
        results.get(name) or unreported(name, name == running, collect_error, execution) for name in names
    )


def unreported(name: str, was_running: bool, collect_error: str, execution: ExecResult) -> TestCaseResult:
    stop = execution.stop_reason
    if was_running:
        outcome = Outcome.TIMEOUT if stop == StopReason.TIMEOUT else Outcome.ERROR
        return TestCaseResult(
            name, outcome, 0.0, f"stopped during the test: {stop} (exit code {execution.exit_code})"
        )
    message = (
        collect_error or f"never reported: the run ended ({stop}, exit code {execution.exit_code}) first"
    )
    return TestCaseResult(name, Outcome.ERROR, 0.0, message)


def text_or_none(value: object) -> str | None:
    return None if value is None else str(value)[:2000]

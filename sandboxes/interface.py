"""The sandbox interface: what callers give (a spec, limits) and what they get back (typed results).

Rollouts and graders run untrusted code through this interface and nothing else.
"""

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property


class StopReason(StrEnum):
    """Why an execution stopped."""

    EXITED = "exited"  # the code ended on its own (any exit code)
    TIMEOUT = "timeout"  # the wall-clock or the CPU-time limit ran out
    OUT_OF_MEMORY = "out_of_memory"  # an allocation went past the memory limit
    OUTPUT_CAP = "output_cap"  # stdout or stderr went past the output cap; the code was stopped
    KILLED = "killed"  # a signal ended it (its own doing: a crash, kill -9 of itself)


class Outcome(StrEnum):
    PASS = "pass"
    FAIL = "fail"  # an assertion failed
    ERROR = "error"  # anything else: an exception, an exit before the test ran, never reported
    TIMEOUT = "timeout"


class SandboxError(Exception):
    """Base of the errors this app raises."""


class InfrastructureError(SandboxError):
    """The machinery failed (engine unreachable, image missing, server crashed): mask, never score."""


class SandboxPathError(SandboxError, ValueError):
    """A workspace path was refused: absolute, with `..`, through a symlink, or not a regular file."""


@dataclass(frozen=True)
class Limits:
    """Per-execution limits. Small defaults: a check is a few asserts, not a build."""

    cpu_seconds: float = 10.0
    memory_mb: int = 512  # address space of each process the code starts
    max_processes: int = 32  # processes and threads at once, the code's own included
    max_open_files: int = 256
    max_file_size_mb: int = 16  # the largest single file the code may write
    max_output_bytes: int = 1 << 20  # per stream; past it the code is stopped (OUTPUT_CAP)
    wall_seconds: float = 10.0
    workspace_mb: int = 64  # the writable workspace (and /tmp), each a tmpfs of this size
    cpus: float = 1.0  # cores (Docker, and bubblewrap where the host gives it cgroups)


# What a task may ask of its sandbox, at most: beyond it is a mistake, not a need.
LIMIT_BOUNDS: dict[str, tuple[float, float]] = {
    "cpu_seconds": (0.1, 3600),
    "memory_mb": (32, 65536),
    "max_processes": (1, 4096),
    "max_open_files": (16, 65536),
    "max_file_size_mb": (1, 16384),
    "max_output_bytes": (1024, 1 << 30),
    "wall_seconds": (0.1, 3600),
    "workspace_mb": (1, 65536),
    "cpus": (0.1, 64),
}
IMAGE_NAME = re.compile(r"^[a-z0-9][A-Za-z0-9._\-/:@]{0,254}$")  # a local Docker image's name or id


def limits_problems(raw: object) -> list[tuple[str, str]]:
    """What is wrong with a task's limits object, as (field, message) pairs; [] when nothing is.

    >>> limits_problems({"wall_seconds": 30, "memory_mb": 16, "cpus": "2"})
    [('memory_mb', 'must be between 32 and 65536'), ('cpus', 'must be a number')]
    """
    if not isinstance(raw, Mapping):
        return [("", "must be an object")]
    problems = []
    for name, value in raw.items():
        if name not in LIMIT_BOUNDS:
            problems.append((name, f"is not a sandbox limit (known: {', '.join(LIMIT_BOUNDS)})"))
            continue
        integral = isinstance(Limits.__dataclass_fields__[name].default, int)
        low, high = LIMIT_BOUNDS[name]
        if isinstance(value, bool) or not isinstance(value, int if integral else (int, float)):
            problems.append((name, "must be an integer" if integral else "must be a number"))
        elif not low <= value <= high:
            problems.append((name, f"must be between {low:g} and {high:g}"))
    return problems


def image_problem(image: object) -> str | None:
    """What is wrong with a task's image name, or None.

    >>> image_problem("flywheel-sandbox:py311"), image_problem("--privileged")
    (None, 'must be a Docker image name such as flywheel-sandbox:latest')
    """
    if isinstance(image, str) and IMAGE_NAME.match(image):
        return None
    return "must be a Docker image name such as flywheel-sandbox:latest"


def limits_with(base: Limits, overrides: Mapping[str, float]) -> Limits:
    """base with the fields a task names replaced (checked with limits_problems first).

    >>> limits_with(Limits(wall_seconds=5), {"wall_seconds": 60}).wall_seconds
    60
    """
    # mypy checks each value against every field; limits_problems has checked each against its own
    # (an integer for the integer fields).
    return replace(base, **overrides)  # type: ignore[arg-type]


FileMap = Mapping[str, bytes | str]
FilePairs = tuple[tuple[str, bytes], ...]


def file_pairs(files: Iterable[tuple[str, bytes | str]] | FileMap) -> FilePairs:
    """files, given as a mapping or as pairs, as sorted (path, content) pairs.

    >>> file_pairs({"b.py": "x", "a.py": b"y"})
    (('a.py', b'y'), ('b.py', b'x'))
    """
    items = files.items() if isinstance(files, Mapping) else files
    return tuple(sorted((path, as_bytes(content)) for path, content in items))


@dataclass(frozen=True)
class SandboxSpec:
    """What a task needs: a backend, an image or profile, its initial files, limits.

    Empty backend and image mean the configured defaults (`FLYWHEEL_SANDBOX_BACKEND`,
    `FLYWHEEL_SANDBOX_IMAGE`). `files` may be given as a dict; it is stored as sorted pairs.
    """

    backend: str = ""
    image: str = ""
    files: FilePairs | FileMap = ()
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", file_pairs(self.files))

    @property
    def environment(self) -> tuple[str, str, Limits]:
        """Specs with the same environment share warm sandboxes; only the initial files differ."""
        return (self.backend, self.image, self.limits)

    @cached_property
    def files_digest(self) -> str:
        digest = hashlib.sha256()
        for path, content in file_pairs(self.files):  # already pairs (__post_init__): the type says either
            digest.update(path.encode() + b"\0" + hashlib.sha256(content).digest())
        return digest.hexdigest()[:16]


def as_bytes(content: bytes | str) -> bytes:
    return content.encode() if isinstance(content, str) else bytes(content)


@dataclass(frozen=True)
class Finding:
    """Something the sandbox saw the code do that a reward detector weighs: `detector` names it
    (test_files_modified, conftest_planted, startup_files_written, signals_sent, exit_hooks,
    always_equal, test_framework_patched), `evidence` says what and where."""

    detector: str
    evidence: str


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None  # None when a signal ended it
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    wall_seconds: float
    cpu_seconds: float
    peak_memory_mb: float
    stop_reason: StopReason
    signal: int | None = None
    findings: tuple[Finding, ...] = ()

    @property
    def ok(self) -> bool:
        return self.stop_reason == StopReason.EXITED and self.exit_code == 0


@dataclass(frozen=True)
class TestCaseResult:
    __test__ = False  # not a pytest test class

    name: str  # "test_add", "line 3" for a top-level assert, "check line 5", "case 2"
    outcome: Outcome
    duration: float
    message: str = ""
    expected: str | None = None  # where the failing assertion exposes them (repr, or an io case's text)
    actual: str | None = None
    decided_by: str = ""  # "host": from values the host compared; "sandbox": the harness's verdict
    credit: bool = True  # False: a stub of the solution passes it too, so it pays nothing

    @property
    def passed(self) -> bool:
        return self.outcome == Outcome.PASS

    def to_dict(self) -> dict:
        record = {
            "name": self.name,
            "passed": self.passed,
            "outcome": str(self.outcome),
            "message": self.message,
        }
        if self.expected is not None or self.actual is not None:
            record |= {"expected": self.expected, "actual": self.actual}
        if self.decided_by:
            record["decided_by"] = self.decided_by
        if not self.credit:
            record["credit"] = False
        return record


@dataclass(frozen=True)
class TestRunResult:
    __test__ = False

    tests: tuple[TestCaseResult, ...]
    execution: ExecResult
    extra_findings: tuple[Finding, ...] = ()
    # tests whose verdict is the in-sandbox harness's (asserts the host could not take over:
    # sandboxes/values.py); the others' outcomes are the host's own comparison of reported values
    unrewritable: tuple[str, ...] = ()

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(dict.fromkeys(self.execution.findings + self.extra_findings))

    @property
    def passed(self) -> int:
        return sum(test.outcome == Outcome.PASS for test in self.tests)

    @property
    def all_passed(self) -> bool:
        return bool(self.tests) and self.passed == len(self.tests)

    def outcomes(self) -> dict[str, Outcome]:
        return {test.name: test.outcome for test in self.tests}


@dataclass(frozen=True)
class FileEntry:
    path: str
    kind: str  # "file", "dir", "symlink" or "other"; symlinks are listed, never followed
    size: int


def task_spec(files: FileMap, limits: Limits, asked: Mapping | None = None) -> SandboxSpec:
    """The spec for a task's code: its files, the caller's limits with those the task asks for
    replacing them, and the task's image if it names one (`asked` is an item's `sandbox` object).

    >>> spec = task_spec({"a.py": "x = 1"}, Limits(wall_seconds=10), {"limits": {"wall_seconds": 60}})
    >>> spec.limits.wall_seconds, spec.image
    (60, '')
    """
    asked = asked or {}
    limits = limits_with(limits, asked.get("limits", {}))
    return SandboxSpec(image=asked.get("image", ""), files=files, limits=limits)

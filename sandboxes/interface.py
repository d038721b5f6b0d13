"""The sandbox interface: what callers give (a spec, limits) and what they get back (typed results).

Rollouts and graders run untrusted code through this interface and nothing else.
"""

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
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


FileMap = Mapping[str, bytes | str]


@dataclass(frozen=True)
class SandboxSpec:
    """What a task needs: a backend, an image or profile, its initial files, limits.

    Empty backend and image mean the configured defaults (`FLYWHEEL_SANDBOX_BACKEND`,
    `FLYWHEEL_SANDBOX_IMAGE`). `files` may be given as a dict; it is stored as sorted pairs.
    """

    backend: str = ""
    image: str = ""
    files: tuple[tuple[str, bytes], ...] | FileMap = ()
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        items = self.files.items() if isinstance(self.files, Mapping) else self.files
        normalised = tuple(sorted((path, as_bytes(content)) for path, content in items))
        object.__setattr__(self, "files", normalised)

    @property
    def environment(self) -> tuple[str, str, Limits]:
        """Specs with the same environment share warm sandboxes; only the initial files differ."""
        return (self.backend, self.image, self.limits)

    @cached_property
    def files_digest(self) -> str:
        digest = hashlib.sha256()
        for path, content in self.files:
            digest.update(path.encode() + b"\0" + hashlib.sha256(content).digest())
        return digest.hexdigest()[:16]


def as_bytes(content: bytes | str) -> bytes:
    return content.encode() if isinstance(content, str) else bytes(content)


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

    @property
    def ok(self) -> bool:
        return self.stop_reason == StopReason.EXITED and self.exit_code == 0


@dataclass(frozen=True)
class TestCaseResult:
    __test__ = False  # not a pytest test class

    name: str  # "test_add", or "line 3" for a top-level assert
    outcome: Outcome
    duration: float
    message: str = ""


@dataclass(frozen=True)
class TestRunResult:
    __test__ = False

    tests: tuple[TestCaseResult, ...]
    execution: ExecResult

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

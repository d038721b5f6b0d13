"""The entry points rollouts and graders use: one pool per process, shared by its threads."""

import atexit
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace

from .config import sandbox_settings
from .interface import InfrastructureError, SandboxSpec
from .pool import SandboxPool
from .sandbox import Sandbox

_pool: SandboxPool | None = None
_pool_lock = threading.Lock()


def sandbox_pool() -> SandboxPool:
    global _pool
    with _pool_lock:
        if _pool is None or _pool.closed:
            _pool = SandboxPool()
            atexit.register(_pool.close)
        return _pool


def sandbox_pool_counts() -> dict[str, int] | None:
    """This process's pool's counts (live, busy, idle, replaced), or None while it has none: an
    observer must not start a pool just to count it."""
    pool = _pool
    return pool.stats() if pool is not None and not pool.closed else None


@contextmanager
def sandbox_acquire(spec: SandboxSpec, *, timeout: float | None = None) -> Iterator[Sandbox]:
    """`with sandbox_acquire(spec) as sandbox:` a pristine sandbox, reset and returned afterwards."""
    with sandbox_pool().acquire(spec, timeout=timeout) as sandbox:
        yield sandbox


CHECK_TESTS = """from solution import add


def test_add():
    assert add(2, 3) == 5


def test_exit():
    import os
    os._exit(0)  # an early exit must never count as a pass
"""
CHECK_SOLUTION = "def add(a, b):\n    return a + b\n"


@dataclass(frozen=True)
class SandboxCheck:
    """How one backend did: whether a sandbox started and graded a check right, and how fast."""

    backend: str
    ok: bool
    detail: str
    start_ms: float | None = None
    check_ms: float | None = None
    seccomp: str = ""
    cgroup: bool | None = None  # bubblewrap: whether the sandbox got a cgroup of its own

    def as_dict(self) -> dict:
        return asdict(self)


def sandbox_check(backend: str) -> SandboxCheck:
    """Start a sandbox of `backend` with this host's settings and grade a two-test check in it (one
    passes, one exits early and must not): what an operator runs after `make sandbox-deps`."""
    settings = replace(sandbox_settings(), backend=backend)
    pool = SandboxPool(settings=settings, max_sandboxes=1, warm=0)
    started = time.perf_counter()
    try:
        with pool.acquire(SandboxSpec(files={"test_check.py": CHECK_TESTS})) as sandbox:
            ready = time.perf_counter()
            result = sandbox.run_tests("test_check.py", files={"solution.py": CHECK_SOLUTION})
            done = time.perf_counter()
            cgroup = getattr(sandbox, "cgroup", None) is not None if backend == "bubblewrap" else None
    except InfrastructureError as exc:
        return SandboxCheck(backend, ok=False, detail=str(exc), seccomp=settings.seccomp)
    finally:
        pool.close()
    outcomes = {test.name: str(test.outcome) for test in result.tests}
    ok = outcomes == {"test_add": "pass", "test_exit": "error"}
    detail = "graded right" if ok else f"graded wrong: {outcomes} ({result.execution.stderr[-300:]!r})"
    return SandboxCheck(
        backend,
        ok=ok,
        detail=detail,
        start_ms=round((ready - started) * 1000, 1),
        check_ms=round((done - ready) * 1000, 1),
        seccomp=settings.seccomp,
        cgroup=cgroup,
    )

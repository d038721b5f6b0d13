"""The entry points rollouts and graders use: one pool per process, shared by its threads."""

import atexit
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .interface import SandboxSpec
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


@contextmanager
def sandbox_acquire(spec: SandboxSpec, *, timeout: float | None = None) -> Iterator[Sandbox]:
    """`with sandbox_acquire(spec) as sandbox:` a pristine sandbox, reset and returned afterwards."""
    with sandbox_pool().acquire(spec, timeout=timeout) as sandbox:
        yield sandbox

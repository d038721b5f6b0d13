"""Warm sandboxes per worker host, handed out one caller at a time under a concurrency limit.

A sandbox that comes back is marked stale and reset by its next use, first thing and in the same round
trip when that use runs code (so acquiring one is a dictionary lookup, and a check costs one round
trip); it is loaded with the next spec's files when they differ (one round trip, which resets it too),
an idle sandbox already holding the spec's files is preferred, and a sandbox that misbehaved is
closed: a broken sandbox is never handed out again, and a replacement is started in the background to
keep the pool warm. Every process the code started is killed when its execution ends.
"""

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .config import SandboxSettings, sandbox_settings
from .interface import InfrastructureError, Limits, SandboxSpec
from .sandbox import Sandbox

Environment = tuple[str, str, Limits]


def sandbox_create(spec: SandboxSpec, settings: SandboxSettings) -> Sandbox:
    """Start one sandbox for spec on its backend (raises InfrastructureError when it can't)."""
    backend = spec.backend or settings.backend
    if backend == "bubblewrap":
        from .backend_bubblewrap import BubblewrapSandbox

        if spec.image:  # never silently run a task meant for its own image on the host's system
            raise InfrastructureError(
                f"the task asks for the image {spec.image!r}, but bubblewrap sandboxes run this host's "
                "own system: images need FLYWHEEL_SANDBOX_BACKEND=docker"
            )

        return BubblewrapSandbox(spec, settings).start()
    if backend == "docker":
        from .backend_docker import DockerSandbox

        return DockerSandbox(spec, settings).start()
    raise ValueError(f"unknown sandbox backend {backend!r}: use bubblewrap or docker")


class SandboxPool:
    def __init__(
        self,
        *,
        settings: SandboxSettings | None = None,
        max_sandboxes: int | None = None,
        warm: int | None = None,
    ) -> None:
        self.settings = settings or sandbox_settings()
        self.max_sandboxes = max_sandboxes or self.settings.pool_max
        self.warm = self.settings.pool_warm if warm is None else warm
        self.cond = threading.Condition()
        self.idle: dict[Environment, list[Sandbox]] = {}
        self.live = 0  # idle, busy and starting
        self.busy = 0
        self.replaced = 0
        self.closed = False

    def environment(self, spec: SandboxSpec) -> Environment:
        backend = spec.backend or self.settings.backend
        image = spec.image or (self.settings.image if backend == "docker" else "")
        return (backend, image, spec.limits)

    @contextmanager
    def acquire(self, spec: SandboxSpec, *, timeout: float | None = None) -> Iterator[Sandbox]:
        """A sandbox in the pristine state of spec, exclusively yours until the block ends."""
        sandbox = self.checkout(spec, timeout=timeout)
        try:
            yield sandbox
        finally:
            self.release(sandbox)

    def checkout(self, spec: SandboxSpec, *, timeout: float | None = None) -> Sandbox:
        environment = self.environment(spec)
        evicted, sandbox = None, None
        with self.cond:
            if not self.cond.wait_for(lambda: self.closed or self.busy < self.max_sandboxes, timeout):
                raise InfrastructureError(f"no sandbox free within {timeout} s ({self.max_sandboxes} in use)")
            if self.closed:
                raise InfrastructureError("the sandbox pool is closed")
            self.busy += 1
            if self.idle.get(environment):
                sandbox = self.idle_pop(self.idle[environment], spec.files_digest)
            else:
                evicted = self.evict_one_idle() if self.live >= self.max_sandboxes else None
                self.live += 1
        if evicted is not None:
            evicted.close()
        try:
            if sandbox is None:
                return sandbox_create(spec, self.settings)
            if sandbox.files_digest != spec.files_digest:
                sandbox.install(spec.files, lazily=True)  # sent with its first use
            return sandbox
        except BaseException:
            if sandbox is not None:
                sandbox.close()
            with self.cond:
                self.busy -= 1
                self.live -= 1
                self.cond.notify_all()
            raise

    @staticmethod
    def idle_pop(idle: list[Sandbox], files_digest: str) -> Sandbox:
        """The idle sandbox that already holds these files (the next completion of the same item,
        a GRPO group's), else the most recently used one."""
        for index in range(len(idle) - 1, -1, -1):
            if idle[index].files_digest == files_digest:
                return idle.pop(index)
        return idle.pop()

    def release(self, sandbox: Sandbox) -> None:
        healthy = not sandbox.broken
        sandbox.stale = healthy  # reset by its next use, first thing, in the same round trip
        with self.cond:
            self.busy -= 1
            keep = healthy and not self.closed
            if keep:
                self.idle.setdefault(self.environment(sandbox.spec), []).append(sandbox)
            else:
                self.live -= 1
                self.replaced += not healthy
            self.cond.notify_all()
        if not keep:
            sandbox.close()
            if not healthy and not self.closed:
                self.prewarm_async(sandbox.spec, self.warm)

    def evict_one_idle(self) -> Sandbox | None:
        for sandboxes in self.idle.values():
            if sandboxes:
                self.live -= 1
                return sandboxes.pop(0)
        return None

    def prewarm(self, spec: SandboxSpec, count: int | None = None) -> int:
        """Start sandboxes for spec until `count` (default: the warm count) are idle; returns how many."""
        environment, started = self.environment(spec), 0
        target = self.warm if count is None else count
        while True:
            with self.cond:
                if (
                    self.closed
                    or len(self.idle.get(environment, [])) >= target
                    or self.live >= self.max_sandboxes
                ):
                    return started
                self.live += 1
            try:
                sandbox = sandbox_create(spec, self.settings)
            except BaseException:
                with self.cond:
                    self.live -= 1
                raise
            with self.cond:
                self.idle.setdefault(environment, []).append(sandbox)
                self.cond.notify_all()
            started += 1

    def prewarm_async(self, spec: SandboxSpec, count: int) -> None:
        def run() -> None:
            try:
                self.prewarm(spec, count)
            except InfrastructureError:
                pass  # the next acquire starts one itself and reports the failure to its caller

        threading.Thread(target=run, name="sandbox-prewarm", daemon=True).start()

    def stats(self) -> dict[str, int]:
        with self.cond:
            idle = sum(len(sandboxes) for sandboxes in self.idle.values())
            return {"live": self.live, "busy": self.busy, "idle": idle, "replaced": self.replaced}

    def close(self) -> None:
        with self.cond:
            self.closed = True
            sandboxes = [sandbox for group in self.idle.values() for sandbox in group]
            self.idle.clear()
            self.live -= len(sandboxes)
            self.cond.notify_all()
        for sandbox in sandboxes:
            sandbox.close()

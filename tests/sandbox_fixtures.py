"""Fixtures shared by the sandbox suites: a pool per backend, a sandbox, and a neighbour sandbox.

Every test runs on each backend. A backend that is not installed fails the test (CI installs both)
with the command that fixes it; nothing is skipped.
"""

import dataclasses
import os
import shutil

import pytest

from sandboxes.config import sandbox_settings
from sandboxes.interface import InfrastructureError, Limits, SandboxSpec
from sandboxes.pool import SandboxPool

BACKENDS = ["bubblewrap", "docker"]
# Small limits so that the hostile tests end fast.
LIMITS = Limits(
    cpu_seconds=2,
    memory_mb=160,
    max_processes=16,
    max_open_files=64,
    max_file_size_mb=1,
    max_output_bytes=64 * 1024,
    wall_seconds=4,
    workspace_mb=8,
)
SOLUTION_TESTS = "from solution import add\n\nassert add(1, 2) == 3\nassert add(2, 2) == 4\n"


def make_spec(backend: str, files: dict | None = None, limits: Limits = LIMITS) -> SandboxSpec:
    return SandboxSpec(backend=backend, files=files or {"test_solution.py": SOLUTION_TESTS}, limits=limits)


def backend_ready(backend: str) -> None:
    settings = sandbox_settings()
    if backend == "bubblewrap" and not shutil.which(settings.bwrap):
        pytest.fail(f"bubblewrap is not installed ({settings.bwrap}): run `make sandbox-deps`")
    if backend == "docker":
        from sandboxes.backend_docker import docker_image_check

        try:
            docker_image_check(settings, settings.image)
        except InfrastructureError as exc:
            fix = "`make sandbox-deps` installs and starts Docker; `make sandbox-image` builds the image"
            pytest.fail(f"{exc} ({fix})")


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request) -> str:
    backend_ready(request.param)
    return request.param


@pytest.fixture(scope="module")
def bubblewrap_pool():
    """A pool on one backend, for tests whose outcome does not depend on it (task formats,
    scoring): the hostile and sandbox suites hold both backends to the same behaviour."""
    backend_ready("bubblewrap")
    pool = SandboxPool(
        settings=dataclasses.replace(sandbox_settings(), backend="bubblewrap"), max_sandboxes=2, warm=0
    )
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def pool(backend):
    pool = SandboxPool(max_sandboxes=4, warm=0)
    yield pool
    pool.close()
    assert pool.stats()["live"] == 0


@pytest.fixture
def sandbox(pool, backend):
    with pool.acquire(make_spec(backend)) as sandbox:
        yield sandbox


@pytest.fixture
def neighbour(pool, backend):
    """A second sandbox on the same host, with a file of its own, to show it is unaffected."""
    secret = "neighbour-" + os.urandom(8).hex()
    with pool.acquire(make_spec(backend, {"secret.txt": secret})) as other:
        other.secret = secret
        yield other


def assert_unaffected(sandbox, neighbour) -> None:
    """The sandbox still answers, and the neighbour still has its file and runs code."""
    assert sandbox.health()
    assert sandbox.run_python("print(6 * 7)").stdout == "42\n"
    assert neighbour.read_file("secret.txt").decode() == neighbour.secret
    assert neighbour.run_python("print(open('secret.txt').read())").stdout == neighbour.secret + "\n"

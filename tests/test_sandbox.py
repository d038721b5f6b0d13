# The fixtures imported from sandbox_fixtures are test parameters here, not redefinitions:
# ruff: noqa: F811
"""The sandbox interface on every backend: execution, files, reset, per-test results, the pool."""

import os
import shutil
import signal
import socket
import tempfile
from dataclasses import replace
from pathlib import Path

import psutil
import pyseccomp
import pytest
from sandbox_fixtures import (  # noqa: F401
    LIMITS,
    SOLUTION_TESTS,
    backend,
    backend_ready,
    make_spec,
    neighbour,
    pool,
    sandbox,
)

from sandboxes.backend_docker import DockerSandbox, docker_client
from sandboxes.channel import DockerAttachTransport
from sandboxes.config import sandbox_settings
from sandboxes.interface import InfrastructureError, Outcome, SandboxPathError, SandboxSpec, StopReason
from sandboxes.pool import SandboxPool
from sandboxes.uids import uid_claim


def test_exec_runs_a_shell_command_and_reports_how_it_ended(sandbox):
    result = sandbox.exec("echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert result.stop_reason == StopReason.EXITED
    assert not result.stdout_truncated and not result.stderr_truncated
    assert 0 < result.wall_seconds < 2 and result.cpu_seconds >= 0 and result.peak_memory_mb > 0


def test_exec_takes_an_argv_list_and_stdin(sandbox):
    result = sandbox.exec(
        ["/usr/bin/python3", "-c", "import sys; print(sys.stdin.read()[::-1])"], stdin="abc"
    )
    assert result.ok and result.stdout == "cba\n"


def test_exec_of_a_missing_program_exits_127(sandbox):
    result = sandbox.exec(["/no/such/program"])
    assert (result.exit_code, result.stop_reason) == (127, StopReason.EXITED)


def test_run_python_sees_the_workspace_and_a_minimal_environment(sandbox):
    sandbox.write_file("helper.py", "VALUE = 41\n")
    result = sandbox.run_python("import os, helper\nprint(helper.VALUE + 1, os.getcwd(), sorted(os.environ))")
    assert result.stdout == "42 /workspace ['HOME', 'LANG', 'PATH', 'PYTHONDONTWRITEBYTECODE', 'TMPDIR']\n"


def test_run_python_reports_an_exception_as_exit_code_1(sandbox):
    result = sandbox.run_python("raise ValueError('nope')")
    assert (result.exit_code, result.stop_reason) == (1, StopReason.EXITED)
    assert result.stderr.rstrip().endswith("ValueError: nope")


def test_files_round_trip_and_list_without_following_symlinks(sandbox):
    sandbox.write_file("pkg/data.bin", b"\x00\x01")
    sandbox.exec("ln -s /etc pkg/link")
    assert sandbox.read_file("pkg/data.bin") == b"\x00\x01"
    entries = {entry.path: (entry.kind, entry.size) for entry in sandbox.list_files()}
    assert entries == {
        "pkg": ("dir", 0),
        "pkg/data.bin": ("file", 2),
        "pkg/link": ("symlink", 0),
        "test_solution.py": ("file", len(SOLUTION_TESTS)),
    }


def test_reading_a_missing_file_raises_file_not_found(sandbox):
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("absent.txt")


@pytest.mark.parametrize("path", ["../x", "a/../../x", "/etc/passwd", "/proc/self/root/etc/passwd", "", "."])
def test_paths_outside_the_workspace_are_refused(sandbox, path):
    with pytest.raises(SandboxPathError):
        sandbox.write_file(path, "x")
    with pytest.raises(SandboxPathError):
        sandbox.read_file(path)
    assert [entry.path for entry in sandbox.list_files()] == ["test_solution.py"]


def test_symlinks_are_refused_by_the_file_api(sandbox):
    sandbox.exec("ln -s / root; ln -s /etc/passwd passwd; ln -s /proc/self/root self; mkdir d; ln -s .. d/up")
    for path in ("root/etc/passwd", "passwd", "self/etc/passwd", "d/up/test_solution.py"):
        with pytest.raises(SandboxPathError):
            sandbox.read_file(path)
    for path in ("root/tmp/x", "passwd", "d/up/x"):
        with pytest.raises(SandboxPathError):
            sandbox.write_file(path, "x")
    assert sandbox.exec("cat /etc/passwd | wc -l").stdout.strip() == "2"


def test_reset_restores_the_initial_files_and_ends_every_process(sandbox):
    sandbox.write_file("test_solution.py", "assert False\n")
    sandbox.write_file("extra/new.txt", "x")
    sandbox.exec("chmod 000 extra; echo t > /tmp/t")
    sandbox.reset()
    assert [entry.path for entry in sandbox.list_files()] == ["test_solution.py"]
    assert sandbox.read_file("test_solution.py").decode() == SOLUTION_TESTS
    assert sandbox.exec("ls -A /tmp").stdout == ""


def test_nothing_an_execution_started_outlives_it(sandbox):
    started = sandbox.exec("(sleep 100 &) ; nohup sleep 100 >/dev/null 2>&1 & echo started")
    assert started.stdout == "started\n" and started.wall_seconds < 2
    listing = sandbox.run_python(
        "import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
    )
    pids = eval(listing.stdout)  # noqa: S307  (a list of ints printed by our own snippet)
    assert pids[0] == 1 and len(pids) == 2


def test_run_tests_gives_one_result_per_test_function(sandbox):
    tests = (
        "from solution import add\n"
        "def test_pass():\n    assert add(1, 2) == 3\n"
        "def test_fail():\n    assert add(1, 1) == 3, 'one and one'\n"
        "def test_error():\n    {}['missing']\n"
        "def test_slow():\n    while True:\n        pass\n"
    )
    sandbox.write_file("solution.py", "def add(a, b):\n    return a + b\n")
    run = sandbox.run_tests("t.py", source=tests, per_test_seconds=0.3)
    assert run.outcomes() == {
        "test_pass": Outcome.PASS,
        "test_fail": Outcome.FAIL,
        "test_error": Outcome.ERROR,
        "test_slow": Outcome.TIMEOUT,
    }
    messages = {test.name: test.message for test in run.tests}
    assert messages["test_fail"] == "AssertionError: one and one"
    assert messages["test_error"] == "KeyError: 'missing'"
    assert run.passed == 1 and not run.all_passed


def test_run_tests_treats_each_top_level_assert_as_a_test_named_by_line(sandbox):
    sandbox.write_file("solution.py", "def add(a, b):\n    return a + b if a != 2 else 5\n")
    run = sandbox.run_tests("test_solution.py")
    assert run.outcomes() == {"line 3": Outcome.PASS, "line 4": Outcome.FAIL}
    assert run.tests[1].message == "line 4: assert add(2, 2) == 4"


def test_run_tests_reports_an_overall_timeout_on_the_running_test(sandbox):
    sandbox.write_file("solution.py", "def add(a, b):\n    while True:\n        pass\n")
    run = sandbox.run_tests("test_solution.py", timeout=0.5)
    assert run.execution.stop_reason == StopReason.TIMEOUT
    assert run.outcomes() == {"line 3": Outcome.TIMEOUT, "line 4": Outcome.ERROR}


def test_run_tests_of_a_file_that_is_not_an_initial_file_needs_its_source(sandbox):
    sandbox.write_file("test_mine.py", "assert True\n")
    with pytest.raises(ValueError, match="not one of the sandbox's initial files"):
        sandbox.run_tests("test_mine.py")


def test_files_given_with_an_execution_are_written_first_in_the_same_request(sandbox):
    run = sandbox.run_tests("test_solution.py", files={"solution.py": "def add(a, b):\n    return a + b\n"})
    assert [test.outcome for test in run.tests] == [Outcome.PASS, Outcome.PASS]
    assert sandbox.read_file("solution.py") == b"def add(a, b):\n    return a + b\n"
    result = sandbox.exec("cat note.txt; cat -", files={"note.txt": "from files "}, stdin="and stdin")
    assert result.stdout == "from files and stdin"
    assert sandbox.run_python("print(open('x.py').read())", files={"x.py": "x = 1"}).stdout == "x = 1\n"


def test_a_refused_path_among_the_files_runs_nothing(sandbox):
    with pytest.raises(SandboxPathError, match="'..' is refused"):
        sandbox.run_python("open('ran.txt', 'w').write('yes')", files={"../escape.py": "x = 1"})
    assert "ran.txt" not in [entry.path for entry in sandbox.list_files()]


def test_the_pool_reuses_a_warm_sandbox_for_another_task(pool, backend):
    with pool.acquire(make_spec(backend, {"a.txt": "a"})) as first:
        pid = first.server_pid
        first.write_file("scratch", "x")
    with pool.acquire(make_spec(backend, {"b.txt": "b"})) as second:
        assert second.server_pid == pid
        assert [entry.path for entry in second.list_files()] == ["b.txt"]


def kill_server(sandbox) -> None:
    if sandbox.backend == "docker":
        sandbox.container.kill()
    else:
        for child in psutil.Process(sandbox.process.pid).children(recursive=True):
            child.send_signal(signal.SIGKILL)


def test_a_sandbox_whose_server_died_raises_infrastructure_error_and_is_replaced(pool, backend):
    spec = make_spec(backend)
    with pool.acquire(spec) as broken:
        kill_server(broken)
        with pytest.raises(InfrastructureError):
            broken.run_python("print(1)")
    assert broken.broken
    with pool.acquire(spec) as fresh:
        assert fresh is not broken and fresh.run_python("print(1)").stdout == "1\n"


def test_the_pool_limits_concurrency(backend):
    pool = SandboxPool(max_sandboxes=1, warm=0)
    try:
        with pool.acquire(make_spec(backend)):
            with pytest.raises(InfrastructureError, match="no sandbox free"):
                pool.checkout(make_spec(backend), timeout=0.05)
    finally:
        pool.close()


def test_closing_the_pool_leaves_no_process_or_container(backend):
    pool = SandboxPool(max_sandboxes=2, warm=0)
    with pool.acquire(make_spec(backend)) as sandbox:
        handle = sandbox.container if backend == "docker" else psutil.Process(sandbox.process.pid)
    pool.close()
    if backend == "docker":
        import docker.errors

        with pytest.raises(docker.errors.NotFound):
            handle.reload()
    else:
        assert not handle.is_running() or handle.status() == psutil.STATUS_ZOMBIE


def test_a_missing_image_is_an_infrastructure_error_naming_the_fix(backend):
    pool = SandboxPool(max_sandboxes=1, warm=0)
    spec = SandboxSpec(backend="docker", image="flywheel-sandbox:no-such-tag", limits=LIMITS)
    try:
        with pytest.raises(InfrastructureError, match="make sandbox-image"):
            pool.checkout(spec)
        assert pool.stats() == {"live": 0, "busy": 0, "idle": 0, "replaced": 0}
    finally:
        pool.close()


def docker_sandbox(state_dir: Path) -> DockerSandbox:
    backend_ready("docker")
    return DockerSandbox(make_spec("docker"), replace(sandbox_settings(), state_dir=str(state_dir)))


@pytest.fixture
def state_dir():
    """A sandbox state directory that the sandboxes' uids can traverse, as the real one is."""
    path = Path(tempfile.mkdtemp(prefix="flywheel-test-sandboxes-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_remote_docker_engine_is_reached_through_the_attached_stream(state_dir, monkeypatch):
    monkeypatch.setattr(DockerSandbox, "_engine_is_local", lambda self: False)
    sandbox = docker_sandbox(state_dir).start()
    try:
        assert isinstance(sandbox.channel.transport, DockerAttachTransport)
        sandbox.write_file("solution.py", "def add(a, b):\n    return a + b if a != 2 else 5\n")
        run = sandbox.run_tests("test_solution.py")
        assert run.outcomes() == {"line 3": Outcome.PASS, "line 4": Outcome.FAIL}
    finally:
        sandbox.close()
    assert not any(state_dir.glob("docker-*"))


def test_the_docker_control_socket_accepts_only_the_sandbox_uid(state_dir):
    sandbox = docker_sandbox(state_dir)
    sandbox.lease = uid_claim(base=sandbox.settings.uid_base, state_dir=str(state_dir))
    listener = sandbox._control_listen()
    path = str(sandbox.control_dir / "ctl.sock")
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    impostor.connect(path)  # this test's own uid, not the sandbox's
    connected, told = os.pipe()
    child = os.fork()
    if child == 0:  # the sandbox's uid, as the server in the container would be
        status = 1
        try:
            os.setgid(sandbox.lease.uid)
            os.setuid(sandbox.lease.uid)
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(path)
            server.sendall(b"ready")
            status = 0
        finally:
            os.write(told, b"x")
            os._exit(status)
    try:
        os.read(connected, 1)  # both connections now wait in the listener's backlog
        _, status = os.waitpid(child, 0)
        assert status == 0
        connection = sandbox._control_accept(listener)
        assert connection.recv(5) == b"ready"
        assert impostor.recv(1) == b""  # refused: closed without a word
    finally:
        sandbox.close()
    assert not any(state_dir.glob("docker-*"))


def test_the_docker_sweep_removes_stopped_sandbox_containers_only():
    """Left by a worker that died before its container's auto-removal: swept once per process."""
    from sandboxes.backend_docker import LABEL, docker_client, docker_sweep

    backend_ready("docker")
    settings = sandbox_settings()
    client = docker_client(settings.docker_host)
    stopped = client.containers.create(settings.image, command=["true"], labels={LABEL: "1"})
    running = client.containers.run(settings.image, command=["sleep", "60"], labels={LABEL: "1"}, detach=True)
    try:
        assert docker_sweep(settings) >= 1
        ids = {container.id for container in client.containers.list(all=True, filters={"label": LABEL})}
        assert stopped.id not in ids and running.id in ids
    finally:
        running.remove(force=True)


KEYRING_PROBE = (
    "import ctypes, errno\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "failed = libc.syscall({number}, 0, -3, 0) < 0\n"  # keyctl: the session keyring's id
    "print(errno.errorcode[ctypes.get_errno()] if failed else 'ok')\n"
)


@pytest.mark.parametrize(("mode", "expected"), [("on", "EPERM\n"), ("off", "ok\n")])
def test_the_seccomp_filter_is_what_refuses_the_kernel_keyring(backend, settings, mode, expected):
    """Docker's own profile refuses keyctl too; under bubblewrap only Flywheel's filter does."""
    settings.FLYWHEEL_SANDBOX_SECCOMP = mode
    if backend == "docker" and mode == "off":
        expected = "EPERM\n"
    probe = KEYRING_PROBE.format(number=pyseccomp.resolve_syscall(pyseccomp.system_arch(), "keyctl"))
    pool = SandboxPool(max_sandboxes=1, warm=0)
    try:
        with pool.acquire(make_spec(backend)) as sandbox:
            assert sandbox.run_python(probe).stdout == expected
    finally:
        pool.close()


def test_a_remote_engine_takes_its_tls_files_from_the_setting_else_from_dockers_own_variables(
    settings, monkeypatch
):
    settings.FLYWHEEL_SANDBOX_DOCKER_CERT_PATH = ""
    monkeypatch.setenv("DOCKER_CERT_PATH", "/etc/docker-tls")
    monkeypatch.delenv("DOCKER_TLS_VERIFY", raising=False)
    assert sandbox_settings().docker_cert_path == ""  # as the docker CLI: no DOCKER_TLS_VERIFY, no TLS
    monkeypatch.setenv("DOCKER_TLS_VERIFY", "1")
    assert sandbox_settings().docker_cert_path == "/etc/docker-tls"
    settings.FLYWHEEL_SANDBOX_DOCKER_CERT_PATH = "/etc/flywheel/docker-tls"
    assert sandbox_settings().docker_cert_path == "/etc/flywheel/docker-tls"


def test_a_tls_folder_without_its_files_is_refused_naming_the_missing_ones(tmp_path):
    (tmp_path / "ca.pem").write_text("not used")
    missing = f"FLYWHEEL_SANDBOX_DOCKER_CERT_PATH {tmp_path}: no cert.pem, key.pem there"
    with pytest.raises(InfrastructureError, match=missing):
        docker_client("tcp://127.0.0.1:2376", str(tmp_path))


def test_an_unknown_seccomp_setting_is_refused(settings):
    settings.FLYWHEEL_SANDBOX_SECCOMP = "auto"
    with pytest.raises(ValueError, match="FLYWHEEL_SANDBOX_SECCOMP must be one of on, off, got 'auto'"):
        sandbox_settings()


def test_a_seccomp_filter_the_server_cannot_load_fails_the_sandbox_as_infrastructure(
    backend, settings, monkeypatch
):
    """A filter that does not load never means a sandbox without one: the server refuses to start."""
    settings.FLYWHEEL_SANDBOX_SECCOMP = "on"
    monkeypatch.setattr("sandboxes.sandbox.seccomp_program", lambda: "AAAA")  # 3 bytes: no whole instruction
    pool = SandboxPool(max_sandboxes=1, warm=0)
    try:
        with pytest.raises(InfrastructureError, match="cannot load the seccomp filter"):
            with pool.acquire(make_spec(backend)):
                pass
    finally:
        pool.close()

# The fixtures imported from sandbox_fixtures are test parameters here, not redefinitions:
# ruff: noqa: F811
"""Hostile code on every backend: each attack is contained, reports the right reason, and leaves the
sandbox, its neighbour and the host as they were."""

import json
import os
import subprocess
from pathlib import Path

import pyseccomp
import pytest
from django.conf import settings
from sandbox_fixtures import LIMITS, assert_unaffected, backend, make_spec, neighbour, pool, sandbox  # noqa: F401

from sandboxes.interface import Outcome, SandboxPathError, StopReason
from sandboxes.pool import SandboxPool

ROOT = Path(__file__).resolve().parent.parent


def test_a_fork_bomb_hits_the_process_limit(sandbox, neighbour):
    result = sandbox.run_python("import os\nwhile True:\n    os.fork()")
    assert (result.stop_reason, result.exit_code) == (StopReason.EXITED, 1)
    assert "BlockingIOError: [Errno 11] Resource temporarily unavailable" in result.stderr
    assert_unaffected(sandbox, neighbour)


def test_a_shell_fork_bomb_is_contained_and_cleaned_up(sandbox, neighbour):
    result = sandbox.exec("bomb() { bomb | bomb & }; bomb; sleep 1", timeout=2)
    assert result.stop_reason in (StopReason.EXITED, StopReason.TIMEOUT)
    processes = sandbox.run_python("import os; print(sum(p.isdigit() for p in os.listdir('/proc')))")
    assert processes.stdout == "2\n"  # the server and this check
    assert_unaffected(sandbox, neighbour)


@pytest.mark.parametrize(
    "code", ["x = bytearray(10**9)", "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))"]
)
def test_a_memory_bomb_stops_out_of_memory(sandbox, neighbour, code):
    result = sandbox.run_python(code)
    assert result.stop_reason == StopReason.OUT_OF_MEMORY
    assert result.peak_memory_mb < LIMITS.memory_mb
    assert_unaffected(sandbox, neighbour)


def test_a_memory_bomb_in_a_child_program_stops_out_of_memory(sandbox, neighbour):
    result = sandbox.exec(["python3", "-c", "x = bytearray(10**9)"])
    assert (result.stop_reason, result.exit_code) == (StopReason.OUT_OF_MEMORY, 1)
    assert_unaffected(sandbox, neighbour)


SPREAD_MEMORY = """
import os, time
children = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        block = b"x" * (100 << 20)  # each process stays under memory_mb
        time.sleep(1)
        os._exit(0)
    children.append(pid)
print([os.waitpid(pid, 0)[1] for pid in children])
"""


def test_memory_spread_over_processes_stops_out_of_memory(sandbox, neighbour):
    """Three processes of 100 MB each pass the sandbox's memory (160 + 2 × 8 + 64 MB) together:
    the sandbox's cgroup takes one of them, never the server."""
    if sandbox.backend == "bubblewrap" and sandbox.cgroup is None:
        pytest.skip("this host gives the worker no cgroups: memory is bounded per process only")
    result = sandbox.run_python(SPREAD_MEMORY, timeout=10)
    assert result.stop_reason == StopReason.OUT_OF_MEMORY
    assert sorted(json.loads(result.stdout)) == [0, 0, 9]  # one child SIGKILLed, two exited 0
    assert_unaffected(sandbox, neighbour)


def test_a_cpu_spin_stops_at_the_cpu_limit(sandbox, neighbour):
    result = sandbox.run_python("while True:\n    pass", timeout=30)
    assert result.stop_reason == StopReason.TIMEOUT
    assert LIMITS.cpu_seconds - 0.2 <= result.cpu_seconds < LIMITS.cpu_seconds + 1.5
    assert_unaffected(sandbox, neighbour)


def test_sleeping_forever_stops_at_the_wall_clock(sandbox, neighbour):
    result = sandbox.exec("sleep 1000", timeout=0.5)
    assert (result.stop_reason, result.exit_code) == (StopReason.TIMEOUT, None)
    assert 0.5 <= result.wall_seconds < 2
    assert_unaffected(sandbox, neighbour)


def test_a_gigabyte_of_stdout_stops_at_the_output_cap(sandbox, neighbour):
    result = sandbox.run_python("import sys\nfor _ in range(16384):\n    sys.stdout.write('x' * 65536)")
    assert result.stop_reason == StopReason.OUTPUT_CAP
    assert result.stdout_truncated and len(result.stdout) == LIMITS.max_output_bytes
    shell = sandbox.exec("yes | head -c 1000000000 >&2")
    assert shell.stop_reason == StopReason.OUTPUT_CAP and len(shell.stderr) == LIMITS.max_output_bytes
    assert_unaffected(sandbox, neighbour)


def test_a_huge_file_stops_at_the_file_size_limit(sandbox, neighbour):
    result = sandbox.run_python("with open('big', 'wb') as f:\n    f.write(b'x' * 10**8)")
    assert (result.stop_reason, result.exit_code) == (StopReason.EXITED, 1)
    assert "File too large" in result.stderr
    sizes = {entry.path: entry.size for entry in sandbox.list_files()}
    assert sizes["big"] <= LIMITS.max_file_size_mb << 20
    many = sandbox.exec("i=0; while head -c 1000000 /dev/zero > f$i; do i=$((i+1)); done; echo $i")
    assert int(many.stdout) < LIMITS.workspace_mb and "No space left on device" in many.stderr
    assert_unaffected(sandbox, neighbour)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("s = socket.create_connection(('1.1.1.1', 80), timeout=2)", "ENETUNREACH"),
        ("socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('8.8.8.8', 53))", "ENETUNREACH"),
        ("socket.create_connection(('127.0.0.1', 6379), timeout=2)", "ECONNREFUSED"),
        ("socket.getaddrinfo('example.com', 443)", "gaierror"),
    ],
)
def test_there_is_no_network(sandbox, neighbour, code, expected):
    probe = f"import errno, socket\ntry:\n    {code}\nexcept OSError as exc:\n"
    probe += (
        "    print(type(exc).__name__ if exc.errno not in errno.errorcode else errno.errorcode[exc.errno])\n"
    )
    probe += "else:\n    print('connected')"
    result = sandbox.run_python(probe)
    if expected == "gaierror":
        assert (
            result.stdout.startswith("EAI_") or result.stdout == "gaierror\n" or "gaierror" in result.stdout
        )
    else:
        assert result.stdout == expected + "\n"
    assert_unaffected(sandbox, neighbour)


def test_host_files_are_not_there(sandbox, neighbour):
    paths = ["/etc/shadow", str(ROOT / "webapp" / "settings.py"), str(ROOT), "/root", "/work"]
    database = settings.DATABASES["default"].get("NAME")
    if database and str(database).startswith("/"):
        paths.append(str(database))
    probe = f"import os\nfor p in {paths!r}:\n    print(os.path.exists(p))"
    assert sandbox.run_python(probe).stdout == "False\n" * len(paths)
    assert_unaffected(sandbox, neighbour)


def test_the_server_environment_is_unreadable_and_the_host_environment_absent(backend, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_TEST_SECRET", "hunter2")
    pool = SandboxPool(max_sandboxes=1, warm=0)
    try:
        with pool.acquire(make_spec(backend)) as fresh:
            denied = fresh.run_python("open('/proc/1/environ').read()")
            assert denied.stderr.rstrip().endswith(
                "PermissionError: [Errno 13] Permission denied: '/proc/1/environ'"
            )
            own = fresh.exec("cat /proc/self/environ; env").stdout
            assert "hunter2" not in own and "DJANGO" not in own and "FLYWHEEL" not in own
    finally:
        pool.close()


def test_another_sandboxs_workspace_is_out_of_reach(sandbox, neighbour):
    hunt = sandbox.exec(
        f"grep -rl {neighbour.secret} / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr"
    )
    assert hunt.stdout == ""
    assert (
        sandbox.run_python("import os; print(sorted(os.listdir('/workspace')))").stdout
        == "['test_solution.py']\n"
    )
    assert_unaffected(sandbox, neighbour)


def test_writing_outside_the_workspace_fails(sandbox, neighbour):
    probe = (
        "import errno\n"
        "for p in ['/usr/evil', '/etc/evil', '/evil', '/bin/sh', '/proc/sys/kernel/hostname']:\n"
        "    try:\n        open(p, 'w').write('x')\n"
        "    except OSError as exc:\n        print(errno.errorcode[exc.errno])\n"
        "    else:\n        print('wrote', p)\n"
    )
    lines = sandbox.run_python(probe).stdout.split()
    assert len(lines) == 5 and set(lines) <= {"EROFS", "EACCES", "EPERM"}
    assert_unaffected(sandbox, neighbour)


def test_killing_the_server_or_the_host_has_no_effect(sandbox, neighbour):
    server = sandbox.server_pid
    # Host processes the sandbox must not reach: this test's and a bystander of its own (not the
    # test's parent: a test run started in the background has init, pid 1, as its parent).
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        probe = (
            f"import os, signal\n"
            f"for pid in (1, -1, {os.getpid()}, {bystander.pid}):\n"
            f"    try:\n        os.kill(pid, signal.SIGKILL)\n"
            f"    except OSError as exc:\n        print(type(exc).__name__)\n"
            f"    else:\n        print('sent')\n"
        )
        result = sandbox.run_python(probe)
        assert result.stop_reason == StopReason.EXITED
        assert result.stdout.split()[0] == "sent"  # init ignores it
        assert result.stdout.split()[1:] == ["ProcessLookupError"] * 3
        assert bystander.poll() is None  # still alive
    finally:
        bystander.kill()
        bystander.wait()
    assert sandbox.server_pid == server and sandbox.health()
    assert_unaffected(sandbox, neighbour)


def test_a_process_that_kills_itself_is_reported_killed(sandbox):
    result = sandbox.run_python("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert (result.stop_reason, result.exit_code, result.signal) == (StopReason.KILLED, None, 9)


def test_setuid_and_new_privileges_are_impossible(sandbox, neighbour):
    probe = (
        "import errno, os\ntry:\n    os.setuid(0)\nexcept OSError as exc:\n"
        "    print(errno.errorcode[exc.errno])\n"
        "lines = open('/proc/self/status').read().splitlines()\n"
        "status = dict(line.split(':\\t') for line in lines if ':\\t' in line)\n"
        "print(status['NoNewPrivs'], status['CapEff'], os.getuid() != 0)"
    )
    refusal, rest = sandbox.run_python(probe).stdout.split("\n", 1)
    assert refusal in ("EPERM", "EINVAL")  # EINVAL: uid 0 is not even mapped in bubblewrap's namespace
    assert rest == "1 0000000000000000 True\n"
    assert_unaffected(sandbox, neighbour)


def test_the_proc_root_trick_through_the_file_api_is_refused(sandbox):
    sandbox.exec("ln -s /proc/self/root escape; ln -s /proc/1/cwd cwd")
    for path in ("escape/etc/passwd", "cwd/test_solution.py", "/proc/self/root/etc/passwd"):
        with pytest.raises(SandboxPathError):
            sandbox.read_file(path)


@pytest.mark.parametrize("exit_call", ["sys.exit(0)", "os._exit(0)"])
@pytest.mark.parametrize("style", ["asserts", "functions"])
def test_exiting_before_the_asserts_never_passes(sandbox, exit_call, style):
    sandbox.write_file("solution.py", f"import os, sys\ndef add(a, b):\n    return 0\n{exit_call}\n")
    source = "from solution import add\n"
    source += (
        "assert add(1, 2) == 3\n" if style == "asserts" else "def test_add():\n    assert add(1, 2) == 3\n"
    )
    run = sandbox.run_tests("t.py", source=source)
    assert [test.outcome for test in run.tests] == [Outcome.ERROR]
    assert run.passed == 0


def test_exiting_inside_a_test_never_passes(sandbox):
    sandbox.write_file("solution.py", "import os\ndef add(a, b):\n    os._exit(0)\n")
    run = sandbox.run_tests("test_solution.py")
    assert run.outcomes() == {"line 3": Outcome.ERROR, "line 4": Outcome.ERROR}


def test_forged_test_reports_are_ignored(sandbox):
    forged = '{"event": "end", "name": "line 3", "outcome": "pass", "nonce": "guess"}\\n'
    sandbox.write_file("solution.py", f"import os\nos.write(3, b'{forged}')\nos._exit(0)\n")
    run = sandbox.run_tests("test_solution.py")
    assert run.passed == 0


def test_rewriting_the_test_file_does_not_change_the_tests_that_run(sandbox):
    sandbox.write_file(
        "solution.py", "open('test_solution.py', 'w').write('assert True\\n')\ndef add(a, b):\n    return 0\n"
    )
    sandbox.write_file("test_solution.py", "assert True\n")
    run = sandbox.run_tests("test_solution.py")
    assert run.outcomes() == {"line 3": Outcome.FAIL, "line 4": Outcome.FAIL}


PROBED = (
    "keyctl",
    "add_key",
    "io_uring_setup",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "unshare",
    "mount",
    "ptrace",
)


def kernel_probe() -> str:
    """Code that calls each system call Flywheel's seccomp filter refuses (harmless arguments: a
    call the filter lets through just fails or succeeds) and prints each one's errno, or "ok"."""
    numbers = {name: pyseccomp.resolve_syscall(pyseccomp.system_arch(), name) for name in PROBED}
    return (
        "import ctypes, errno, json, threading\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "buffer = ctypes.create_string_buffer(256)\n"
        "def call(number, *args):\n"
        "    ctypes.set_errno(0)\n"
        "    failed = libc.syscall(number, *args) < 0\n"
        "    return errno.errorcode[ctypes.get_errno()] if failed else 'ok'\n"
        f"numbers = {numbers!r}\n"
        "calls = {\n"
        "    'keyctl': (0, -3, 0),\n"  # KEYCTL_GET_KEYRING_ID of the session keyring
        "    'add_key': (b'user', b'flywheel', b'x', 1, -4),\n"  # a key in the uid's user keyring
        "    'io_uring_setup': (1, buffer),\n"
        "    'bpf': (0, buffer, 64),\n"
        "    'perf_event_open': (buffer, 0, -1, -1, 0),\n"
        "    'userfaultfd': (0,),\n"
        "    'unshare': (0x10000000,),\n"  # CLONE_NEWUSER
        "    'mount': (b'none', b'/tmp', b'tmpfs', 0, None),\n"
        "    'ptrace': (16, 1, 0, 0),\n"  # PTRACE_ATTACH to the server
        "}\n"
        "result = {name: call(numbers[name], *args) for name, args in calls.items()}\n"
        "thread = threading.Thread(target=lambda: result.update(thread='ran'))\n"  # clone3 → clone
        "thread.start(); thread.join()\n"
        "print(json.dumps(result, sort_keys=True))\n"
    )


def test_kernel_interfaces_no_check_needs_are_refused(sandbox, neighbour):
    """Keyrings (a key outlives the sandbox under its uid, for the next lease to read), io_uring,
    eBPF, perf events, userfaultfd, namespaces, mounts and ptrace all fail with EPERM; threads still
    start (libc falls back from the refused clone3 to clone)."""
    result = sandbox.run_python(kernel_probe())
    assert json.loads(result.stdout) == {name: "EPERM" for name in PROBED} | {"thread": "ran"}
    assert_unaffected(sandbox, neighbour)

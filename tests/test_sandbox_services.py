# The fixtures imported from sandbox_fixtures are test parameters here, not redefinitions:
# ruff: noqa: F811
"""Sandbox services: a long-lived process inside the sandbox (an agent's MCP server) whose stdin and
stdout the host talks through. Executions spare it and still kill everything else they started;
a reset, a stop and the sandbox's end kill it. Every test runs on both backends."""

import time

from sandbox_fixtures import backend, make_spec, pool, sandbox  # noqa: F401

from sandboxes.interface import StopReason

ECHO = "import sys\nfor line in sys.stdin:\n    print('got ' + line.strip(), flush=True)\n"


FIND = """
import os, sys
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) not in (1, os.getpid()):  # not the server (its source says sleep)
        try:
            command = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode()
        except OSError:
            continue
        if sys.argv[1] in command:
            print(pid)
"""


def alive(sandbox, text: str) -> bool:
    """Whether a process whose command line holds `text` runs in the sandbox."""
    return bool(sandbox.exec(["python3", "-c", FIND, text]).stdout.strip())


def test_a_service_answers_line_by_line_and_lives_through_executions(sandbox):
    handle = sandbox.service_start(["python3", "-c", ECHO])
    assert sandbox.service_talk(handle, b"one\n", wait=5).lines == b"got one\n"
    result = sandbox.exec("sleep 30 & echo started")  # a background process the execution leaves
    assert result.stdout == "started\n" and result.stop_reason == StopReason.EXITED
    assert not alive(sandbox, "sleep 30")  # killed with its execution, the service notwithstanding
    output = sandbox.service_talk(handle, b"two\n", wait=5)
    assert (output.lines, output.exited) == (b"got two\n", False)


def test_a_services_end_is_reported_with_its_exit_code_and_stderr(sandbox):
    handle = sandbox.service_start(["python3", "-c", "import sys; sys.stderr.write('bye'); sys.exit(3)"])
    output = sandbox.service_talk(handle, b"", wait=5)
    assert (output.exited, output.exit_code, output.stderr) == (True, 3, "bye")
    missing = sandbox.service_talk(sandbox.service_start(["no-such-program"]), wait=5)
    assert (missing.exited, missing.exit_code) == (True, 127)
    assert missing.stderr == "no-such-program: No such file or directory\n"


def test_a_silent_service_is_waited_for_no_longer_than_asked(sandbox):
    handle = sandbox.service_start(["sleep", "30"])
    started = time.monotonic()
    output = sandbox.service_talk(handle, b"hello\n", wait=0.5)
    assert 0.5 <= time.monotonic() - started < 2
    assert (output.lines, output.exited) == (b"", False)


def test_a_line_past_the_cap_stops_the_service(sandbox):
    source = "import sys, time\nsys.stdout.write('x' * 5000)\nsys.stdout.flush()\ntime.sleep(30)\n"
    handle = sandbox.service_start(["python3", "-c", source])
    output = sandbox.service_talk(handle, wait=5, line_cap=1000)
    assert output.overflow and output.lines == b""
    assert not alive(sandbox, "time.sleep")
    assert sandbox.service_talk(handle, wait=0).exited  # stopped: nothing to talk to


def test_stop_and_reset_kill_a_service_and_what_it_started(sandbox):
    source = "import subprocess, time\nsubprocess.Popen(['sleep', '31'])\ntime.sleep(32)\n"
    handle = sandbox.service_start(["python3", "-c", source])
    sandbox.service_talk(handle, wait=0.3)
    assert alive(sandbox, "sleep 31")
    sandbox.service_stop(handle)
    assert not alive(sandbox, "sleep 31") and not alive(sandbox, "time.sleep(32)")
    sandbox.service_start(["sleep", "33"])
    sandbox.reset()
    assert not alive(sandbox, "sleep 33")


def test_a_service_runs_in_the_workspace_as_the_sandboxs_code_does(sandbox):
    handle = sandbox.service_start(
        ["/bin/sh", "-c", 'echo "$(pwd) $(id -u) $GREETING $(cat /proc/sys/kernel/hostname)"'],
        env={"GREETING": "hi"},
    )
    output = sandbox.service_talk(handle, wait=5)
    code_uid = sandbox.exec("id -u").stdout.strip()
    assert output.lines.decode() == f"/workspace {code_uid} hi sandbox\n"


def test_services_of_one_sandbox_stay_there(pool, backend):
    with pool.acquire(make_spec(backend)) as first, pool.acquire(make_spec(backend)) as second:
        first.service_start(["sleep", "34"])
        assert alive(first, "sleep 34") and not alive(second, "sleep 34")


def test_a_dead_child_a_service_never_reaps_does_not_hold_up_an_execution(sandbox):
    """Its zombie, in a session of its own, is not killed over and over: the service reaps it."""
    source = "import subprocess, time\nkid = subprocess.Popen(['true'], start_new_session=True)\n"
    source += "time.sleep(60)\n"
    handle = sandbox.service_start(["python3", "-c", source])
    sandbox.service_talk(handle, wait=0.5)  # the child has been and gone
    started = time.monotonic()
    assert sandbox.exec("echo ok").stdout == "ok\n"
    assert time.monotonic() - started < 3
    assert not sandbox.service_talk(handle, wait=0).exited

"""`manage.py check_sandboxes`: a real sandbox of each backend grades a check, or the command says why not."""

import io
import json

import pytest
from django.core.management import CommandError, call_command


def test_every_backend_starts_and_grades_the_check_right():
    out = io.StringIO()
    call_command("check_sandboxes", "--backend", "all", "--json", stdout=out)
    checks = {check["backend"]: check for check in json.loads(out.getvalue())}
    assert sorted(checks) == ["bubblewrap", "docker"]
    for check in checks.values():
        assert (check["ok"], check["detail"], check["seccomp"]) == (True, "graded right", "on")
        assert check["start_ms"] > 0 and check["check_ms"] > 0
    assert isinstance(checks["bubblewrap"]["cgroup"], bool) and checks["docker"]["cgroup"] is None


def test_the_human_report_gives_one_line_per_backend():
    out = io.StringIO()
    call_command("check_sandboxes", "--backend", "bubblewrap", stdout=out)
    (line,) = out.getvalue().splitlines()
    assert line.startswith("bubblewrap  ok      start ") and "seccomp on" in line


def test_a_host_that_cannot_run_sandboxes_fails_with_the_fix(settings):
    settings.FLYWHEEL_SANDBOX_BWRAP = "/nonexistent/bwrap"
    out = io.StringIO()
    with pytest.raises(CommandError, match="sandboxes not usable on this host: bubblewrap"):
        call_command("check_sandboxes", "--backend", "bubblewrap", stdout=out)
    assert out.getvalue() == (
        "bubblewrap  FAILED  bubblewrap (/nonexistent/bwrap) is not installed: run `make sandbox-deps` "
        "(Debian package bubblewrap)\n"
    )

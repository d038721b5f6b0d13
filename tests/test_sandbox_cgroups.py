"""The bubblewrap backend's cgroups: each sandbox in a group of its own with its limits, the group
gone when the sandbox closes, a group a dead worker left emptied and reused. Real cgroups (the
worker is root in CI); the cgroup v2 layout, which this host does not mount, is checked on files."""

import os
import subprocess
from dataclasses import replace

import pytest
from sandbox_fixtures import LIMITS, backend_ready, make_spec

from sandboxes.backend_bubblewrap import BubblewrapSandbox
from sandboxes.cgroups import cgroup_create, cgroup_version, cgroups_sweep, sandbox_memory_bytes
from sandboxes.config import sandbox_settings
from sandboxes.interface import Limits
from sandboxes.sandbox import SERVER_PIDS

pytestmark = pytest.mark.skipif(
    cgroup_version() == 0, reason="this host gives the worker no cgroups (not root, or no cgroupfs)"
)


@pytest.fixture
def bwrap_sandbox():
    backend_ready("bubblewrap")
    sandbox = BubblewrapSandbox(make_spec("bubblewrap"), sandbox_settings()).start()
    yield sandbox
    sandbox.close()


def read(path) -> str:
    return path.read_text().strip()


def test_a_sandbox_runs_in_its_own_cgroup_with_its_limits(bwrap_sandbox):
    group = bwrap_sandbox.cgroup
    assert group is not None and group.directories[0].name == f"sandbox-{bwrap_sandbox.lease.uid}"
    memory = sandbox_memory_bytes(LIMITS)
    assert memory == (160 + 2 * 8 + 64) << 20
    if group.version == 1:
        memory_dir, pids_dir, cpu_dir = group.directories
        assert int(read(memory_dir / "memory.limit_in_bytes")) == memory
        assert int(read(pids_dir / "pids.max")) == LIMITS.max_processes + SERVER_PIDS
        assert int(read(cpu_dir / "cpu.cfs_quota_us")) == int(LIMITS.cpus * 100_000)
    else:
        assert int(read(group.directories[0] / "memory.max")) == memory
    # The server (and bwrap's monitor) are inside, and so is what the code starts.
    assert bwrap_sandbox.process.pid in group.pids()  # the shell that joined the group became bwrap
    result = bwrap_sandbox.exec("sleep 0.5 & cat /proc/self/cgroup; wait")
    assert result.exit_code == 0
    assert len(group.pids()) >= 2


def test_closing_the_sandbox_removes_its_cgroup(bwrap_sandbox):
    directories = bwrap_sandbox.cgroup.directories
    assert all(directory.is_dir() for directory in directories)
    bwrap_sandbox.close()
    assert not any(directory.exists() for directory in directories)


def test_a_group_left_by_a_dead_worker_is_emptied_and_reused():
    limits = Limits(memory_mb=64, workspace_mb=8)
    name = f"sandbox-test-{os.getpid()}"
    group = cgroup_create(name, limits, memory_bytes=256 << 20, pids_max=16)
    stray = subprocess.Popen(["sleep", "60"])
    try:
        for procs in group.procs_files:
            with open(procs, "w") as handle:
                handle.write(str(stray.pid))
        assert group.pids() == [stray.pid]
        again = cgroup_create(name, limits, memory_bytes=128 << 20, pids_max=8)
        assert stray.wait(timeout=10) == -9
        assert again.directories == group.directories
        if again.version == 1:
            assert int(read(again.directories[0] / "memory.limit_in_bytes")) == 128 << 20
    finally:
        stray.kill()
        group.remove()
    assert not any(directory.exists() for directory in group.directories)


def test_the_sweep_removes_the_groups_of_dead_sandboxes_and_keeps_live_ones(bwrap_sandbox):
    """The leases of this host's sandboxes decide: a group whose uid nobody leases is a dead one's."""
    state_dir = sandbox_settings().state_dir
    dead = cgroup_create("sandbox-190001", Limits(), memory_bytes=64 << 20, pids_max=8)  # never leased
    live = bwrap_sandbox.cgroup
    assert cgroups_sweep(state_dir=state_dir) >= 1
    assert not any(directory.exists() for directory in dead.directories)
    assert all(directory.is_dir() for directory in live.directories)
    assert bwrap_sandbox.run_python("print(2 + 2)").stdout == "4\n"


def test_cgroups_off_runs_without_one():
    backend_ready("bubblewrap")
    settings = replace(sandbox_settings(), cgroups="off")
    sandbox = BubblewrapSandbox(make_spec("bubblewrap"), settings).start()
    try:
        assert sandbox.cgroup is None
        assert sandbox.run_python("print(1)").stdout == "1\n"
    finally:
        sandbox.close()


def test_the_cgroup_v2_layout_gets_its_limits_written(tmp_path):
    """cgroup v2 is not mounted here (this host is v1): its layout is checked on plain files."""
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    assert cgroup_version(tmp_path) == 2
    group = cgroup_create("sandbox-7", Limits(cpus=0.5), memory_bytes=300 << 20, pids_max=40, root=tmp_path)
    directory = tmp_path / "flywheel" / "sandbox-7"
    assert group.directories == (directory,)
    assert read(tmp_path / "cgroup.subtree_control") == "+memory +pids +cpu"
    assert read(tmp_path / "flywheel" / "cgroup.subtree_control") == "+memory +pids +cpu"
    assert (read(directory / "memory.max"), read(directory / "pids.max")) == (str(300 << 20), "40")
    assert read(directory / "cpu.max") == "50000 100000"
    assert group.procs_files == (str(directory / "cgroup.procs"),)
    assert group.oom_file == (str(directory / "memory.events"), "/sys/fs/cgroup/memory.events")


def test_an_unknown_cgroups_setting_is_refused(settings):
    settings.FLYWHEEL_SANDBOX_CGROUPS = "on"
    with pytest.raises(ValueError, match="FLYWHEEL_SANDBOX_CGROUPS must be one of auto, off, got 'on'"):
        sandbox_settings()

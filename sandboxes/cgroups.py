"""A control group per bubblewrap sandbox, where the host allows one.

Rlimits bound each process alone; a cgroup bounds all of a sandbox's processes together: its memory
(page cache and tmpfs workspace included), how many processes it runs, and its share of the CPU.
It also counts the OOM kills in it, which the fork server reads (through a read-only bind of that one
file) to report `out_of_memory` for a kill by the cgroup's OOM killer.

Needs a writable cgroup filesystem, so a worker running as root. Both layouts are handled:
cgroup v2 (one unified tree, `/sys/fs/cgroup/cgroup.controllers` present) and v1 (a tree per
controller, `/sys/fs/cgroup/memory`, `pids`, `cpu`). Groups live under `<tree>/flywheel/` and are
named after the sandbox's leased uid, which no two live sandboxes share; a group a dead worker left
behind is emptied and reused, and each worker process sweeps away the unleased ones once.
"""

import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .interface import Limits
from .sandbox import SERVER_MEMORY_MB
from .uids import uid_try

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "flywheel"
CFS_PERIOD_US = 100_000
V1_CONTROLLERS = ("memory", "pids", "cpu")
V2_CONTROLLERS = ("memory", "pids", "cpu")
# Where the fork server looks for the OOM counter (see CGROUP_OOM_FILES in runtime/server.py).
OOM_FILE_INSIDE = {1: "/sys/fs/cgroup/memory/memory.oom_control", 2: "/sys/fs/cgroup/memory.events"}


@dataclass(frozen=True)
class SandboxCgroup:
    version: int
    directories: tuple[Path, ...]  # v2: one; v1: one per controller, memory first

    @property
    def procs_files(self) -> tuple[str, ...]:
        """Write a pid to each to move that process (and the children it then forks) in."""
        return tuple(str(directory / "cgroup.procs") for directory in self.directories)

    @property
    def oom_file(self) -> tuple[str, str]:
        """(host path, path inside the sandbox) of the file that counts this group's OOM kills."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        return str(self.directories[0] / name), OOM_FILE_INSIDE[self.version]

    def pids(self) -> list[int]:
        found: set[int] = set()
        for directory in self.directories:
            try:
                found.update(int(line) for line in (directory / "cgroup.procs").read_text().split())
            except OSError:
                continue
        return sorted(found)

    def kill(self) -> None:
        """SIGKILL every process inside (a group reused from a dead worker may still hold some)."""
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def remove(self) -> None:
        """Kill anything still inside, then remove the group (best effort: a busy group stays and
        is emptied and reused by the next sandbox with this uid)."""
        for attempt in range(50):
            self.kill()
            try:
                for directory in self.directories:
                    if directory.exists():
                        directory.rmdir()
                return
            except OSError:
                time.sleep(0.01 * (attempt + 1))  # killed processes leave the group as they exit


def cgroup_version(root: Path = CGROUP_ROOT) -> int:
    """2 or 1 where this process may create groups with a memory controller, else 0."""
    if os.geteuid() != 0:
        return 0
    if (root / "cgroup.controllers").exists():  # a read-only tree (a container's, often) allows none
        available = (root / "cgroup.controllers").read_text().split()
        usable = all(name in available for name in V2_CONTROLLERS) and os.access(root, os.W_OK)
        return 2 if usable else 0
    if all(os.access(root / name / "cgroup.procs", os.W_OK) for name in V1_CONTROLLERS):
        return 1
    return 0


def sandbox_memory_bytes(limits: Limits) -> int:
    """A sandbox's whole memory: one execution's `memory_mb`, its two tmpfs (workspace and /tmp),
    and the server."""
    return (limits.memory_mb + 2 * limits.workspace_mb + SERVER_MEMORY_MB) << 20


def cgroup_create(
    name: str, limits: Limits, *, memory_bytes: int, pids_max: int, root: Path = CGROUP_ROOT
) -> SandboxCgroup | None:
    """The group for one sandbox with its limits written, or None where the host allows none."""
    version = cgroup_version(root)
    if version == 0:
        return None
    quota = max(1000, int(limits.cpus * CFS_PERIOD_US))
    if version == 2:
        parent = root / PARENT
        parent.mkdir(exist_ok=True)
        enable = " ".join(f"+{name}" for name in V2_CONTROLLERS)
        (root / "cgroup.subtree_control").write_text(enable)
        (parent / "cgroup.subtree_control").write_text(enable)
        directory = parent / name
        directory.mkdir(exist_ok=True)
        group = SandboxCgroup(2, (directory,))
        group.kill()
        write(directory / "memory.max", memory_bytes)
        write(directory / "memory.swap.max", 0, optional=True)
        write(directory / "pids.max", pids_max)
        (directory / "cpu.max").write_text(f"{quota} {CFS_PERIOD_US}")
        return group
    directories = []
    for controller in V1_CONTROLLERS:
        directory = root / controller / PARENT / name
        directory.mkdir(parents=True, exist_ok=True)
        directories.append(directory)
    group = SandboxCgroup(1, tuple(directories))
    group.kill()
    memory, pids, cpu = directories
    # memory+swap may never be under memory: lift it first, as a reused group may hold a lower one.
    write(memory / "memory.memsw.limit_in_bytes", -1, optional=True)
    write(memory / "memory.limit_in_bytes", memory_bytes)
    write(memory / "memory.memsw.limit_in_bytes", memory_bytes, optional=True)  # with swap accounting
    write(memory / "memory.swappiness", 0, optional=True)
    write(pids / "pids.max", pids_max)
    write(cpu / "cpu.cfs_period_us", CFS_PERIOD_US)
    write(cpu / "cpu.cfs_quota_us", quota)
    return group


def cgroups_sweep(*, state_dir: str, root: Path = CGROUP_ROOT) -> int:
    """Remove the groups that sandboxes of workers that died left behind: those whose uid no live
    sandbox leases (a live one holds its lease for its whole life). Returns how many."""
    version = cgroup_version(root)
    if version == 0:
        return 0
    parents = [root / PARENT] if version == 2 else [root / name / PARENT for name in V1_CONTROLLERS]
    names = {
        entry.name
        for parent in parents
        if parent.is_dir()
        for entry in parent.iterdir()
        if entry.is_dir() and entry.name.startswith("sandbox-")
    }
    removed = 0
    for name in sorted(names):
        uid = name.removeprefix("sandbox-")
        lease = uid_try(int(uid), state_dir=state_dir) if uid.isdigit() else None
        if lease is None:
            continue  # a live sandbox's, or not one of ours
        try:
            SandboxCgroup(version, tuple(parent / name for parent in parents)).remove()
            removed += 1
        finally:
            lease.release()
    return removed


_swept: set[str] = set()
_sweep_lock = threading.Lock()


def cgroups_sweep_once(*, state_dir: str) -> None:
    """cgroups_sweep, the first time a process asks (it starts sandboxes many times)."""
    with _sweep_lock:
        if state_dir in _swept:
            return
        _swept.add(state_dir)
    cgroups_sweep(state_dir=state_dir)


def write(path: Path, value: int, *, optional: bool = False) -> None:
    try:
        path.write_text(str(value))
    except FileNotFoundError:
        if not optional:
            raise

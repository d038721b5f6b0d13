"""The bubblewrap backend: the fork server in fresh user, PID, network, IPC and UTS namespaces.

Read-only /usr (and the merged-/usr links), a synthetic /etc of three files, its own /proc and
/dev, tmpfs workspace and /tmp, uid 65534 inside mapped to a host uid of its own (when the worker
is root; otherwise the worker's uid), no environment, no network at all, no new privileges. Where
the host allows (a root worker, a writable cgroup filesystem), the sandbox also runs in a cgroup of
its own that bounds the memory, processes and CPU of all its processes together (`cgroups.py`).
"""

import os
import shutil
import subprocess
from pathlib import Path

from .cgroups import SandboxCgroup, cgroup_create, cgroups_sweep_once, sandbox_memory_bytes
from .channel import PipeTransport
from .config import SandboxSettings
from .interface import InfrastructureError, SandboxSpec
from .sandbox import SERVER_PIDS, Sandbox, server_command
from .uids import UidLease, uid_claim

SANDBOX_UID = 65534
ETC_FILES = {
    "passwd": (
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        "sandbox:x:65534:65534:sandbox:/workspace:/usr/sbin/nologin\n"
    ),
    "group": "root:x:0:\nsandbox:x:65534:\n",
    "hostname": "sandbox\n",
}
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/workspace", "LANG": "C.UTF-8"}
# $1...: the group's cgroup.procs files, then "--" and the command to run inside the group.
JOIN_CGROUP = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


def bwrap_missing_message(path: str) -> str:
    return f"bubblewrap ({path}) is not installed: run `make sandbox-deps` (Debian package bubblewrap)"


class BubblewrapSandbox(Sandbox):
    backend = "bubblewrap"
    nproc_overhead = 2  # bwrap's monitor process and the server run under the sandbox's host uid

    def __init__(self, spec: SandboxSpec, settings: SandboxSettings) -> None:
        super().__init__(spec)
        self.settings = settings
        self.process: subprocess.Popen | None = None
        self.lease: UidLease | None = None
        self.cgroup: SandboxCgroup | None = None
        self.log_path = ""

    def _launch(self) -> PipeTransport:
        if not shutil.which(self.settings.bwrap):
            raise InfrastructureError(bwrap_missing_message(self.settings.bwrap))
        etc = etc_dir(self.settings.state_dir)
        as_root = os.geteuid() == 0
        if as_root:
            self.lease = uid_claim(base=self.settings.uid_base, state_dir=self.settings.state_dir)
            if self.settings.cgroups == "auto" and shutil.which("setpriv"):  # util-linux's, to drop root
                self.cgroup = self._cgroup_create(self.lease.uid)
        logs = Path(self.settings.state_dir) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = str(logs / f"bwrap-{os.getpid()}-{id(self)}.log")
        argv, env, uid = self.argv(etc), {}, self.lease.uid if self.lease else None
        if self.cgroup is not None:
            # A root shell joins the cgroup, then becomes the sandbox's uid and runs bwrap: all the
            # sandbox's processes are forked inside the group, none before it.
            argv = ["/bin/sh", "-c", JOIN_CGROUP, "join-cgroup", *self.cgroup.procs_files, "--"]
            argv += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *self.argv(etc)]
            env, uid = {"PATH": "/usr/bin:/bin"}, None
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                cwd="/",
                env=env,
                user=uid,
                group=uid,
                extra_groups=[] if uid is not None else None,
                start_new_session=True,
            )
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None  # both PIPE above
        return PipeTransport(stdin, stdout, self.log_path)

    def _cgroup_create(self, uid: int) -> SandboxCgroup | None:
        try:
            cgroups_sweep_once(state_dir=self.settings.state_dir)
            return cgroup_create(
                f"sandbox-{uid}",
                self.limits,
                memory_bytes=sandbox_memory_bytes(self.limits),
                pids_max=self.limits.max_processes + SERVER_PIDS,
            )
        except OSError as exc:
            raise InfrastructureError(
                f"could not set up the sandbox's cgroup ({exc}): FLYWHEEL_SANDBOX_CGROUPS=off goes without"
            ) from None

    def argv(self, etc: Path) -> list[str]:
        workspace_size = str(self.limits.workspace_mb << 20)
        args = [self.settings.bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc"]
        args += ["--unshare-uts", "--unshare-cgroup-try", "--disable-userns", "--as-pid-1", "--new-session"]
        args += ["--hostname", "sandbox", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--clearenv"]
        args += ["--ro-bind", "/usr", "/usr"]
        for name in ("bin", "sbin", "lib", "lib32", "lib64"):
            host = Path("/") / name
            if host.is_symlink():
                args += ["--symlink", os.readlink(host), f"/{name}"]
            elif host.is_dir():
                args += ["--ro-bind", str(host), f"/{name}"]
        args += ["--dir", "/etc"]
        for name in ETC_FILES:
            args += ["--ro-bind", str(etc / name), f"/etc/{name}"]
        args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
        args += ["--ro-bind-try", "/etc/alternatives", "/etc/alternatives"]
        args += ["--proc", "/proc", "--dev", "/dev"]
        if self.cgroup is not None:  # the server reads its OOM-kill counter there
            args += ["--ro-bind", *self.cgroup.oom_file]
        args += [
            "--size",
            workspace_size,
            "--tmpfs",
            "/workspace",
            "--size",
            workspace_size,
            "--tmpfs",
            "/tmp",
        ]
        args += ["--chmod", "1777", "/tmp", "--remount-ro", "/", "--chdir", "/workspace"]
        for name, value in ENV.items():
            args += ["--setenv", name, value]
        return args + server_command(self.settings.python, seccomp=self.settings.seccomp)

    def _terminate(self) -> None:
        if self.process is not None:
            # Its stdin closed, the server kills everything inside and exits; bwrap's monitor follows.
            try:
                self.process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
        if self.lease is not None:
            self.lease.release()
            self.lease = None
        if self.log_path:
            Path(self.log_path).unlink(missing_ok=True)
            self.log_path = ""


def etc_dir(state_dir: str) -> Path:
    folder = Path(state_dir) / "etc"
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o755)
    for name, content in ETC_FILES.items():
        path = folder / name
        if not path.exists() or path.read_text() != content:
            tmp = folder / f".{name}.{os.getpid()}"
            tmp.write_text(content)
            tmp.chmod(0o644)
            tmp.replace(path)
    folder.chmod(0o755)
    return folder

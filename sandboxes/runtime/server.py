"""The fork server: the one long-lived process inside a sandbox.

The host starts it once per sandbox as `python3 -I -c <this source> <workspace> [--connect PATH]
[--seccomp BPF]`; it installs the seccomp filter it is given (base64 BPF) before anything else, so
that every process in the sandbox inherits it, and runs as PID 1 of
the sandbox's PID namespace, so code inside cannot kill it (init ignores signals it has no handler
for) nor ptrace it (it makes itself non-dumpable). It speaks framed messages on the stdin/stdout it
was started with (or on a unix socket the host listens on), and for every execution forks a fresh
child that applies the limits, runs the code and is then killed together with everything it started.

A **service** is the one exception: a long-lived process the host starts with `spawn` (an MCP
server, say), in a session of its own, whose stdin and stdout the host reaches through `talk`.
Executions kill everything but the services' sessions; a reset, and the channel's end, kill them too.

Stdlib only, single-threaded, never imported by the host: model-written code runs in the children.
"""

import ast
import base64
import bisect  # noqa: F401  (pre-imported so that the children start warm)
import collections  # noqa: F401
import ctypes
import dataclasses  # noqa: F401
import errno
import fcntl
import functools
import gc
import heapq  # noqa: F401
import importlib
import io  # noqa: F401
import itertools  # noqa: F401
import json
import math
import os
import random  # noqa: F401  (pre-imported warm; its fork hook gives every child a fresh seed)
import re
import resource
import runpy
import select
import signal
import socket
import stat
import string  # noqa: F401
import struct
import sys
import time
import traceback
import types
import typing

HEADER = struct.Struct(">II")
READ_CHUNK = 65536
REPORT_CAP = 1 << 20
CHILD_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/workspace",
    "LANG": "C.UTF-8",
    "TMPDIR": "/tmp",
    "PYTHONDONTWRITEBYTECODE": "1",
}
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
CGROUP_OOM_FILES = (
    ("/sys/fs/cgroup/memory.events", "oom_kill"),
    ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill"),
)
LIBC: ctypes.CDLL | None
try:
    LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:
    LIBC = None
MEMORY_CGROUP_VISIBLE = any(os.path.exists(path) for path, _ in CGROUP_OOM_FILES)


class PathRefusedError(Exception):
    """A path that leaves the workspace, is absolute, or goes through a symlink."""


class Server:
    def __init__(self, workspace: str, ctl_in: int, ctl_out: int) -> None:
        self.workspace = workspace
        self.ctl_in = ctl_in
        self.ctl_out = ctl_out
        self.pristine: list[tuple[str, int, bytes]] = []
        self.compiled: dict[tuple[str, str, str], TestProgram] = {}
        self.nproc_overhead = 1
        self.oom = OomCounter()
        self.oom_kills_seen = self.oom.read()  # OOM kills only happen while code runs: read once after each
        self.services: dict[int, Service] = {}  # by pid, which is also its session id

    # -- framing -------------------------------------------------------------------------------

    def read_exact(self, size: int) -> bytes:
        chunks = []
        while size:
            chunk = os.read(self.ctl_in, min(size, 1 << 20))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def receive(self) -> tuple[dict, bytes]:
        head_len, blob_len = HEADER.unpack(self.read_exact(HEADER.size))
        return json.loads(self.read_exact(head_len)), self.read_exact(blob_len)

    def send(self, head: dict, blob: bytes = b"") -> None:
        raw = json.dumps(head).encode()
        data = memoryview(HEADER.pack(len(raw), len(blob)) + raw + blob)
        while data:
            data = data[os.write(self.ctl_out, data) :]

    def serve(self) -> None:
        self.send({"ok": True, "pid": os.getpid(), "python": sys.version.split()[0]})
        while True:
            try:
                head, blob = self.receive()
            except EOFError:
                kill_everything()
                return
            try:
                reply, out = getattr(self, "op_" + head["op"])(head, blob)
            except PathRefusedError as exc:
                reply, out = {"error": "path", "message": str(exc)}, b""
            except FileNotFoundError as exc:
                reply, out = {"error": "not_found", "message": f"no such file: {exc.filename}"}, b""
            except Exception:  # noqa: BLE001  (reported to the host as an infrastructure error)
                reply, out = {"error": "internal", "message": traceback.format_exc()}, b""
            self.send(reply, out)

    # -- operations ----------------------------------------------------------------------------

    def op_ping(self, head: dict, blob: bytes) -> tuple[dict, bytes]:
        return {"ok": True, "pid": os.getpid()}, b""

    def op_install(self, head: dict, blob: bytes) -> tuple[dict, bytes]:
        self.take_pristine(head["files"], blob, head.get("nproc_overhead", 1))
        return self.op_reset(head, b"")

    def take_pristine(self, entries: list, blob: bytes, nproc_overhead: int) -> int:
        """The files that reset restores; returns how many bytes of blob they took. (The compiled
        tests stay: they are keyed by their source.)"""
        files, offset = [], 0
        for path, mode, size in entries:
            split_path(path)
            files.append((path, mode, blob[offset : offset + size]))
            offset += size
        self.pristine = files
        self.nproc_overhead = nproc_overhead
        return offset

    def op_reset(self, head: dict, blob: bytes) -> tuple[dict, bytes]:
        started = time.perf_counter()
        kill_everything()
        self.services_forget()
        for root in (self.workspace, "/tmp"):
            wipe(root)
        for path, mode, content in self.pristine:
            self.write(path, content, mode)
        return {"ok": True, "seconds": time.perf_counter() - started}, b""

    def op_write(self, head: dict, blob: bytes) -> tuple[dict, bytes]:
        self.write(head["path"], blob, head.get("mode", 0o644))
        return {"ok": True}, b""

    def op_read(self, head: dict, blob: bytes) -> tuple[dict, bytes]:
        parts = split_path(head["path"])
        parent = self.open_parent(parts, create=False)
        try:
            fd = open_leaf(parts[-1], parent, os.O_RDONLY | os.O_NONBLOCK)
        finally:
            os.close(parent)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise PathRefusedError(f"{head['path']}: not a regular file")
            limit, chunks, total = head["max_bytes"], [], 0
            while total <= limit:
                chunk = os.read(fd, min(READ_CHUNK, limit + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
        finally:
            os.close(fd)
        data = b"".join(chunks)
        return {"ok": True, "truncated": len(data) > limit}, data[:limit]

    def op_list(self, head: dict, blob: bytes) -> tuple[dict, bytes]:
        entries: list[list] = []
        fd = os.open(self.workspace, os.O_RDONLY | os.O_DIRECTORY)
        try:
            list_into(fd, "", entries, head["max_entries"])
        finally:
            os.close(fd)
        return {"ok": True, "entries": entries}, b""

    def op_exec(self, head: dict, blob: bytes) -> tuple[dict, bytes]:
        if head.get("install") is not None:  # the next spec's files, installed in this round trip
            blob = blob[self.take_pristine(head["install"], blob, head.get("nproc_overhead", 1)) :]
            self.op_reset(head, b"")
        elif head.get("reset_first"):  # the pool's reset of a returned sandbox, in this round trip
            self.op_reset(head, b"")
        offset = 0
        for path, mode, size in head.get("files", ()):  # written first; a refused path runs nothing
            self.write(path, blob[offset : offset + size], mode)
            offset += size
        if head["kind"] == "tests":
            self.compile_once(head)
        reply = Execution(self, head, blob[offset:]).run()
        reply["findings"] = workspace_findings(self.workspace, self.pristine, head.get("protected", ()))
        return reply, b""

    def op_spawn(self, head: dict, blob: bytes) -> tuple[dict, bytes]:
        """Start a service: argv with the limits, in the workspace, in a session of its own."""
        pipes = {name: os.pipe() for name in ("stdin", "stdout", "stderr")}
        pid = os.fork()
        if pid == 0:
            service_main(self, head, pipes)
        for name, (read_end, write_end) in pipes.items():
            os.close(read_end if name == "stdin" else write_end)
        service = Service(pid, pipes["stdin"][1], pipes["stdout"][0], pipes["stderr"][0])
        self.services[pid] = service
        return {"ok": True, "handle": pid}, b""

    def op_talk(self, head: dict, blob: bytes) -> tuple[dict, bytes]:
        """Write blob to a service's stdin, then wait up to `wait` seconds for a whole line of its
        stdout; answer with every whole line it has written so far (a partial one waits)."""
        service = self.services.get(head["handle"])
        if service is None:  # stopped, or gone with a reset
            return {"ok": True, "exited": True, "exit_code": None, "signal": None, "stderr": ""}, b""
        service.talk(blob, time.monotonic() + head["wait"], head["line_cap"])
        self.reap_nohang()
        status = service.status
        reply = {
            "ok": True,
            "exited": status is not None,
            "exit_code": os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None,
            "stderr": bytes(service.stderr).decode("latin-1"),
            "overflow": service.overflow,
        }
        lines = service.take_lines()
        if service.overflow:
            self.service_stop(service)
        return reply, lines

    def op_stop(self, head: dict, blob: bytes) -> tuple[dict, bytes]:
        service = self.services.get(head["handle"])
        if service is not None:
            self.service_stop(service)
        return {"ok": True}, b""

    def service_stop(self, service: "Service") -> None:
        """Kill the service's session (it and what it started), reap it, close its pipes."""
        kill_sessions_but(set(self.services) - {service.pid}, self)
        service.close()
        self.services.pop(service.pid, None)

    def services_forget(self) -> None:
        """After kill_everything: every service is gone."""
        for service in self.services.values():
            service.close()
        self.services.clear()

    def kill_but_services(self) -> None:
        """After an execution: everything the code started, sparing the services' sessions."""
        if not self.services:
            kill_everything()
            return
        kill_sessions_but(set(self.services), self)

    def reap_nohang(self) -> int:
        """Reap whatever child has ended, without waiting; a service's status is kept. How many."""
        reaped = 0
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return reaped
            if pid == 0:
                return reaped
            reaped += 1
            if pid in self.services:
                self.services[pid].status = status

    def compile_once(self, head: dict) -> None:
        """The pristine tests compiled here, once per source, so that no child parses or compiles
        them: the compiler's allocations in a child would copy pages of the server's heap on every
        run. A source that does not compile is left to the child, which reports the error."""
        key = (head["path"], head["style"], head["source"])
        if key in self.compiled:
            return
        try:
            program = compile_tests(head["source"], head["path"], head["style"])
        except (SyntaxError, ValueError, IndexError, MemoryError, RecursionError):
            return
        if len(self.compiled) >= COMPILED_CAP:
            del self.compiled[next(iter(self.compiled))]  # the oldest
        self.compiled[key] = program

    # -- helpers -------------------------------------------------------------------------------

    def write(self, path: str, content: bytes, mode: int) -> None:
        parts = split_path(path)
        parent = self.open_parent(parts, create=True)
        try:
            fd = open_leaf(parts[-1], parent, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK, mode)
        finally:
            os.close(parent)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise PathRefusedError(f"{path}: not a regular file")
            os.fchmod(fd, mode & 0o777)
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    def open_parent(self, parts: list[str], *, create: bool) -> int:
        """A directory fd for the parent of the last part, walked one component at a time, no symlinks."""
        fd = os.open(self.workspace, os.O_RDONLY | os.O_DIRECTORY)
        for part in parts[:-1]:
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise PathRefusedError(
                        f"{'/'.join(parts)}: {part} is a symlink or not a directory"
                    ) from None
                raise
            os.close(fd)
            fd = child
        return fd


def split_path(path: str) -> list[str]:
    if not isinstance(path, str) or not path or "\x00" in path:
        raise PathRefusedError(f"{path!r}: not a path")
    if path.startswith("/"):
        raise PathRefusedError(f"{path}: absolute paths are refused; give a path inside the workspace")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise PathRefusedError(f"{path}: '..' is refused; give a path inside the workspace")
    if not parts:
        raise PathRefusedError(f"{path!r}: names the workspace itself, not a file")
    return parts


def open_leaf(name: str, parent: int, flags: int, mode: int = 0o644) -> int:
    try:
        return os.open(name, flags | os.O_NOFOLLOW, mode, dir_fd=parent)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PathRefusedError(f"{name}: is a symlink; symlinks are refused") from None
        if exc.errno == errno.EISDIR:
            raise PathRefusedError(f"{name}: is a directory") from None
        raise


def list_into(fd: int, prefix: str, entries: list[list], limit: int) -> None:
    for entry in sorted(os.scandir(fd), key=lambda e: e.name):
        if len(entries) >= limit:
            return
        path = prefix + entry.name
        if entry.is_symlink():
            entries.append([path, "symlink", 0])
        elif entry.is_dir(follow_symlinks=False):
            entries.append([path, "dir", 0])
            try:
                child = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:
                continue
            try:
                list_into(child, path + "/", entries, limit)
            finally:
                os.close(child)
        elif entry.is_file(follow_symlinks=False):
            entries.append([path, "file", entry.stat(follow_symlinks=False).st_size])
        else:
            entries.append([path, "other", 0])


def wipe(root: str) -> None:
    """Empty a directory without following symlinks, undoing any chmod the code inside did."""
    os.chmod(root, 0o1777 if root == "/tmp" else 0o755)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        wipe_fd(fd)
    finally:
        os.close(fd)


def wipe_fd(fd: int) -> None:
    for entry in list(os.scandir(fd)):
        if entry.is_dir(follow_symlinks=False):
            os.chmod(entry.name, 0o700, dir_fd=fd)
            child = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            try:
                wipe_fd(child)
            finally:
                os.close(child)
            os.rmdir(entry.name, dir_fd=fd)
        else:
            os.unlink(entry.name, dir_fd=fd)


def kill_everything() -> None:
    """Every process in the namespace but this one: as PID 1, kill(-1) reaches them all."""
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            while os.waitpid(-1, 0):
                pass
        except ChildProcessError:
            return


def kill_sessions_but(spared: set[int], server: Server) -> None:
    """Every process in the namespace but this one and those of the `spared` sessions (the live
    services'), reaped; a service that is not spared is killed with its session."""
    me = os.getpid()
    while True:
        victims = 0
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == me:
                continue
            state, session = process_state(int(name))
            if state in ("", "Z") or session in spared:  # gone, or dead already (its parent reaps it)
                continue
            try:
                os.kill(int(name), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
            victims += 1
        reaped = server.reap_nohang()
        if not victims:
            return
        if not reaped:
            time.sleep(0.001)  # killed, not yet dead: their deaths are a few microseconds away


def process_state(pid: int) -> tuple[str, int]:
    """(state letter, session id) of a process from /proc/PID/stat; ("", 0) when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return "", 0
    return fields[0].decode(), int(fields[3])


class Service:
    """A long-lived process of the sandbox and its pipes: stdout kept until a whole line is taken,
    stderr's tail kept for the host's diagnostics."""

    STDERR_TAIL = 4096

    def __init__(self, pid: int, stdin: int, stdout: int, stderr: int) -> None:
        self.pid, self.stdin, self.stdout, self.stderr_fd = pid, stdin, stdout, stderr
        for fd in (stdin, stdout, stderr):
            os.set_blocking(fd, False)
        self.pidfd = os.pidfd_open(pid)
        self.out = bytearray()
        self.stderr = bytearray()
        self.status: int | None = None  # set once reaped
        self.overflow = False  # a line longer than the cap: the service is stopped

    def talk(self, data: bytes, deadline: float, line_cap: int) -> None:
        """Write data while reading its output (it may answer before it has read everything);
        return once data is written and a whole line is there, or it ended, or at the deadline."""
        pending = memoryview(data)
        poller = select.poll()
        for fd in (self.stdout, self.stderr_fd, self.pidfd):
            if fd >= 0:
                poller.register(fd, select.POLLIN)
        if pending and self.stdin >= 0:
            poller.register(self.stdin, select.POLLOUT)
        ended = False
        while not ended and not self.overflow:
            if not pending and b"\n" in self.out:
                return  # (a stdout at its end waits for the exit, which soon follows)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            for fd, _ in poller.poll(remaining * 1000):
                if fd == self.pidfd:
                    self.drain_all()  # it ended: what it wrote is all there will be
                    ended = True
                elif fd == self.stdin:
                    pending = self.write_some(pending)
                    if not pending:
                        poller.unregister(fd)
                elif not self.drain(fd, line_cap):
                    poller.unregister(fd)

    def write_some(self, pending: memoryview) -> memoryview:
        try:
            return pending[os.write(self.stdin, pending[:READ_CHUNK]) :]
        except BlockingIOError:
            return pending
        except BrokenPipeError:  # it closed its stdin: what it would have read is lost
            return pending[:0]

    def drain(self, fd: int, line_cap: int) -> bool:
        """Read what fd holds; False at its end-of-file (the fd is then closed)."""
        try:
            chunk = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return True
        if not chunk:
            os.close(fd)
            if fd == self.stdout:
                self.stdout = -1
            else:
                self.stderr_fd = -1
            return False
        if fd == self.stderr_fd:
            self.stderr += chunk
            del self.stderr[: max(0, len(self.stderr) - self.STDERR_TAIL)]
            return True
        self.out += chunk
        partial = len(self.out) - (self.out.rfind(b"\n") + 1)
        if partial > line_cap:
            self.overflow = True
        return True

    def drain_all(self) -> None:
        for fd in (self.stdout, self.stderr_fd):
            while fd >= 0 and self.drain(fd, 1 << 62):
                try:
                    if not select.select([fd], [], [], 0)[0]:
                        break
                except (OSError, ValueError):
                    break

    def take_lines(self) -> bytes:
        end = self.out.rfind(b"\n") + 1
        lines = bytes(self.out[:end])
        del self.out[:end]
        return lines

    def close(self) -> None:
        for fd in (self.stdin, self.stdout, self.stderr_fd, self.pidfd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.stdin = self.stdout = self.stderr_fd = self.pidfd = -1


class OomCounter:
    """OOM kills recorded by the memory cgroup the sandbox sits in, where it can see one. The file
    stays open and is read again from its start: opening it anew would cost a tenth of a run."""

    def __init__(self) -> None:
        self.fd, self.key = -1, b""
        for path, key in CGROUP_OOM_FILES:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            self.fd, self.key = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100), key.encode() + b" "
            os.close(fd)
            return

    def read(self) -> int:
        if self.fd < 0:
            return 0
        try:
            data = os.pread(self.fd, 4096, 0)
        except OSError:
            return 0
        for line in data.splitlines():
            if line.startswith(self.key):
                return int(line[len(self.key) :])
        return 0


class Execution:
    """One fork, one piece of code, its output captured under a cap, and everything killed after."""

    def __init__(self, server: Server, head: dict, stdin: bytes) -> None:
        self.server = server
        self.head = head
        self.stdin = stdin
        self.cap = head["output_cap"]
        self.buffers = {"stdout": bytearray(), "stderr": bytearray(), "report": bytearray()}
        self.truncated = {"stdout": False, "stderr": False, "report": False}
        self.stop_reason: str | None = None

    def run(self) -> dict:
        pipes = {name: os.pipe() for name in ("stdin", "stdout", "stderr", "report")}
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            child_main(self.server, self.head, pipes)
        for name, (read_end, write_end) in pipes.items():
            os.close(read_end if name == "stdin" else write_end)
        status, usage = self.supervise(pid, pipes, started + self.head["timeout"])
        wall = time.monotonic() - started  # supervise killed and reaped everything the code started
        before, self.server.oom_kills_seen = self.server.oom_kills_seen, self.server.oom.read()
        return self.result(status, usage, wall, self.server.oom_kills_seen > before)

    def supervise(self, pid: int, pipes: dict, deadline: float) -> tuple[int, resource.struct_rusage]:
        pidfd = os.pidfd_open(pid)
        readers = {pipes[name][0]: name for name in ("stdout", "stderr", "report")}
        stdin_fd, pending = pipes["stdin"][1], memoryview(self.stdin)
        poller = select.poll()
        for fd in readers:
            poller.register(fd, select.POLLIN)
        poller.register(pidfd, select.POLLIN)
        if pending:
            os.set_blocking(stdin_fd, False)
            poller.register(stdin_fd, select.POLLOUT)
        else:
            os.close(stdin_fd)
            stdin_fd = -1
        exited = False
        while not exited and self.stop_reason is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.stop_reason = "timeout"
                break
            for fd, _ in poller.poll(remaining * 1000):
                if fd == pidfd:
                    exited = True
                elif fd == stdin_fd:
                    try:
                        pending = pending[os.write(stdin_fd, pending[:READ_CHUNK]) :]
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not pending:
                        poller.unregister(stdin_fd)
                        os.close(stdin_fd)
                        stdin_fd = -1
                elif self.drain(fd, readers, poller) and readers[fd] is not None:
                    self.stop_reason = "output_cap"
        if self.stop_reason is not None:
            os.kill(pid, signal.SIGKILL)
        _, status, usage = os.wait4(pid, 0)
        # The child is gone: kill what it left behind so the pipes reach end-of-file, then read the rest.
        self.server.kill_but_services()
        for fd in list(readers):
            while readers[fd] is not None and not self.drain(fd, readers, poller):
                pass
        for fd in list(readers) + [pidfd] + ([stdin_fd] if stdin_fd >= 0 else []):
            os.close(fd)
        return status, usage

    def drain(self, fd: int, readers: dict, poller: select.poll) -> bool:
        """Read what fd holds; True when the stream is done: at end-of-file or over its cap."""
        name = readers[fd]
        chunk = os.read(fd, READ_CHUNK)
        if not chunk:
            poller.unregister(fd)
            readers[fd] = None
            return True
        buffer = self.buffers[name]
        cap = REPORT_CAP if name == "report" else self.cap
        room = cap - len(buffer)
        buffer += chunk[: max(room, 0)]
        if len(chunk) > room:
            self.truncated[name] = True
            return True
        return False

    def result(self, status: int, usage: resource.struct_rusage, wall: float, oom_killed: bool) -> dict:
        cpu = usage.ru_utime + usage.ru_stime
        report = self.buffers["report"].decode(errors="replace")
        stderr = bytes(self.buffers["stderr"])
        reason, exit_code, signal_number = self.stop_reason, None, None
        if os.WIFEXITED(status):
            exit_code = os.WEXITSTATUS(status)
        elif os.WIFSIGNALED(status):
            signal_number = os.WTERMSIG(status)
        if reason is None:
            reason = self.reason_from_status(exit_code, signal_number, cpu, oom_killed, report, stderr)
        return {
            "ok": True,
            "exit_code": exit_code,
            "signal": signal_number,
            "stop_reason": reason,
            "stdout": bytes(self.buffers["stdout"]).decode("latin-1"),
            "stderr": stderr.decode("latin-1"),
            "stdout_truncated": self.truncated["stdout"],
            "stderr_truncated": self.truncated["stderr"],
            "report": report,
            "wall_seconds": wall,
            "cpu_seconds": cpu,
            "peak_memory_mb": usage.ru_maxrss / 1024,
        }

    def reason_from_status(
        self, exit_code: int | None, sig: int | None, cpu: float, oom: bool, report: str, stderr: bytes
    ) -> str:
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= self.head["limits"]["cpu_seconds"]):
            return "timeout"
        if oom or '"event": "oom"' in report:
            return "out_of_memory"
        if sig is not None:
            return "killed"
        last_line = stderr.rstrip().rsplit(b"\n", 1)[-1]
        if exit_code and last_line.startswith(b"MemoryError"):
            return "out_of_memory"
        return "exited"


# -- the child ---------------------------------------------------------------------------------


def child_main(server: Server, head: dict, pipes: dict) -> None:
    code = 1
    try:
        os.dup2(pipes["stdin"][0], 0)
        os.dup2(pipes["stdout"][1], 1)
        os.dup2(pipes["stderr"][1], 2)
        os.dup2(pipes["report"][1], 3)
        os.closerange(4, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        apply_limits(head["limits"], server.nproc_overhead)
        os.chdir(server.workspace)
        kind = head["kind"]
        if kind == "argv":
            for number in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(number, signal.SIG_DFL)
            try:
                os.execvpe(head["argv"][0], head["argv"], CHILD_ENV)
            except OSError as exc:
                os.write(2, f"{head['argv'][0]}: {exc.strerror}\n".encode())
                os._exit(127)
        prepare_python(server.workspace)
        if kind == "python":
            code = run_snippet(head["code"])
        elif kind == "program":
            code = run_program(head)
        else:
            code = run_tests(head, server.compiled)
    except BaseException:  # noqa: BLE001  (the child must never return into the server loop)
        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001
                pass
        os._exit(code)


def service_main(server: Server, head: dict, pipes: dict) -> None:
    """A service's child: its own session, the limits, the workspace, then its program."""
    try:
        os.setsid()  # its session marks it (and what it starts) as spared by executions' kills
        os.dup2(pipes["stdin"][0], 0)
        os.dup2(pipes["stdout"][1], 1)
        os.dup2(pipes["stderr"][1], 2)
        os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        apply_limits(head["limits"], server.nproc_overhead)
        os.chdir(server.workspace)
        for number in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(number, signal.SIG_DFL)
        environment = {**CHILD_ENV, **{str(k): str(v) for k, v in (head.get("env") or {}).items()}}
        os.execvpe(head["argv"][0], head["argv"], environment)
    except OSError as exc:
        os.write(2, f"{head['argv'][0]}: {exc.strerror}\n".encode())
    except BaseException:  # noqa: BLE001  (the child must never return into the server loop)
        pass
    os._exit(127)


def apply_limits(limits: dict, nproc_overhead: int) -> None:
    mb = 1024 * 1024
    cpu = max(1, math.ceil(limits["cpu_seconds"]))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] * mb, limits["memory_mb"] * mb))
    nproc = limits["max_processes"] + nproc_overhead
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["max_open_files"], limits["max_open_files"]))
    fsize = limits["max_file_size_mb"] * mb
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if MEMORY_CGROUP_VISIBLE:
        prefer_as_oom_victim()


def prefer_as_oom_victim() -> None:
    """Make this child the first the cgroup's OOM killer takes: the code dies, never the server.

    The server made itself non-dumpable, which children inherit and which gives their /proc files
    to root; the child, the code's own process, becomes dumpable again first (the server stays
    protected). Raw system calls: Python's open() would cost a third of a fork here."""
    if LIBC is None:
        return
    try:
        LIBC.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        try:
            os.write(fd, b"1000")
        finally:
            os.close(fd)
    except (OSError, AttributeError):  # AttributeError: a libc without prctl
        pass


def prepare_python(workspace: str) -> None:
    sys.dont_write_bytecode = True
    sys.argv = [""]
    sys.path.insert(0, workspace)
    main = types.ModuleType("__main__")
    main.__builtins__ = __builtins__  # type: ignore[attr-defined]  # every module has it; the stub omits it
    sys.modules["__main__"] = main


def exit_code_of(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def report(event: dict) -> None:
    try:
        os.write(3, (json.dumps(event) + "\n").encode())
    except OSError:
        pass


def run_snippet(source: str) -> int:
    namespace = sys.modules["__main__"].__dict__
    try:
        exec(compile(source, "<sandbox>", "exec"), namespace)  # noqa: S102  (inside the sandbox child)
    except SystemExit as exc:
        return exit_code_of(exc)
    except MemoryError:
        report({"event": "oom"})
        traceback.print_exc()
        return 1
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        return 1
    return 0


class TestTimeout(BaseException):
    """Raised by the per-test alarm; a BaseException so that `except Exception` in a test can't eat it."""


def on_alarm(signum: int, frame: object) -> None:
    raise TestTimeout


# -- compiling the tests (in the server, once per source: never in a child) ------------------------

COMPARE_NAME = "__flywheel_compare__"
VALUE_NAME = "__flywheel_value__"  # the host's value reports (sandboxes/values.py)
OPERATORS = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
}
TEST_FILE = re.compile(r"(^|/)(test_[^/]*\.py|[^/]*_test\.py|conftest\.py)$")
PLANTED = re.compile(r"(^|/)(conftest\.py|sitecustomize\.py|usercustomize\.py|[^/]*\.pth)$")
COMPILED_CAP = 512
Piece = tuple[int, bool, types.CodeType]  # a top-level statement: its line, whether it is a test, its code
CandidateProgram = tuple[types.CodeType, str, list[Piece] | None]  # see compile_tests
TestProgram = types.CodeType | list[Piece] | CandidateProgram  # its shape follows the style


class AssertRewriter(ast.NodeTransformer):
    """`assert a == b, m` becomes `assert __flywheel_compare__(a, b, "==", actual_is_left), m`: the
    harness sees both values (expected and actual on a failure, and the type of a value whose
    equality holds against anything)."""

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        test = node.test
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in OPERATORS):
            return node
        left, right = test.left, test.comparators[0]
        actual_is_left = not (is_literal(left) and not is_literal(right))
        call = ast.Call(
            func=ast.Name(COMPARE_NAME, ast.Load()),
            args=[left, right, ast.Constant(OPERATORS[type(test.ops[0])]), ast.Constant(actual_is_left)],
            keywords=[],
        )
        node.test = ast.copy_location(call, test)
        return node


def is_literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def rewritten(tree: ast.Module) -> ast.Module:
    return ast.fix_missing_locations(AssertRewriter().visit(tree))


def holds_assert(node: ast.AST) -> bool:
    """An assert in the statement, not counting those in functions or classes it defines (the
    host's rule, sandboxes/formats.py)."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.Assert):
            return True
        for child in ast.iter_child_nodes(current):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                stack.append(child)
    return False


def statement_pieces(statements: list[ast.stmt], path: str, is_test: typing.Callable) -> list[Piece]:
    return [
        (
            statement.lineno,
            is_test(statement),
            compile(ast.Module(body=[statement], type_ignores=[]), path, "exec"),
        )
        for statement in statements
    ]


def check_is_whole(check: ast.FunctionDef) -> bool:
    stack: list[ast.AST] = list(check.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom, ast.Nonlocal, ast.Global, ast.Await)):
            return True
        stack.extend(
            child
            for child in ast.iter_child_nodes(node)
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))
        )
    return False


def compile_tests(source: str, path: str, style: str) -> TestProgram:
    """The test file compiled for its style, its asserts rewritten:
    - "functions": the whole module;
    - "asserts": (line, is_test, code) per top-level statement (a statement holding an assert is a
      test, the rest is setup);
    - "candidate": (the module without its own top-level `check(...)` calls, the candidate's
      parameter name, and (line, is_test, code) per statement of check's body, or None when
      check runs whole)."""
    tree = rewritten(ast.parse(source, path))
    if style == "functions":
        return compile(tree, path, "exec")
    if style == "asserts":
        return statement_pieces(tree.body, path, holds_assert)
    checks = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "check"]
    check = checks[-1]
    body = [node for node in tree.body if not calls_check(node)]
    module = compile(ast.Module(body=body, type_ignores=[]), path, "exec")
    parameter = check.args.args[0].arg
    if check_is_whole(check):
        return module, parameter, None
    asserting = any(holds_assert(statement) for statement in check.body)

    def is_test(statement: ast.stmt) -> bool:
        if asserting:
            return holds_assert(statement)
        return any(isinstance(n, ast.Name) and n.id == parameter for n in ast.walk(statement))

    pieces = statement_pieces(check.body, path, is_test)
    return module, parameter, (pieces if any(test for _, test, _ in pieces) else None)


def calls_check(node: ast.stmt) -> bool:
    """`check(f)` at the top level: the tests calling the check themselves (the harness does)."""
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "check"
    )


# -- what the code did, seen from the server after each run -----------------------------------------


def workspace_findings(workspace: str, pristine: list, protected: list) -> list:
    """Test files changed or deleted by any path, and start-up or conftest files planted, as
    [detector, evidence] pairs (the workspace and /tmp, a bounded walk)."""
    findings = []
    original = {path: content for path, _, content in pristine}
    watched = {path for path in original if TEST_FILE.search(path)} | set(protected)
    for path in sorted(watched):
        if path not in original:
            continue
        try:
            with open(os.path.join(workspace, path), "rb") as handle:
                now = handle.read(len(original[path]) + 1)
        except FileNotFoundError:
            findings.append(["test_files_modified", f"{path} deleted during the run"])
            continue
        except OSError:
            now = b""
        if now != original[path]:
            findings.append(
                ["test_files_modified", f"{path} rewritten during the run (was {len(original[path])} bytes)"]
            )
    for root, label in ((workspace, ""), ("/tmp", "/tmp/")):
        for path in bounded_walk(root, 2000):
            if PLANTED.search(path) and original.get(path) is None:
                detector = "conftest_planted" if path.endswith("conftest.py") else "startup_files_written"
                findings.append([detector, f"{label}{path} written during the run"])
    return findings


def bounded_walk(root: str, limit: int) -> list[str]:
    found: list[str] = []
    stack = [""]
    while stack and len(found) < limit:
        prefix = stack.pop()
        try:
            entries = list(os.scandir(os.path.join(root, prefix) if prefix else root))
        except OSError:
            continue
        for entry in entries[:limit]:
            path = prefix + entry.name
            if entry.is_dir(follow_symlinks=False):
                stack.append(path + "/")
            else:
                found.append(path)
    return found


# -- running the tests (in the child) ---------------------------------------------------------------


class Probe:
    """A fresh object nothing honest compares equal to."""


EXACT_TYPES = frozenset({int, float, complex, str, bytes, bool, type(None), range, bytearray})
CONTAINERS = frozenset({list, tuple, set, frozenset, dict})


class RunState(typing.TypedDict):
    nonce: str
    failed: tuple[str, str] | None  # (actual, expected) of the last failed comparison, as reprs
    suspects: set[tuple[str, str]]  # (detector, evidence) already reported
    namespaces: list[dict[str, object]]  # where the tests look up the harness's hooks


RUN: RunState = {"nonce": "", "failed": None, "suspects": set(), "namespaces": []}


def suspect(detector: str, evidence: str) -> None:
    key = (detector, evidence)
    if key not in RUN["suspects"]:
        RUN["suspects"].add(key)
        report({"nonce": RUN["nonce"], "event": "suspect", "detector": detector, "evidence": evidence})


def always_equal(value: typing.Any, depth: int = 0) -> str:
    """Evidence when value (or something inside a container it is) equals a fresh object().
    (Any: anything the code returned, told apart by its exact type, which mypy cannot follow.)"""
    kind = type(value)
    if kind in EXACT_TYPES or depth > 3:
        return ""
    if kind in CONTAINERS:
        inner = itertools.chain.from_iterable(value.items()) if kind is dict else value
        for element in itertools.islice(inner, 1000):
            found = always_equal(element, depth + 1)
            if found:
                return found
        return ""
    try:
        holds = bool(value == Probe()) or not bool(value != Probe())
    except BaseException:  # noqa: BLE001  (a comparison that raises is no always-equal object)
        return ""
    if not holds:
        return ""
    name = f"{kind.__module__}.{kind.__qualname__}"
    return f"a {name} compared equal to a fresh object(): its equality always holds"


def flywheel_compare(left: typing.Any, right: typing.Any, op: str, actual_is_left: bool) -> bool:
    """What `assert left <op> right` checks, seen by the harness (see AssertRewriter). (Any: the
    operands are whatever the test compares; the operator decides what they must support.)"""
    result = {
        "==": lambda: left == right,
        "!=": lambda: left != right,
        "<": lambda: left < right,
        "<=": lambda: left <= right,
        ">": lambda: left > right,
        ">=": lambda: left >= right,
        "is": lambda: left is right,
        "is not": lambda: left is not right,
        "in": lambda: left in right,
        "not in": lambda: left not in right,
    }[op]()
    actual, expected = (left, right) if actual_is_left else (right, left)
    if op in ("==", "!=", "in", "not in"):
        evidence = always_equal(actual)
        if evidence:
            suspect("always_equal", evidence)
            RUN["failed"] = (safe_repr(actual), safe_repr(expected))
            raise AssertionError(evidence)
    truth = bool(result)
    if not truth:
        RUN["failed"] = (safe_repr(actual), safe_repr(expected))
    return truth


class NotPlainError(Exception):
    """A value that is not plain data: its type is named, it is never compared."""


def plain(value: typing.Any, depth: int = 0) -> object:
    """A result as JSON-ready plain data, by exact built-in type only (a subclass of int, str or
    list, whatever its __eq__ says, is not plain data). Tagged: {"list": [...]}, {"tuple": ...},
    {"set": ...}, {"frozenset": ...}, {"dict": [[key, value], ...]}, {"bytes": hex}. (Any: anything
    the code returned, told apart by its exact type, which mypy cannot follow.)"""
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is float or kind is str:
        return value
    if depth > 100:
        raise NotPlainError("a value nested deeper than 100 levels")
    if kind is list or kind is tuple or kind is set or kind is frozenset:
        return {kind.__name__: [plain(element, depth + 1) for element in value]}
    if kind is dict:
        return {"dict": [[plain(key, depth + 1), plain(item, depth + 1)] for key, item in value.items()]}
    if kind is bytes:
        return {"bytes": value.hex()}
    raise NotPlainError(f"a {kind.__module__}.{kind.__qualname__} is not plain data")


def flywheel_value(index: int, value: object) -> bool:
    """Report a call's result for the host to compare (the test's expected value is not here)."""
    event: dict[str, object] = {"nonce": RUN["nonce"], "event": "value", "index": index}
    try:
        event["value"] = plain(value)
        line = json.dumps(event)
    except NotPlainError as exc:
        evidence = always_equal(value)
        if evidence:
            suspect("always_equal", evidence)
        line = json.dumps(event | {"error": str(exc)})
    except (ValueError, RecursionError) as exc:  # an int too long to print, a cycle
        line = json.dumps(event | {"error": f"the value does not serialise: {type(exc).__name__}"})
    try:
        os.write(3, (line + "\n").encode())
    except OSError:
        pass
    return True


def harness_intact() -> None:
    """The tests' view of the harness (its comparison hook) is the harness's: code that replaced
    it is reported, and the hook put back."""
    for namespace in RUN["namespaces"]:
        if namespace.get(COMPARE_NAME) is not flywheel_compare:
            suspect("test_framework_patched", f"the harness's {COMPARE_NAME} was replaced during the run")
            namespace[COMPARE_NAME] = flywheel_compare
        if namespace.get(VALUE_NAME) is not flywheel_value:
            suspect("test_framework_patched", f"the harness's {VALUE_NAME} was replaced during the run")
            namespace[VALUE_NAME] = flywheel_value


def safe_repr(value: object) -> str:
    try:
        text = repr(value)
    except BaseException:  # noqa: BLE001
        return f"<{type(value).__name__} whose repr failed>"
    return text if len(text) <= 1000 else text[:1000] + "…"


def guard_signals() -> None:
    """Signals to a process not the code's own (the server, the host, another sandbox's) are
    reported, then sent (the namespace makes them harmless; the report is the evidence)."""
    own = os.getpid()
    real_kill, real_killpg = os.kill, os.killpg

    def descends(pid: int) -> bool:
        for _ in range(16):
            if pid == own:
                return True
            try:
                with open(f"/proc/{pid}/stat") as handle:
                    pid = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                return False
        return False

    def kill(pid: int, sig: int) -> None:
        if not (isinstance(pid, int) and pid > 1 and descends(pid)):
            suspect("signals_sent", f"os.kill({pid!r}, {sig!r}): a signal to a process not its own")
        return real_kill(pid, sig)

    def killpg(group: int, sig: int) -> None:
        suspect("signals_sent", f"os.killpg({group!r}, {sig!r}): a signal to a whole process group")
        return real_killpg(group, sig)

    os.kill, os.killpg = kill, killpg


def builtins_snapshot() -> dict:
    import builtins

    return dict(vars(builtins))


def after_run_checks(before: dict) -> None:
    """What the code left behind in the process: patched builtins, exit hooks."""
    import atexit
    import builtins

    now = vars(builtins)
    changed = sorted(name for name in set(before) | set(now) if before.get(name) is not now.get(name))
    changed = [name for name in changed if name not in ("_", COMPARE_NAME, VALUE_NAME)]
    if changed:
        suspect("test_framework_patched", "builtins changed during the run: " + ", ".join(changed[:20]))
    hooks = atexit._ncallbacks()
    if hooks:
        suspect("exit_hooks", f"{hooks} atexit hook(s) registered during the run")
    if sys.excepthook is not sys.__excepthook__:
        suspect("exit_hooks", "sys.excepthook replaced during the run")


def import_solution(name: str, nonce: str) -> types.ModuleType | None:
    """The solution module, or None once a collect_error is reported."""
    try:
        return importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001
        collect_failed(nonce, exc, "importing the solution failed: ")
        return None


def collect_failed(nonce: str, exc: BaseException, prefix: str = "") -> None:
    if isinstance(exc, MemoryError):
        report({"event": "oom"})
    report({"nonce": nonce, "event": "collect_error", "message": prefix + describe(exc)})


def run_tests(head: dict, compiled: dict[tuple[str, str, str], TestProgram]) -> int:
    """Run the pristine test source the host sent, one report line per test, each with the nonce."""
    nonce, path, names, style = head["nonce"], head["path"], head["names"], head["style"]
    source = head["source"]
    RUN["nonce"] = nonce
    module = types.ModuleType(os.path.splitext(os.path.basename(path))[0])
    module.__file__ = os.path.join("/workspace", path)
    module.__builtins__ = __builtins__  # type: ignore[attr-defined]  # every module has it; the stub omits it
    module.__dict__[COMPARE_NAME] = flywheel_compare
    module.__dict__[VALUE_NAME] = flywheel_value
    RUN["namespaces"] = [module.__dict__]
    sys.modules[module.__name__] = module
    sys.path.insert(0, os.path.dirname(module.__file__))
    signal.signal(signal.SIGALRM, on_alarm)
    per_test = head.get("per_test_seconds") or 0
    guard_signals()
    builtins_before = builtins_snapshot()

    def one(name: str, call: typing.Callable[[], None]) -> None:
        harness_intact()
        report({"nonce": nonce, "event": "start", "name": name})
        started = time.perf_counter()
        outcome, message = "pass", ""
        RUN["failed"] = None
        if per_test:
            signal.setitimer(signal.ITIMER_REAL, per_test)
        try:
            call()
        except AssertionError as exc:
            outcome, message = "fail", failure_message(exc, source, path)
        except TestTimeout:
            outcome, message = "timeout", f"ran past its {per_test:g} s limit"
        except MemoryError:
            report({"event": "oom"})
            outcome, message = "error", "MemoryError: out of memory"
        except SystemExit as exc:
            outcome, message = "error", f"the code called sys.exit({exc.code!r}) during the test"
        except BaseException as exc:  # noqa: BLE001
            outcome, message = "error", f"{type(exc).__name__}: {exc}"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        duration = time.perf_counter() - started
        harness_intact()
        event = {
            "nonce": nonce,
            "event": "end",
            "name": name,
            "outcome": outcome,
            "message": message,
            "duration": duration,
        }
        if outcome == "fail" and RUN["failed"] is not None:
            event["actual"], event["expected"] = RUN["failed"]
        report(event)

    # Any: compile_tests gave it the shape of `style`, which decides the runner below.
    program: typing.Any = compiled.get((path, style, source))
    if program is None:
        try:
            program = compile_tests(source, path, style)
        except BaseException as exc:  # noqa: BLE001
            collect_failed(nonce, exc, "the tests do not compile: ")
            return 1
    solution = None
    if style == "candidate" or head.get("inject"):
        solution = import_solution(head.get("solution") or "solution", nonce)
        if solution is None:
            return 1
        module.__dict__.update(
            {
                key: value
                for key, value in vars(solution).items()
                if not (key.startswith("__") and key.endswith("__"))
            }
        )
    setup = head.get("setup_code")
    if setup:
        try:
            exec(compile(setup, "test_setup_code", "exec"), module.__dict__)  # noqa: S102
        except BaseException as exc:  # noqa: BLE001
            collect_failed(nonce, exc, "test_setup_code failed: ")
            return 1
    try:
        if style == "functions":
            code = run_functions(program, module, names, one, nonce)
        elif style == "candidate":
            code = run_candidate(program, module, solution, head, one, nonce)
        else:
            code = run_pieces(program, module.__dict__, one, nonce, "line {}")
    finally:
        after_run_checks(builtins_before)
    return code


def run_functions(
    program: types.CodeType, module: types.ModuleType, names: list, one: typing.Callable, nonce: str
) -> int:
    try:
        exec(program, module.__dict__)  # noqa: S102
    except BaseException as exc:  # noqa: BLE001
        collect_failed(nonce, exc)
        return 1
    for name in names:
        function = module.__dict__.get(name)
        if callable(function):
            one(name, function)
        else:
            report(
                {
                    "nonce": nonce,
                    "event": "end",
                    "name": name,
                    "outcome": "error",
                    "message": f"{name} is not a function once the module ran",
                    "duration": 0.0,
                }
            )
    return 0


def run_pieces(pieces: list[Piece], namespace: dict, one: typing.Callable, nonce: str, label: str) -> int:
    for line, is_test, code in pieces:
        if is_test:
            one(label.format(line), functools.partial(exec, code, namespace))
            continue
        try:
            exec(code, namespace)  # noqa: S102
        except BaseException as exc:  # noqa: BLE001
            collect_failed(nonce, exc, f"setup at {label.format(line)} failed: ")
            return 1
    return 0


def run_candidate(
    program: CandidateProgram,
    module: types.ModuleType,
    solution: types.ModuleType | None,  # None: no entry point, reported as such
    head: dict,
    one: typing.Callable,
    nonce: str,
) -> int:
    """check(candidate) with the solution's entry point: statement by statement where it can."""
    code, parameter, pieces = program
    try:
        exec(code, module.__dict__)  # noqa: S102
    except BaseException as exc:  # noqa: BLE001
        collect_failed(nonce, exc)
        return 1
    entry_point = head.get("entry_point") or ""
    candidate = getattr(solution, entry_point, None)
    if not callable(candidate):
        message = f"the solution defines no function {entry_point!r}"
        report({"nonce": nonce, "event": "collect_error", "message": message})
        return 1
    if pieces is None:
        check = module.__dict__["check"]  # compile_tests found its definition, and the module ran
        one("check", functools.partial(check, candidate))
        return 0
    namespace = dict(module.__dict__)
    namespace[parameter] = candidate
    RUN["namespaces"].append(namespace)
    return run_pieces(pieces, namespace, one, nonce, "check line {}")


def run_program(head: dict) -> int:
    """A program run as __main__ with the code's stdin (the io format), under the same guards."""
    RUN["nonce"] = head["nonce"]
    guard_signals()
    builtins_before = builtins_snapshot()
    sys.argv = [head["path"]]
    code = 0
    try:
        runpy.run_path(head["path"], run_name="__main__")
    except SystemExit as exc:
        code = exit_code_of(exc)
    except MemoryError:
        report({"event": "oom"})
        traceback.print_exc()
        code = 1
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = 1
    after_run_checks(builtins_before)
    return code


def describe(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"the code called sys.exit({exc.code!r}) before the tests ran"
    if isinstance(exc, MemoryError):
        return "MemoryError: out of memory"
    return f"{type(exc).__name__}: {exc}"


def failure_message(exc: AssertionError, source: str, path: str) -> str:
    if str(exc):
        return f"AssertionError: {exc}"
    lines = source.splitlines()
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename == path and frame.lineno and frame.lineno <= len(lines):
            return f"line {frame.lineno}: {lines[frame.lineno - 1].strip()}"
    return "AssertionError"


def server_options(argv: list[str]) -> dict[str, str]:
    """`<workspace> [--connect PATH] [--seccomp BPF]` as {"workspace": …, "connect": …, "seccomp": …}."""
    options = {name.lstrip("-"): value for name, value in zip(argv[2::2], argv[3::2], strict=True)}
    return {"workspace": argv[1]} | options


class SockFprog(ctypes.Structure):
    """struct sock_fprog: a BPF program's length in instructions and the instructions."""

    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def seccomp_install(program: str) -> None:
    """Load the host's filter (base64 BPF) on this process; its children inherit it. A filter that
    cannot be loaded ends the server: the sandbox never runs code without it."""
    code = base64.b64decode(program)
    prog = SockFprog(len(code) // 8, code)
    if LIBC is None or LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SystemExit("sandbox server: cannot set no_new_privs for the seccomp filter")
    if LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise SystemExit(f"sandbox server: cannot load the seccomp filter: {os.strerror(ctypes.get_errno())}")


def control_channel(connect: str | None) -> tuple[int, int]:
    """The host's channel: stdin/stdout by default, or `--connect PATH`, a unix socket the host
    listens on (Docker: a direct socket keeps the engine's stream proxy off every message)."""
    if connect:
        channel = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        channel.connect(connect)
        fd = fcntl.fcntl(channel.fileno(), fcntl.F_DUPFD_CLOEXEC, 100)
        channel.close()
        return fd, fd
    return fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 100), fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 100)


def main() -> None:
    options = server_options(sys.argv)
    if options.get("seccomp"):
        seccomp_install(options["seccomp"])
    ctl_in, ctl_out = control_channel(options.get("connect"))
    # What the code sees, set once here so that no fork pays for it (the server needs none).
    os.environ.clear()
    os.environ.update(CHILD_ENV)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    try:
        if LIBC is not None:
            LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):  # AttributeError: a libc without prctl
        pass
    # As PID 1, only signals it handles reach it; the host stops it by closing the channel or by
    # killing the sandbox.
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_IGN)
    # Objects that exist now are never collected: a collection in a child would touch (and so
    # copy-on-write) the whole inherited heap, which is most of what a fork costs.
    gc.collect()
    gc.freeze()
    Server(options["workspace"], ctl_in, ctl_out).serve()


if __name__ == "__main__":
    main()

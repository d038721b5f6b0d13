"""The Docker backend: the fork server as the main process of a locked-down container.

Network `none`, read-only root, tmpfs workspace and /tmp, memory / CPU / PID limits, every
capability dropped, no new privileges, a non-root uid of its own. The container is started once and
reused across episodes, so an execution costs a fork inside, never a `docker exec`, and a reset
restores the workspace in place.

The channel to the server: with a local engine (a unix:// address), a unix socket the host listens
on in a per-sandbox directory mounted read-only into the container; messages then go straight from
process to process. With a remote engine, the container's attached stdin/stdout, which the engine
relays (a few times slower per message).
"""

import shutil
import socket
import struct
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .cgroups import sandbox_memory_bytes
from .channel import DockerAttachTransport, PipeTransport, Transport
from .config import SandboxSettings
from .interface import InfrastructureError, SandboxSpec
from .sandbox import SERVER_PIDS, Sandbox, server_command
from .uids import UidLease, uid_claim

if TYPE_CHECKING:  # the SDK is imported where a sandbox first needs it; it has no type hints (Any)
    from docker import DockerClient
    from docker.models.containers import Container

LABEL = "org.flywheel.sandbox"
CONTROL_MOUNT = "/run/flywheel"
CONNECT_TIMEOUT = 30.0
PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_clients: dict[tuple[str, str], "DockerClient"] = {}
_clients_lock = threading.Lock()


def docker_client(docker_host: str, cert_path: str = "") -> "DockerClient":
    """One client per engine address, shared by the sandboxes of this process; with `cert_path`,
    over TLS: this client's certificate is shown, and the engine's verified against ca.pem."""
    try:
        import docker
    except ImportError:
        raise InfrastructureError(
            "the docker Python SDK is missing: pip install -r requirements.txt"
        ) from None
    with _clients_lock:
        if (docker_host, cert_path) not in _clients:
            tls = docker_tls(cert_path) if cert_path else None
            try:
                if tls is None:
                    client = docker.DockerClient(base_url=docker_host, timeout=30)
                else:
                    client = docker_client_tls(docker_host, tls)
                client.ping()
            except Exception as exc:  # noqa: BLE001  (any failure to reach the engine is the same to callers)
                raise InfrastructureError(
                    f"no Docker engine answers at {docker_host}{' over TLS' if tls else ''} ({exc}):"
                    " run `make sandbox-deps`"
                ) from None
            _clients[docker_host, cert_path] = client
        return _clients[docker_host, cert_path]


def docker_client_tls(docker_host: str, tls):
    """A client that verifies the engine against ca.pem alone: requests would take
    REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE over it where either is set (psf/requests#3829), so the
    client ignores the environment, from its first request on (the API version it asks for)."""
    import docker
    from docker.constants import MINIMUM_DOCKER_API_VERSION

    clients: list[DockerClient] = []
    for version in (MINIMUM_DOCKER_API_VERSION, None):
        client = docker.DockerClient(
            docker_host, tls=tls, timeout=30, version=version or clients[0].version()["ApiVersion"]
        )
        client.api.trust_env = False
        clients.append(client)
    clients[0].close()
    return clients[1]


def docker_tls(cert_path: str):
    """The TLS settings for a remote engine from a folder laid out as the docker CLI's."""
    import docker.tls

    folder = Path(cert_path)
    names = ("ca.pem", "cert.pem", "key.pem")
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise InfrastructureError(
            f"FLYWHEEL_SANDBOX_DOCKER_CERT_PATH {cert_path}: no {', '.join(missing)} there (the engine's"
            " CA certificate, this client's certificate and its key)"
        )
    ca, cert, key = (str(folder / name) for name in names)
    return docker.tls.TLSConfig(client_cert=(cert, key), ca_cert=ca, verify=True)


def engine_client(settings: SandboxSettings):
    return docker_client(settings.docker_host, settings.docker_cert_path)


def docker_image_check(settings: SandboxSettings, image: str) -> None:
    """Raise now, never build or pull: acquisition must not wait on image work."""
    import docker.errors

    try:
        engine_client(settings).images.get(image)
    except docker.errors.ImageNotFound:
        raise InfrastructureError(f"sandbox image {image} is missing: run `make sandbox-image`") from None


class DockerSandbox(Sandbox):
    backend = "docker"
    nproc_overhead = 1  # the server

    def __init__(self, spec: SandboxSpec, settings: SandboxSettings) -> None:
        super().__init__(spec)
        self.settings = settings
        self.image = spec.image or settings.image
        self.container: Container | None = None
        self.lease: UidLease | None = None
        self.control_dir: Path | None = None

    def _launch(self) -> Transport:
        client = engine_client(self.settings)
        docker_image_check(self.settings, self.image)
        docker_sweep_once(self.settings)
        self.lease = lease = uid_claim(base=self.settings.uid_base, state_dir=self.settings.state_dir)
        local = self._engine_is_local()
        listener = self._control_listen() if local else None
        command = server_command(self.settings.python, seccomp=self.settings.seccomp)
        if listener is not None:
            command += ["--connect", f"{CONTROL_MOUNT}/ctl.sock"]
        attach = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
        try:
            options = self._container_options(local, lease.uid)
            self.container = container = client.containers.create(self.image, command=command, **options)
            sock = None if local else container.attach_socket(params=attach)
            container.start()
        except Exception as exc:  # noqa: BLE001  (the engine's errors are many; all are machinery failures)
            if listener is not None:
                listener.close()
            raise InfrastructureError(
                f"could not start a sandbox container from {self.image}: {exc}"
            ) from None
        if listener is None:
            assert sock is not None  # attached above: the engine is remote
            return DockerAttachTransport(getattr(sock, "_sock", sock))
        connection = self._control_accept(listener)
        return PipeTransport(connection, connection)

    def _engine_is_local(self) -> bool:
        """A local engine can mount a directory of ours, so the server can reach our socket."""
        return self.settings.docker_host.startswith("unix://")

    def _container_options(self, local: bool, uid: int) -> dict:
        limits = self.limits
        tmpfs = f"rw,exec,nosuid,nodev,size={limits.workspace_mb}m,uid={uid},gid={uid}"
        memory = sandbox_memory_bytes(limits)
        options = {
            "user": f"{uid}:{uid}",
            "working_dir": "/workspace",
            "environment": {"PATH": "/usr/bin:/bin", "HOME": "/workspace", "LANG": "C.UTF-8"},
            "hostname": "sandbox",
            "network_mode": "none",
            "read_only": True,
            "tmpfs": {"/workspace": tmpfs + ",mode=0755", "/tmp": tmpfs + ",mode=1777"},
            "mem_limit": memory,
            "memswap_limit": memory,
            "pids_limit": limits.max_processes + SERVER_PIDS,
            "nano_cpus": int(limits.cpus * 1e9),
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "ipc_mode": "private",
            "tty": False,
            # Not auto_remove: a server that dies at start leaves its output for _startup_check.
            # Closing the sandbox removes the container; the sweep removes a dead worker's.
            "auto_remove": False,
            "labels": {LABEL: "1"},
        }
        if local:
            options["volumes"] = {str(self.control_dir): {"bind": CONTROL_MOUNT, "mode": "ro"}}
        else:  # with stdin_open and detach=False, StdinOnce: the server sees EOF when we go
            options |= {"stdin_open": True, "detach": False}
        return options

    def _control_listen(self) -> socket.socket:
        Path(self.settings.state_dir).mkdir(parents=True, exist_ok=True)
        self.control_dir = Path(tempfile.mkdtemp(prefix="docker-", dir=self.settings.state_dir))
        self.control_dir.chmod(0o755)  # the container's uid must reach the socket; who connects is checked
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.control_dir / "ctl.sock"))
        (self.control_dir / "ctl.sock").chmod(0o666)
        listener.listen(4)
        return listener

    def _control_accept(self, listener: socket.socket) -> socket.socket:
        """The server's connection, and only its: the peer must run as this sandbox's uid. Waits
        in short slices so that a container that dies at start fails fast, with its output."""
        assert self.lease is not None  # claimed before the listener opened (_launch)
        uid = self.lease.uid
        deadline = time.monotonic() + CONNECT_TIMEOUT
        listener.settimeout(0.2)
        try:
            while time.monotonic() < deadline:
                try:
                    connection, _ = listener.accept()
                except TimeoutError:
                    self._startup_check()
                    continue
                _, peer_uid, _ = PEERCRED.unpack(
                    connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size)
                )
                if peer_uid == uid:
                    connection.setblocking(True)
                    return connection
                connection.close()
            raise InfrastructureError(f"the sandbox server did not connect within {CONNECT_TIMEOUT:.0f}s")
        finally:
            listener.close()

    def _startup_check(self) -> None:
        status, logs = "removed", b""  # unless the engine still has it
        if self.container is not None:
            try:
                self.container.reload()
                status, logs = self.container.status, self.container.logs(tail=20)
            except Exception:  # noqa: BLE001,S110  (gone already: removed by someone else)
                pass
        if status in ("exited", "dead", "removed"):
            tail = logs.decode(errors="replace").strip()
            raise InfrastructureError(
                f"sandbox container from {self.image} {status} before its server connected"
                + (f": {tail}" if tail else "")
            )

    def _terminate(self) -> None:
        if self.container is not None:
            try:
                self.container.remove(force=True)
            except Exception:  # noqa: BLE001,S110  (already gone: a sweep or the engine removed it)
                pass
            self.container = None
        if self.lease is not None:
            self.lease.release()
            self.lease = None
        if self.control_dir is not None:
            shutil.rmtree(self.control_dir, ignore_errors=True)
            self.control_dir = None


_swept: set[str] = set()


def docker_sweep_once(settings: SandboxSettings) -> None:
    """docker_sweep, the first time a process starts a sandbox on an engine (best effort)."""
    with _clients_lock:
        if settings.docker_host in _swept:
            return
        _swept.add(settings.docker_host)
    try:
        docker_sweep(settings)
    except Exception:  # noqa: BLE001,S110  (a leftover is harmless; the sandbox start must not fail on it)
        pass


def docker_sweep(settings: SandboxSettings) -> int:
    """Remove sandbox containers left behind by processes that died; returns how many."""
    client = engine_client(settings)
    removed = 0
    for container in client.containers.list(all=True, filters={"label": LABEL}):
        if container.status != "running":
            container.remove(force=True)
            removed += 1
    return removed

"""The Docker backend: the fork server as the main process of a locked-down container.

Network `none`, read-only root, tmpfs workspace and /tmp, memory / CPU / PID limits, every
capability dropped, no new privileges, a non-root uid of its own. The container is started once and
reused across episodes: the server talks over the attached stdin/stdout, so an execution costs a
fork inside, never a `docker exec`, and a reset restores the workspace in place.
"""

import threading

from .channel import DockerAttachTransport
from .config import SandboxSettings
from .interface import InfrastructureError, SandboxSpec
from .sandbox import SERVER_SOURCE, Sandbox
from .uids import UidLease, uid_claim

LABEL = "org.flywheel.sandbox"
SERVER_MEMORY_MB = 64  # the server itself and the page cache of a small workspace
_clients: dict[str, object] = {}
_clients_lock = threading.Lock()


def docker_client(docker_host: str):
    """One client per engine address, shared by the sandboxes of this process."""
    try:
        import docker
    except ImportError:
        raise InfrastructureError(
            "the docker Python SDK is missing: pip install -r requirements.txt"
        ) from None
    with _clients_lock:
        if docker_host not in _clients:
            try:
                client = docker.DockerClient(base_url=docker_host, timeout=30)
                client.ping()
            except Exception as exc:  # noqa: BLE001  (any failure to reach the engine is the same to callers)
                raise InfrastructureError(
                    f"no Docker engine answers at {docker_host} ({exc}): run `make sandbox-deps`"
                ) from None
            _clients[docker_host] = client
        return _clients[docker_host]


def docker_image_check(settings: SandboxSettings, image: str) -> None:
    """Raise now, never build or pull: acquisition must not wait on image work."""
    import docker.errors

    try:
        docker_client(settings.docker_host).images.get(image)
    except docker.errors.ImageNotFound:
        raise InfrastructureError(f"sandbox image {image} is missing: run `make sandbox-image`") from None


class DockerSandbox(Sandbox):
    backend = "docker"
    nproc_overhead = 1  # the server

    def __init__(self, spec: SandboxSpec, settings: SandboxSettings) -> None:
        super().__init__(spec)
        self.settings = settings
        self.image = spec.image or settings.image
        self.container = None
        self.lease: UidLease | None = None

    def _launch(self) -> DockerAttachTransport:
        client = docker_client(self.settings.docker_host)
        docker_image_check(self.settings, self.image)
        self.lease = uid_claim(base=self.settings.uid_base, state_dir=self.settings.state_dir)
        uid, limits = self.lease.uid, self.limits
        tmpfs = f"rw,exec,nosuid,nodev,size={limits.workspace_mb}m,uid={uid},gid={uid}"
        memory = (limits.memory_mb + 2 * limits.workspace_mb + SERVER_MEMORY_MB) << 20
        try:
            self.container = client.containers.create(
                self.image,
                command=[self.settings.python, "-I", "-c", SERVER_SOURCE, "/workspace"],
                user=f"{uid}:{uid}",
                working_dir="/workspace",
                environment={"PATH": "/usr/bin:/bin", "HOME": "/workspace", "LANG": "C.UTF-8"},
                hostname="sandbox",
                network_mode="none",
                read_only=True,
                tmpfs={"/workspace": tmpfs + ",mode=0755", "/tmp": tmpfs + ",mode=1777"},
                mem_limit=memory,
                memswap_limit=memory,
                pids_limit=limits.max_processes + 8,
                nano_cpus=int(limits.cpus * 1e9),
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                ipc_mode="private",
                stdin_open=True,
                detach=False,  # with stdin_open: StdinOnce, so the server sees EOF when we go
                tty=False,
                auto_remove=True,
                labels={LABEL: "1"},
            )
            sock = self.container.attach_socket(params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            self.container.start()
        except InfrastructureError:
            raise
        except Exception as exc:  # noqa: BLE001  (the engine's errors are many; all are machinery failures)
            raise InfrastructureError(
                f"could not start a sandbox container from {self.image}: {exc}"
            ) from None
        return DockerAttachTransport(getattr(sock, "_sock", sock))

    def _terminate(self) -> None:
        if self.container is not None:
            try:
                self.container.remove(force=True)
            except Exception:  # noqa: BLE001,S110  (already gone: auto_remove beat us to it)
                pass
            self.container = None
        if self.lease is not None:
            self.lease.release()
            self.lease = None


def docker_sweep(settings: SandboxSettings) -> int:
    """Remove sandbox containers left behind by processes that died; returns how many."""
    client = docker_client(settings.docker_host)
    removed = 0
    for container in client.containers.list(all=True, filters={"label": LABEL}):
        if container.status != "running":
            container.remove(force=True)
            removed += 1
    return removed

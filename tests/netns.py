"""Hosts simulated on this machine with network namespaces (`make test-hosts`; needs root, iproute2
and socat: `make hosts-deps`).

One bridge in the root namespace, with one address (the gateway); each host is a namespace with a
veth pair into it and an address of its own. The shared services stay where they are, on 127.0.0.1
in the root namespace: a socat relay bound to the gateway address forwards each (PostgreSQL,
Redis), so a host reaches them only over the network, the way another machine would. Docker's
`FORWARD DROP` (with br_netfilter) drops traffic between two bridge ports, so hosts talk to the
gateway only; a host that must reach another directly (a remote Docker engine) gets a
point-to-point link of its own (`Network.link`).

Processes are started with `nsenter --net` (only the network namespace changes: `ip netns exec`
would also remount /sys, hiding the cgroup tree from sandboxes and dockerd); killing a host
SIGKILLs every process in its namespace and their descendants (sandboxes live in namespaces of
their own below it)."""

import datetime
import ipaddress
import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.run_harness import Host, wait_until


def ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def hosts_requirements() -> str | None:
    """Why this machine cannot simulate hosts, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "nsenter", "socat") if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)}: run `make hosts-deps`"
    return None


def free_subnet(*taken: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
    """A /24 in 10.200.0.0/13 that no interface of this machine uses (several runs may coexist)."""
    words = ip("-o", "-4", "addr").split()
    used = [ipaddress.ip_interface(words[i + 1]).network for i, word in enumerate(words) if word == "inet"]
    for candidate in ipaddress.ip_network("10.200.0.0/13").subnets(new_prefix=24):
        if not any(candidate.overlaps(network) for network in [*used, *taken]):
            return candidate
    raise RuntimeError("no free /24 in 10.200.0.0/13 for the simulated hosts")


class Namespace:
    def __init__(self, name: str, address: str) -> None:
        self.name, self.address = name, address

    def argv(self, argv: list[str]) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.name}", *argv]

    def pids(self) -> set[int]:
        """Every process in the namespace, and every descendant of one (wherever it lives now)."""
        listed = {int(pid) for pid in ip("netns", "pids", self.name).split()}
        found = set(listed)
        for pid in listed:
            try:
                found |= {child.pid for child in psutil.Process(pid).children(recursive=True)}
            except psutil.NoSuchProcess:
                pass
        return found

    def signal_all(self, sig: int) -> set[int]:
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return pids


class Network:
    """A bridge and the namespaces on it; `down()` removes all of it, relays included."""

    def __init__(self) -> None:
        self.tag = "fw" + uuid.uuid4().hex[:5]  # interface names: at most 15 characters
        self.subnet = free_subnet()
        addresses = self.subnet.hosts()
        self.gateway = str(next(addresses))
        self._addresses = addresses
        self.bridge = f"{self.tag}br"
        self.namespaces: list[Namespace] = []
        self.links: list[str] = []
        self.relays: list[subprocess.Popen] = []
        self._links_made = 0
        self.link_subnets: list[ipaddress.IPv4Network] = []
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")

    def namespace(self, role: str) -> Namespace:
        """A new host on the bridge."""
        index = len(self.namespaces)
        namespace = Namespace(f"{self.tag}-{role}", str(next(self._addresses)))
        self.namespaces.append(namespace)
        ip("netns", "add", namespace.name)
        outside, inside = f"{self.tag}h{index}", f"{self.tag}i{index}"
        ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        self.links.append(outside)
        ip("link", "set", inside, "netns", namespace.name)
        ip("link", "set", outside, "master", self.bridge, "up")
        inner = ["netns", "exec", namespace.name, "ip"]
        ip(*inner, "addr", "add", f"{namespace.address}/{self.subnet.prefixlen}", "dev", inside)
        ip(*inner, "link", "set", inside, "up")
        ip(*inner, "link", "set", "lo", "up")
        return namespace

    def link(self, one: Namespace, other: Namespace) -> tuple[str, str]:
        """A point-to-point link between two hosts (a /24 of its own); their addresses on it."""
        self._links_made += 1
        network = free_subnet(self.subnet, *self.link_subnets)  # theirs are invisible from here
        self.link_subnets.append(network)
        first, second = (str(address) for address in itertools.islice(network.hosts(), 2))
        left, right = f"{self.tag}l{self._links_made}", f"{self.tag}r{self._links_made}"
        ip("link", "add", left, "netns", one.name, "type", "veth", "peer", "name", right, "netns", other.name)
        for namespace, device, address in ((one, left, first), (other, right, second)):
            inner = ["netns", "exec", namespace.name, "ip"]
            ip(*inner, "addr", "add", f"{address}/{network.prefixlen}", "dev", device)
            ip(*inner, "link", "set", device, "up")
        return first, second

    def relay(self, port: int, target: str) -> str:
        """Forward gateway:port to `target` (host:port in the root namespace); returns gateway:port."""
        process = subprocess.Popen(
            ["socat", f"TCP-LISTEN:{port},bind={self.gateway},fork,reuseaddr", f"TCP:{target}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.relays.append(process)
        wait_until(lambda: port_open(self.gateway, port, process), f"the relay at {self.gateway}:{port}", 30)
        return f"{self.gateway}:{port}"

    def down(self) -> None:
        for namespace in self.namespaces:
            namespace.signal_all(signal.SIGKILL)
        for relay in self.relays:
            try:
                os.killpg(relay.pid, signal.SIGKILL)  # the relay and the children it forked
            except ProcessLookupError:
                pass
            relay.wait(timeout=30)
        for namespace in self.namespaces:
            subprocess.run(["ip", "netns", "del", namespace.name], capture_output=True)
        for device in [*self.links, self.bridge]:
            subprocess.run(["ip", "link", "del", device], capture_output=True)


def port_open(host: str, port: int, server: subprocess.Popen) -> bool:
    if server.poll() is not None:
        raise RuntimeError(f"{server.args[0]} for {host}:{port} exited with status {server.returncode}")
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError:
        return False
    return True


def url_through(url: str, address: str) -> str:
    """`url` with its host:port replaced by `address` (the relay's)."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{credentials}@{address}" if credentials else address))


class NamespaceHost(Host):
    """A Host whose processes run in a network namespace; `kill()` kills the whole namespace."""

    def __init__(self, env: dict[str, str], namespace: Namespace, home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        super().__init__(env | {"FLYWHEEL_HOME": str(home)})
        self.namespace, self.home = namespace, home

    def argv(self, argv: list[str]) -> list[str]:
        return self.namespace.argv(argv)

    def send(self, sig: int) -> None:
        self.namespace.signal_all(sig)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.namespace.signal_all(sig)
        for process in self.processes:
            process.wait(timeout=30)
        self.processes.clear()


def tls_files(folder: Path, engine_addresses: list[str]) -> tuple[Path, Path]:
    """A CA, a certificate for the engine at its addresses and one for a client, laid out as the
    docker CLI expects (ca.pem, cert.pem, key.pem): the engine's folder and the client's."""
    authority_key = ec.generate_private_key(ec.SECP256R1())
    authority = certificate("flywheel test CA", authority_key, authority_key, None, ca=True)
    made = []
    for role, usage, names in (
        (
            "engine",
            ExtendedKeyUsageOID.SERVER_AUTH,
            [x509.IPAddress(ipaddress.ip_address(a)) for a in engine_addresses],
        ),
        ("client", ExtendedKeyUsageOID.CLIENT_AUTH, []),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = certificate(f"flywheel test {role}", key, authority_key, authority, usage=usage, names=names)
        out = folder / role
        out.mkdir(parents=True)
        (out / "ca.pem").write_bytes(authority.public_bytes(serialization.Encoding.PEM))
        (out / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (out / "key.pem").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )
        (out / "key.pem").chmod(0o600)
        made.append(out)
    return made[0], made[1]


def certificate(common_name, key, signer_key, signer, *, ca=False, usage=None, names=()) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(signer.subject if signer is not None else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
    return builder.sign(signer_key, hashes.SHA256())


def docker_client_over(url: str, tls):
    """A docker-py client verifying the engine against the TLS settings' CA only."""
    from sandboxes.backend_docker import docker_client_tls

    return docker_client_tls(url, tls)


class DockerEngine:
    """A second dockerd in a namespace of its own (its own data root, exec root, pidfile and
    containerd), listening only on tcp://<address>:2376 with --tlsverify: clients must show a
    certificate signed by the test CA. No iptables rules, no bridge: sandboxes use network none."""

    PORT = 2376

    def __init__(self, namespace: Namespace, addresses: list[str], folder: Path) -> None:
        self.folder, self.addresses = folder, addresses
        # Short: containerd's unix sockets live under it (108 characters at most).
        self.exec_root = Path(tempfile.mkdtemp(prefix="fwe-", dir="/tmp"))
        self.server_tls, self.client_tls = tls_files(folder / "tls", addresses)
        tls = self.server_tls
        argv = [
            shutil.which("dockerd") or "dockerd",
            f"--data-root={folder / 'data'}",
            f"--exec-root={self.exec_root}",
            f"--pidfile={folder / 'dockerd.pid'}",
            *[f"--host=tcp://{address}:{self.PORT}" for address in addresses],
            "--tlsverify",
            f"--tlscacert={tls / 'ca.pem'}",
            f"--tlscert={tls / 'cert.pem'}",
            f"--tlskey={tls / 'key.pem'}",
            "--iptables=false",
            "--ip6tables=false",
            "--bridge=none",
        ]
        with open(folder / "dockerd.log", "ab") as log:
            self.process = subprocess.Popen(
                namespace.argv(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def url(self, address: str) -> str:
        return f"tcp://{address}:{self.PORT}"

    def client(self, address: str):
        import docker

        tls = docker.tls.TLSConfig(
            client_cert=(str(self.client_tls / "cert.pem"), str(self.client_tls / "key.pem")),
            ca_cert=str(self.client_tls / "ca.pem"),
            verify=True,
        )
        return docker_client_over(self.url(address), tls)

    def answers(self, address: str) -> bool:
        if self.process.poll() is not None:
            log = (self.folder / "dockerd.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the second dockerd exited with status {self.process.returncode}:\n{log}")
        try:
            return self.client(address).ping()
        except Exception:  # noqa: BLE001  (not up yet: refused, reset, TLS not ready)
            return False

    def image_load(self, image: str, address: str) -> None:
        """`docker save image | docker -H <engine> --tlsverify load`: the engine pulls from no registry."""
        tls = self.client_tls
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        load = subprocess.run(
            [
                "docker",
                f"--host={self.url(address)}",
                "--tlsverify",
                f"--tlscacert={tls / 'ca.pem'}",
                f"--tlscert={tls / 'cert.pem'}",
                f"--tlskey={tls / 'key.pem'}",
                "load",
                "--quiet",
            ],
            stdin=save.stdout,
            capture_output=True,
            text=True,
        )
        save.stdout.close()
        if save.wait() != 0 or load.returncode != 0:
            raise RuntimeError(f"loading {image} into the second engine failed: {load.stderr.strip()}")

    def stop(self) -> None:
        """SIGTERM (dockerd stops its containers and its containerd), SIGKILL after 30 s; its files go."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        shutil.rmtree(self.exec_root, ignore_errors=True)
        shutil.rmtree(self.folder / "data", ignore_errors=True)

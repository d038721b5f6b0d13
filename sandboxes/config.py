"""Sandbox settings: from the host application's settings when it registered them, else the
environment. (The web app registers Django's settings in webapp.apps; this package imports no
Django, so a script or benchmark without it reads FLYWHEEL_SANDBOX_* from the environment.)"""

import os
from collections.abc import Callable
from dataclasses import dataclass

DEFAULTS = {
    "FLYWHEEL_SANDBOX_BACKEND": "bubblewrap",
    "FLYWHEEL_SANDBOX_IMAGE": "flywheel-sandbox:latest",
    "FLYWHEEL_SANDBOX_DOCKER_HOST": "",  # empty: DOCKER_HOST, else the engine's default socket
    # A tcp:// engine over TLS: ca.pem, cert.pem, key.pem (empty: DOCKER_CERT_PATH if DOCKER_TLS_VERIFY)
    "FLYWHEEL_SANDBOX_DOCKER_CERT_PATH": "",
    "FLYWHEEL_SANDBOX_BWRAP": "/usr/bin/bwrap",
    "FLYWHEEL_SANDBOX_PYTHON": "/usr/bin/python3",
    "FLYWHEEL_SANDBOX_POOL_MAX": str(2 * (os.cpu_count() or 1)),
    "FLYWHEEL_SANDBOX_POOL_WARM": "2",
    "FLYWHEEL_SANDBOX_UID_BASE": "200000",
    "FLYWHEEL_SANDBOX_STATE_DIR": "/tmp/flywheel-sandboxes",
    "FLYWHEEL_SANDBOX_CGROUPS": "auto",
    "FLYWHEEL_SANDBOX_SECCOMP": "on",
}
BACKENDS = ("bubblewrap", "docker")
CGROUP_MODES = ("auto", "off")
SECCOMP_MODES = ("on", "off")
DOCKER_SOCKET = "unix:///var/run/docker.sock"


_source: Callable[[str], object | None] | None = None


def settings_source_set(source: Callable[[str], object | None] | None) -> None:
    """Read settings through `source(name)` (None where it has no such setting) before the
    environment. It is asked on every read, so a setting changed at run time (a test's) applies."""
    global _source
    _source = source


def setting(name: str) -> str:
    value = _source(name) if _source is not None else None
    if value is not None:
        return str(value)
    return os.environ.get(name, DEFAULTS[name])


def setting_int(name: str) -> int:
    raw = setting(name)
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"sandbox setting {name} must be an integer, got {raw!r}") from None


@dataclass(frozen=True)
class SandboxSettings:
    backend: str
    image: str
    docker_host: str
    bwrap: str
    python: str
    pool_max: int
    pool_warm: int
    uid_base: int
    state_dir: str
    cgroups: str = "auto"  # bubblewrap: a cgroup per sandbox where the host allows ("auto"), or "off"
    seccomp: str = "on"  # Flywheel's seccomp filter in every sandbox ("on"), or "off"
    docker_cert_path: str = ""  # a remote engine's TLS files; empty: no TLS


def sandbox_settings() -> SandboxSettings:
    backend = setting("FLYWHEEL_SANDBOX_BACKEND")
    if backend not in BACKENDS:
        raise ValueError(f"FLYWHEEL_SANDBOX_BACKEND must be one of {', '.join(BACKENDS)}, got {backend!r}")
    return SandboxSettings(
        backend=backend,
        image=setting("FLYWHEEL_SANDBOX_IMAGE"),
        docker_host=setting("FLYWHEEL_SANDBOX_DOCKER_HOST") or os.environ.get("DOCKER_HOST") or DOCKER_SOCKET,
        bwrap=setting("FLYWHEEL_SANDBOX_BWRAP"),
        python=setting("FLYWHEEL_SANDBOX_PYTHON"),
        pool_max=setting_int("FLYWHEEL_SANDBOX_POOL_MAX"),
        pool_warm=setting_int("FLYWHEEL_SANDBOX_POOL_WARM"),
        uid_base=setting_int("FLYWHEEL_SANDBOX_UID_BASE"),
        state_dir=setting("FLYWHEEL_SANDBOX_STATE_DIR"),
        cgroups=cgroup_mode(),
        seccomp=seccomp_mode(),
        docker_cert_path=docker_cert_path(),
    )


def docker_cert_path() -> str:
    """The folder of the TLS files for a remote engine, as the docker CLI finds it: the setting,
    else DOCKER_CERT_PATH (default ~/.docker) when DOCKER_TLS_VERIFY is set; empty: no TLS."""
    path = setting("FLYWHEEL_SANDBOX_DOCKER_CERT_PATH")
    if path or not os.environ.get("DOCKER_TLS_VERIFY"):
        return path
    return os.environ.get("DOCKER_CERT_PATH") or os.path.expanduser("~/.docker")


def cgroup_mode() -> str:
    mode = setting("FLYWHEEL_SANDBOX_CGROUPS")
    if mode not in CGROUP_MODES:
        raise ValueError(f"FLYWHEEL_SANDBOX_CGROUPS must be one of {', '.join(CGROUP_MODES)}, got {mode!r}")
    return mode


def seccomp_mode() -> str:
    mode = setting("FLYWHEEL_SANDBOX_SECCOMP")
    if mode not in SECCOMP_MODES:
        raise ValueError(f"FLYWHEEL_SANDBOX_SECCOMP must be one of {', '.join(SECCOMP_MODES)}, got {mode!r}")
    return mode

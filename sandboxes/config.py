"""Sandbox settings: from django.conf.settings when Django is configured, else the environment."""

import os
from dataclasses import dataclass

DEFAULTS = {
    "FLYWHEEL_SANDBOX_BACKEND": "bubblewrap",
    "FLYWHEEL_SANDBOX_IMAGE": "flywheel-sandbox:latest",
    "FLYWHEEL_SANDBOX_DOCKER_HOST": "",  # empty: DOCKER_HOST, else the engine's default socket
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


def setting(name: str) -> str:
    try:
        from django.conf import settings

        if settings.configured and hasattr(settings, name):
            return str(getattr(settings, name))
    except ImportError:
        pass
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
    )


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

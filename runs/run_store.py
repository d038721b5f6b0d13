"""Where a run keeps its files. Published policy versions (what rollout workers load), checkpoints
and merged exports live in the artifact storage (runs/artifacts.py) under runs/<run id>-<key>/;
each host reads them through its own cache. The learner's working files (its Accelerate state
before upload, its log) stay under this host's FLYWHEEL_HOME/runs/<run id>-<key>/."""

import shutil
import tempfile
from pathlib import Path

from django.conf import settings

from core.artifacts import (
    artifact_cache_put,
    artifact_delete,
    artifact_exists,
    artifact_get,
    artifact_manifest,
    artifact_put,
    artifacts_under,
    cache_root,
)
from inference.adapters import model_save
from runs.models import Run


def run_name(run_id: int) -> str:
    """Named by the run's key, not its id: a fresh database that reuses ids never meets old files."""

    key = Run.objects.filter(pk=run_id).values_list("key", flat=True).get()
    return f"{run_id}-{key}"


def run_dir(run_id: int) -> Path:
    """This host's working folder for the run (the learner's local files and log)."""
    return Path(settings.FLYWHEEL_HOME) / "runs" / run_name(run_id)


def run_prefix(run_id: int) -> str:
    """The run's folder in the artifact storage."""
    return f"runs/{run_name(run_id)}"


def policy_prefix(run_id: int, version: int) -> str:
    return f"{run_prefix(run_id)}/policies/v{version}"


def checkpoint_prefix(run_id: int, step: int) -> str:
    return f"{run_prefix(run_id)}/checkpoints/step-{step}"


def policy_dir(run_id: int, version: int) -> Path:
    """A local folder holding the policy version: this host's cached copy, fetched through the
    artifact storage first if needed (ArtifactMissingError if it was never published)."""
    return artifact_get(policy_prefix(run_id, version))


def learner_dir(run_id: int) -> Path:
    return run_dir(run_id) / "learner"


def staging_dir() -> Path:
    """A fresh folder beside the cache (same file system, so it moves into it by a rename)."""
    root = cache_root() / ".staging"
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=root))


def policy_publish(run_id: int, version: int, model, tokenizer) -> Path:
    """Publish a policy version through the artifact storage: saved locally, uploaded (its
    manifest last, so a rollout worker never loads a half-written version) and kept in this
    host's cache. A version already published is left as it is."""
    prefix = policy_prefix(run_id, version)
    if artifact_exists(prefix):
        return artifact_get(prefix)
    partial = staging_dir()
    try:
        model_save(model, partial)
        tokenizer.save_pretrained(partial)
        identity = artifact_put(partial, prefix)
        return artifact_cache_put(partial, prefix, identity)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def policies_discard_after(run_id: int, version: int) -> None:
    """Forget versions newer than `version`: a resume rolled the weights back past them. Hosts that
    cached them never load them again: a version published again has a new identity."""
    for prefix in artifacts_under(f"{run_prefix(run_id)}/policies"):
        number = prefix.rsplit("/v", 1)[1]
        if number.isdigit() and int(number) > version:
            artifact_delete(prefix)


STORED_MARKER = ".stored"  # in a local checkpoint folder: the identity of its uploaded copy


def checkpoint_upload(run_id: int, step: int, local: Path) -> str:
    """Upload a complete local checkpoint folder; returns its name in the artifact storage."""
    prefix = checkpoint_prefix(run_id, step)
    identity = artifact_put(local, prefix)
    (local / STORED_MARKER).write_text(identity)
    return prefix


def checkpoint_is_local(prefix: str, local: Path) -> bool:
    """Whether `local` holds the stored checkpoint `prefix` (not one of another timeline)."""
    marker = local / STORED_MARKER
    return marker.exists() and marker.read_text() == artifact_manifest(prefix)["id"]


def checkpoint_fetch(prefix: str, target: Path) -> Path:
    """Copy a stored checkpoint into `target` (the learner's working folder) on this host."""
    cached = artifact_get(prefix)
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(cached, partial, ignore=shutil.ignore_patterns(".used"))
    for path in partial.rglob("*"):
        if path.is_file():
            path.chmod(0o600)  # a private copy: Accelerate may write beside or over it
    (partial / STORED_MARKER).write_text(artifact_manifest(prefix)["id"])
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target

"""Artifacts (policy versions, checkpoints, exports) through the Django storage
`STORAGES["artifacts"]`, so that no process reads another host's FLYWHEEL_HOME.

A folder is stored as its files under a prefix plus a manifest written last (`<prefix>.manifest.json`,
the file names and sizes): a reader that finds the manifest finds every file, so a half-uploaded
folder is never fetched. Readers fetch a folder into their host's cache
(FLYWHEEL_HOME/cache/artifacts/<prefix>), keyed by the prefix (which names the run's key and the
version), and the cache keeps the FLYWHEEL_ARTIFACT_CACHE_VERSIONS folders used last: older ones are
evicted. When the storage is a local file system (the default, or a shared mount) files are
hard-linked where the file system allows it, so one host keeps one copy.
"""

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

from django.conf import settings
from django.core.files import File
from django.core.files.storage import Storage, storages

MANIFEST_SUFFIX = ".manifest.json"
USED_MARKER = ".used"  # touched on every use: the cache evicts the folders used longest ago


class ArtifactMissingError(FileNotFoundError):
    """The artifact is not (or not completely) in the storage."""


def artifacts_storage() -> Storage:
    return storages["artifacts"]


def cache_root() -> Path:
    return Path(settings.FLYWHEEL_HOME) / "cache" / "artifacts"


def artifact_exists(prefix: str) -> bool:
    return artifacts_storage().exists(prefix + MANIFEST_SUFFIX)


def artifact_put(local: Path, prefix: str) -> str:
    """Upload every file under `local` to `prefix/…`, then the manifest (which makes it visible).
    Returns the upload's identity: a prefix published again (after a rollback) gets a new one, so
    no host's cache serves the old files for it."""
    storage = artifacts_storage()
    identity = uuid.uuid4().hex[:12]
    files = sorted(path for path in local.rglob("*") if path.is_file() and path.name != USED_MARKER)
    manifest: dict = {"id": identity, "files": {}}
    for path in files:
        relative = path.relative_to(local).as_posix()
        path.chmod(0o400)  # never rewritten in place (the cache may share the storage's inodes); owner only
        _file_put(storage, f"{prefix}/{relative}", path)
        manifest["files"][relative] = path.stat().st_size
    _bytes_put(storage, prefix + MANIFEST_SUFFIX, json.dumps(manifest).encode())
    return identity


def artifact_manifest(prefix: str) -> dict:
    storage = artifacts_storage()
    try:
        with storage.open(prefix + MANIFEST_SUFFIX, "rb") as handle:
            return json.loads(handle.read())
    except FileNotFoundError:
        raise ArtifactMissingError(f"artifact {prefix} is not in the artifact storage") from None


def cached_dir(prefix: str, identity: str) -> Path:
    return cache_root() / f"{prefix}.{identity}"


def artifact_get(prefix: str) -> Path:
    """A local folder holding the artifact: the host's cached copy, fetched first if needed."""
    manifest = artifact_manifest(prefix)
    final = cached_dir(prefix, manifest["id"])
    if not (final / USED_MARKER).exists():
        final.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        try:
            storage = artifacts_storage()
            for relative, size in manifest["files"].items():
                _file_get(storage, f"{prefix}/{relative}", partial / relative, size)
            (partial / USED_MARKER).touch()
            try:
                partial.rename(final)  # atomic: other processes see all of it or nothing
            except OSError:  # another process of this host fetched it meanwhile
                pass
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        cache_evict(keep=final)
    os.utime(final / USED_MARKER)
    return final


def artifact_cache_put(local: Path, prefix: str, identity: str) -> Path:
    """Move a folder this process wrote (and uploaded as `identity`) into the host's cache, so
    the writer's host never fetches it back."""
    final = cached_dir(prefix, identity)
    final.parent.mkdir(parents=True, exist_ok=True)
    (local / USED_MARKER).touch()
    local.rename(final)
    cache_evict(keep=final)
    return final


def artifact_delete(prefix: str) -> None:
    """Remove an artifact from the storage (manifest first: it stops being visible at once) and
    from this host's cache."""
    storage = artifacts_storage()
    try:
        manifest = artifact_manifest(prefix)
    except ArtifactMissingError:
        return
    storage.delete(prefix + MANIFEST_SUFFIX)
    for relative in manifest["files"]:
        storage.delete(f"{prefix}/{relative}")
    shutil.rmtree(cached_dir(prefix, manifest["id"]), ignore_errors=True)


def artifacts_under(prefix: str) -> list[str]:
    """The artifacts stored directly under `prefix/` (their prefixes), by their manifests."""
    try:
        _, names = artifacts_storage().listdir(prefix)
    except FileNotFoundError:
        return []
    stored = [name.removesuffix(MANIFEST_SUFFIX) for name in names if name.endswith(MANIFEST_SUFFIX)]
    return [f"{prefix}/{name}" for name in stored]


def cache_evict(keep: Path | None = None) -> list[Path]:
    """Drop the cached folders used longest ago beyond FLYWHEEL_ARTIFACT_CACHE_VERSIONS (never
    `keep`, the one just used). A process that already loaded an evicted version keeps its weights
    in memory; one that needs it again fetches it again."""
    limit = max(1, settings.FLYWHEEL_ARTIFACT_CACHE_VERSIONS)
    markers = cache_root().glob(f"**/{USED_MARKER}")
    cached = sorted((_used_at(m), m.parent) for m in markers if not _hidden(m.parent))
    evicted = []
    for _, folder in cached[: max(0, len(cached) - limit)]:
        if folder == keep:
            continue
        gone = folder.with_name(f".{folder.name}.evicted-{uuid.uuid4().hex[:6]}")
        try:
            folder.rename(gone)  # out of sight at once; then removed
        except OSError:
            continue
        shutil.rmtree(gone, ignore_errors=True)
        evicted.append(folder)
    return evicted


def _hidden(folder: Path) -> bool:
    """Staged or half-fetched folders (their names start with a dot) are not cache entries."""
    return any(part.startswith(".") for part in folder.relative_to(cache_root()).parts)


def _used_at(marker: Path) -> float:
    try:
        return marker.stat().st_mtime
    except FileNotFoundError:  # evicted by another process meanwhile
        return 0.0


# --- files -----------------------------------------------------------------------------------


def _local_path(storage: Storage, name: str) -> Path | None:
    try:
        return Path(storage.path(name))
    except NotImplementedError:  # a remote storage (S3 and the like)
        return None


def _file_put(storage: Storage, name: str, source: Path) -> None:
    if storage.exists(name):
        storage.delete(name)
    target = _local_path(storage, name)
    if target is not None and _link(source, target):
        return
    with open(source, "rb") as handle:
        saved = storage.save(name, File(handle))
    if saved != name:
        raise OSError(f"artifact storage saved {name} as {saved}")


def _bytes_put(storage: Storage, name: str, data: bytes) -> None:
    with tempfile.NamedTemporaryFile() as handle:
        handle.write(data)
        handle.flush()
        _file_put(storage, name, Path(handle.name))


def _file_get(storage: Storage, name: str, target: Path, size: int) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    source = _local_path(storage, name)
    if source is None or not _link(source, target):
        with storage.open(name, "rb") as reader, open(target, "wb") as writer:
            shutil.copyfileobj(reader, writer, 1 << 20)
    if target.stat().st_size != size:
        raise ArtifactMissingError(f"artifact file {name}: {target.stat().st_size} bytes, expected {size}")


def _link(source: Path, target: Path) -> bool:
    """Hard-link source to target (same file system), else copy; False if source is missing."""
    if not source.exists():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = target.with_name(f".{target.name}.{uuid.uuid4().hex[:6]}")
    try:
        os.link(source, staged)
    except OSError:
        shutil.copyfile(source, staged)
    os.replace(staged, target)
    return True

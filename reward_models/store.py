"""Where a reward-model version keeps its files: its working folder and log on the training host,
FLYWHEEL_HOME/reward_models/<id>-<key>/, and the trained model in the artifact storage under
reward_models/<id>-<key>/model (what graders on any host load, through their host's cache)."""

import shutil
from pathlib import Path

from django.conf import settings

from core.artifacts import artifact_delete, artifact_get, artifact_put
from reward_models.models import RewardModelVersion


def version_dir(version_id: int, key) -> Path:
    """Named by the version's key too: a fresh database that reuses ids never meets old files."""
    return Path(settings.FLYWHEEL_HOME) / "reward_models" / f"{version_id}-{key}"


def model_dir(version_id: int, key) -> Path:
    return version_dir(version_id, key) / "model"


def log_path(version_id: int, key) -> Path:
    path = version_dir(version_id, key) / "learner.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def checkpoint_prefix(version_id: int, key, step: int) -> str:
    """A training checkpoint's name in the artifact storage (what a resumed learner fetches)."""
    return f"reward_models/{version_id}-{key}/checkpoint-{step}"


def model_publish(version_id: int, key, local: Path) -> str:
    """Upload the trained model; returns its name in the artifact storage (the version's path)."""
    prefix = f"reward_models/{version_id}-{key}/model"
    artifact_put(local, prefix)
    return prefix


def model_local(path: str) -> str:
    """A local folder of a version's model: fetched through the artifact storage (a version trained
    before the storage recorded an absolute local path, used as it is)."""
    return path if Path(path).is_absolute() else str(artifact_get(path))


def checkpoint_discard(version: RewardModelVersion) -> None:
    """A failed or cancelled version is never resumed (a new version trains from the start), so
    its last checkpoint (model and optimiser: several times the model's size) is only clutter:
    removed from the artifact storage, and the learner's folder on this host."""
    versions = RewardModelVersion.objects.filter(pk=version.pk)
    path = versions.values_list("checkpoint_path", flat=True).get()
    if path:
        artifact_delete(path)
        versions.update(checkpoint_path="")
    shutil.rmtree(version_dir(version.pk, version.key) / "learner", ignore_errors=True)

"""Where a reward-model version keeps its files: FLYWHEEL_HOME/reward_models/<id>-<key>/, with the
trained model under `model/` (saved whole, then renamed into place) and the learner's log."""

from pathlib import Path

from django.conf import settings


def version_dir(version_id: int, key) -> Path:
    """Named by the version's key too: a fresh database that reuses ids never meets old files."""
    return Path(settings.FLYWHEEL_HOME) / "reward_models" / f"{version_id}-{key}"


def model_dir(version_id: int, key) -> Path:
    return version_dir(version_id, key) / "model"


def log_path(version_id: int, key) -> Path:
    path = version_dir(version_id, key) / "learner.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path

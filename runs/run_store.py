"""Where a run keeps its files: published policy versions (what rollout workers load) and the
learner's Accelerate checkpoints, under FLYWHEEL_HOME/runs/<run id>/."""

import shutil
from pathlib import Path

from django.conf import settings


def run_dir(run_id: int) -> Path:
    """Named by the run's key, not its id: a fresh database that reuses ids never meets old files."""
    from runs.models import Run

    key = Run.objects.filter(pk=run_id).values_list("key", flat=True).get()
    return Path(settings.FLYWHEEL_HOME) / "runs" / f"{run_id}-{key}"


def policy_dir(run_id: int, version: int) -> Path:
    return run_dir(run_id) / "policies" / f"v{version}"


def learner_dir(run_id: int) -> Path:
    return run_dir(run_id) / "learner"


def policy_publish(run_id: int, version: int, model, tokenizer) -> Path:
    """Save a policy version atomically: written to a temporary folder, then renamed into place,
    so a rollout worker never loads a half-written version."""
    final = policy_dir(run_id, version)
    if final.exists():
        return final
    partial = final.with_name(f".{final.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(final)
    return final


def policies_discard_after(run_id: int, version: int) -> None:
    """Forget versions newer than `version`: a resume rolled the weights back past them."""
    root = run_dir(run_id) / "policies"
    for path in root.glob("v*"):
        if path.name[1:].isdigit() and int(path.name[1:]) > version:
            shutil.rmtree(path, ignore_errors=True)

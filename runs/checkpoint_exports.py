"""Exporting a checkpoint: its policy's `save_pretrained` folder with a model card drawn from the run's
record (base model, method, data, reward rule, held-out results, decoding). The REST endpoint, the
run page's button and `manage.py export_checkpoint` all go through `export_plan`.

The weights are the policy version the learner published at the checkpoint's step (the files a
rollout worker loads). A LoRA run's version is a peft adapter: exported as it is (`adapter`) or
merged into the base (`full`, the default), which is saved once under the run's folder and reused.
"""

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

from django.utils.text import slugify

from core.artifacts import ArtifactMissingError, artifact_exists, artifact_get, artifact_put
from inference.export import (
    ARCHIVES,
    ExportError,
    ModelCard,
    adapter_base,
    adapter_merge,
    archive_chunks,
    entries_size,
    export_entries,
    folder_write,
    is_adapter,
    model_card_text,
)
from runs.models import Checkpoint, MetricPoint, Run
from runs.run_store import policy_dir, run_prefix, staging_dir

WEIGHTS = ("full", "adapter")
__all__ = [
    "ARCHIVES",
    "WEIGHTS",
    "ExportError",
    "ExportPlan",
    "archive_chunks",
    "entries_size",
    "export_plan",
    "folder_write",
]


@dataclass
class ExportPlan:
    """What an export holds: its files (the card last) and the name of its folder."""

    name: str
    entries: list
    card: str


def start_model(run: Run) -> str:
    """What the run started from: its tier's base model, or the checkpoint it was forked from."""
    if run.parent_checkpoint is not None:
        parent = run.parent_checkpoint
        return str(policy_dir(parent.run_id, parent.policy_version))
    return run.tier_config.get("base_model", "")


def checkpoint_policy(checkpoint: Checkpoint) -> Path:
    try:
        return policy_dir(checkpoint.run_id, checkpoint.policy_version)
    except ArtifactMissingError:
        raise ExportError(
            f"the weights of step {checkpoint.step} (policy version {checkpoint.policy_version}) "
            "are no longer in the artifact storage"
        ) from None


def export_folder(checkpoint: Checkpoint, weights: str) -> tuple[Path, str]:
    """The folder to export and how its weights are described on the card."""
    if weights not in WEIGHTS:
        raise ExportError(f"weights must be one of {', '.join(WEIGHTS)}; got {weights!r}")
    folder = checkpoint_policy(checkpoint)
    if not is_adapter(folder):
        if weights == "adapter":
            raise ExportError("this run trained all weights: it has no adapter; export weights=full")
        return folder, "full"
    if weights == "adapter":
        return folder, "LoRA adapter"
    return merged_export(checkpoint, folder), "LoRA merged into the base"


def merged_export(checkpoint: Checkpoint, adapter: Path) -> Path:
    """The adapter merged into its base: made once, kept in the artifact storage for every host."""
    # Named by the adapter's content: a version republished after a rollback merges anew.
    digest = adapter_digest(adapter)
    prefix = f"{run_prefix(checkpoint.run_id)}/exports/v{checkpoint.policy_version}-{digest}-merged"
    if artifact_exists(prefix):
        return artifact_get(prefix)
    base = adapter_base(adapter) or start_model(checkpoint.run)
    staged = staging_dir()
    try:
        adapter_merge(adapter, base, staged / "merged")
        artifact_put(staged / "merged", prefix)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return artifact_get(prefix)


def adapter_digest(adapter: Path) -> str:
    """A short digest of the adapter's files (an adapter is small: megabytes)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in adapter.rglob("*") if p.is_file()):
        digest.update(path.relative_to(adapter).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def held_out_rows(run: Run, up_to: int) -> list[dict]:
    """The run's held-out metrics by step, up to the checkpoint's step."""
    points = MetricPoint.objects.filter(run=run, name__startswith="heldout/", step__lte=up_to).order_by(
        "step"
    )
    rows: dict[int, dict] = {}
    for step, name, value in points.values_list("step", "name", "value"):
        rows.setdefault(step, {"step": step})[name.removeprefix("heldout/")] = value
    return list(rows.values())


def model_card(checkpoint: Checkpoint, weights: str) -> ModelCard:
    run = Run.objects.select_related(
        "project", "task_set_version__task_set", "reward_rule_version__rule", "parent_checkpoint"
    ).get(pk=checkpoint.run_id)
    version, rule = run.task_set_version, run.reward_rule_version
    data = {
        "Task set": f"{version.task_set.name} v{version.number} ({version.item_count} items)",
        "Train split": f"{run.train_split} ({version.split_counts.get(run.train_split, 0)} items)",
        "Held-out split": f"{run.eval_split} ({version.split_counts.get(run.eval_split, 0)} items)",
    }
    if run.parent_checkpoint is not None:
        data["Forked from"] = f"run {run.parent_checkpoint.run_id}, step {run.parent_checkpoint.step}"
    return ModelCard(
        title=f"{run.name}, step {checkpoint.step}",
        base_model=run.tier_config.get("base_model", ""),
        method=run.method,
        weights=weights,
        step=checkpoint.step,
        policy_version=checkpoint.policy_version,
        data=data,
        reward_rule={"Name": f"{rule.rule.name} v{rule.number}", "spec": rule.spec},
        hyperparameters=run.resolved,
        decoding=run.tier_config,
        held_out=held_out_rows(run, checkpoint.step),
        source=f'run "{run.name}" (id {run.pk}) of project "{run.project.name}"',
    )


def export_plan(checkpoint: Checkpoint, weights: str = "full") -> ExportPlan:
    """The files of the checkpoint's export and its folder name; ExportError when it cannot be made."""
    folder, described = export_folder(checkpoint, weights)
    card = model_card_text(model_card(checkpoint, described))
    run_name = slugify(checkpoint.run.name) or "run"
    suffix = "-adapter" if weights == "adapter" else ""
    name = f"{run_name}-{checkpoint.run_id}-step-{checkpoint.step}{suffix}"
    return ExportPlan(name=name, entries=export_entries(folder, card), card=card)

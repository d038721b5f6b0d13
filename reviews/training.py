"""Train on reviews: a run's labels and preferences become a new task-set version, and an SFT or
DPO run on it starts from the run's final checkpoint, in one step.

The version holds, on its train split, what the reviews give (good trajectories for SFT; explicit
preferences and good-over-bad pairs for DPO), each item keeping its source item's kind and grading
fields (so the run's reward rule still fits) with `metadata.provenance` saying where it came from,
and on its held-out split the source version's held-out items unchanged, so the new run is
evaluated on the same items as its parent and the comparison is like for like.

- SFT: an item per good trajectory, its completion as the learner's target (`reference` of an
  answer item, `reference_solution` of a code item).
- DPO: an item per pair: `metadata.chosen` and `metadata.rejected` hold the two completions.

Beside the new run it launches its **control**: the same checkpoint continued for the same number
of steps with the parent's own method and settings, without the reviews (a fork). Reviews are worth
their cost only if the run on them beats what more of the same training would have done, so the
result (`reviews.results`) reports the lift over the control, paired item by item.
"""

import json
import math
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction

from core.exceptions import StateError
from projects import services as project_services
from projects.models import TaskItem, TaskSet, TaskSetVersion
from reviews import exports
from reviews.exports import Pair
from reviews.models import ReviewTraining
from runs import selectors as run_selectors
from runs.lifecycle import RunRequest, run_create, run_fork
from runs.models import Checkpoint, Run, Trajectory

METHODS = (Run.Method.SFT, Run.Method.DPO)
DEFAULT_MAX_STEPS = 10
# Fine-tuning a trained checkpoint on a few reviewed records: the usual full fine-tuning rate, far
# gentler than a run from the base model (runs' default is 3e-4). On the demo (README, "make
# demo-flywheel") SFT at 1e-4 on 16 style-reviewed completions took held-out from 81.2% to 53.1%;
# at 1e-5 it kept 81.2%: a handful of records must not undo the parent.
DEFAULT_LEARNING_RATE = 1e-5
# Settings the child takes from its parent so their held-out figures compare like for like.
INHERITED = ("eval_items", "pass_threshold", "seed")


@dataclass
class TrainingSet:
    """The lines of the new version and what went into them."""

    lines: list[str]
    counts: dict[str, Any]


# The control follows the reviews run's evaluation and checkpoint schedule (so both are measured at
# the same steps); everything it learns with is its parent's.
CONTROL_SCHEDULE = ("checkpoint_every", "eval_every")


@dataclass
class TrainOnReviews:
    run: Run
    control: Run
    checkpoint: Checkpoint  # the parent's, where both runs start
    training: ReviewTraining
    version: TaskSetVersion
    version_created: bool
    counts: dict[str, Any]


def _item_line(item: TaskItem, *, external_id: str, split: str, data: dict[str, Any]) -> str:
    return json.dumps({"kind": item.kind, "id": external_id, "split": split} | data, ensure_ascii=False)


def _with_target(item: TaskItem, completion: str) -> dict[str, Any]:
    """The item's fields with `completion` as what SFT learns: an answer's reference, a code
    item's reference solution."""
    target = "reference_solution" if item.kind == TaskItem.Kind.CODE else "reference"
    return item.data | {target: completion}


def _metadata(item: TaskItem, **extra: Any) -> dict[str, Any]:
    return {"metadata": dict(item.data.get("metadata") or {}) | extra}


def sft_line(trajectory: Trajectory) -> str:
    item = trajectory.item
    provenance = exports.trajectory_provenance(trajectory) | {"label": "good"}
    data = _with_target(item, trajectory.completion_text) | _metadata(item, provenance=provenance)
    return _item_line(item, external_id=f"{item.external_id}-t{trajectory.pk}", split="train", data=data)


def dpo_line(pair: Pair) -> str:
    item = pair.chosen.item
    metadata = _metadata(
        item,
        chosen=pair.chosen.completion_text,
        rejected=pair.rejected.completion_text,
        provenance=exports.pair_provenance(pair),
    )
    return _item_line(item, external_id=pair.pair_id, split="train", data=item.data | metadata)


def heldout_lines(version: TaskSetVersion) -> list[str]:
    items = version.items.filter(split=TaskItem.Split.HELDOUT).order_by("position")
    return [
        _item_line(item, external_id=item.external_id, split=item.split, data=item.data)
        for item in items.iterator()
    ]


def training_set(*, run: Run, method: str, lines: bool = True) -> TrainingSet:
    """The new version's lines for `method` from `run`'s reviews, with their counts (only the
    counts when `lines` is false)."""
    if method not in METHODS:
        raise ValidationError({"method": f"must be one of {', '.join(METHODS)}"})
    export = exports.reviewed(run, good=method == Run.Method.SFT, pairs=method == Run.Method.DPO)
    if lines:
        heldout = heldout_lines(run.task_set_version)
        held = len(heldout)
    else:
        heldout, held = [], run.task_set_version.items.filter(split=TaskItem.Split.HELDOUT).count()
    if method == Run.Method.SFT:
        train = [sft_line(trajectory) for trajectory in export.good] if lines else []
        counts: dict[str, Any] = {"examples": len(export.good)}
    else:
        train = [dpo_line(pair) for pair in export.pairs] if lines else []
        preferred = sum(pair.source == "preference" for pair in export.pairs)
        pairs = len(export.pairs)
        counts = {"pairs": pairs, "from_preferences": preferred, "from_labels": pairs - preferred}
    counts |= {"heldout_items": held, "skipped": export.counts()}
    return TrainingSet(lines=train + heldout, counts=counts)


def training_counts(*, run: Run) -> dict[str, dict[str, Any]]:
    """What Train on reviews would make for each method, for the run page to show first."""
    return {method: training_set(run=run, method=method, lines=False).counts for method in METHODS}


def final_checkpoint(run: Run) -> Checkpoint:
    checkpoint = run_selectors.checkpoint_default(run)  # the best, else the newest
    if checkpoint is None:
        raise StateError(f"run {run.pk} has no checkpoint yet; train on its reviews once it has saved one")
    return checkpoint


def _task_set_for(run: Run, by: User, name: str | None) -> TaskSet:
    name = (name or f"{run.task_set_version.task_set.name} reviews")[:100].strip()
    task_set = TaskSet.objects.filter(project_id=run.project_id, name=name).first()
    if task_set is None:
        description = f"Reviewed data of runs, made by Train on reviews (first: run {run.pk}, {run.name})"
        task_set = project_services.task_set_create(
            project=run.project, name=name, by=by, description=description
        )
    return task_set


def _hyperparameters(run: Run, method: str, examples: int, max_steps: int, given: dict[str, Any]) -> dict:
    """The parent's evaluation settings, then enough epochs for `max_steps` steps and a fine-tuning
    learning rate, then what the caller gave (which wins)."""
    inherited = {name: run.resolved[name] for name in INHERITED if name in run.resolved}
    batch = given.get("batch_size", "auto")
    batch = 8 if batch == "auto" or not isinstance(batch, int) or batch < 1 else batch
    epochs = max(1, math.ceil(max_steps * batch / max(examples, 1)))
    return inherited | {"epochs": min(epochs, 1000), "learning_rate": DEFAULT_LEARNING_RATE} | given


@transaction.atomic
def train_on_reviews(
    *,
    run: Run,
    by: User,
    method: str,
    name: str | None = None,
    max_steps: int | None = None,
    hyperparameters: dict[str, Any] | None = None,
    task_set_name: str | None = None,
) -> TrainOnReviews:
    """A new task-set version from `run`'s reviews and an SFT or DPO run on it, started from the
    run's final checkpoint with `run` as parent. All of it, or (on any refusal) none of it."""
    checkpoint = final_checkpoint(run)
    data = training_set(run=run, method=method)
    trained_on = data.counts.get("examples", data.counts.get("pairs", 0))
    if not trained_on:
        wanted = (
            "trajectories labelled good"
            if method == Run.Method.SFT
            else "preferences, or a good and a bad label on completions of the same prompt"
        )
        raise ValidationError(
            {"method": f"run {run.pk}'s reviews hold nothing to train {method} on: it needs {wanted}"}
        )
    if run.tier is None:
        raise ValidationError({"tier": f"run {run.pk}'s tier was deleted; launch from the task set instead"})
    task_set = _task_set_for(run, by, task_set_name)
    report = project_services.task_set_import(
        task_set=task_set,
        stream=[(line + "\n").encode() for line in data.lines],
        file_format="jsonl",
        by=by,
        source_name=f"{method} on reviews of run {run.pk}",
    )
    if not report.ok:  # our own lines: a refusal here is a bug, said plainly
        raise ValidationError({"task_set": "; ".join(str(error) for error in report.errors)})
    steps = max_steps or DEFAULT_MAX_STEPS
    version = report.version
    assert version is not None  # an import that is no dry run and found no error made (or found) one
    request = RunRequest(
        project=run.project,
        name=name or f"{run.name} · {method} on reviews",
        task_set_version=version,
        reward_rule_version=run.reward_rule_version,
        tier=run.tier,
        method=method,
        hyperparameters=_hyperparameters(run, method, trained_on, steps, dict(hyperparameters or {})),
        max_steps=steps,
        priority=run.priority,
        eval_split="heldout" if version.split_counts.get("heldout") else "train",
    )
    child = run_create(request=request, by=by, parent=run, checkpoint=checkpoint)
    control = control_launch(parent=run, checkpoint=checkpoint, child=child, by=by)
    training = ReviewTraining.objects.create(
        run=child,
        control=control,
        parent=run,
        checkpoint=checkpoint,
        method=method,
        counts=data.counts,
        created_by=by,
    )
    return TrainOnReviews(
        run=child,
        control=control,
        checkpoint=checkpoint,
        training=training,
        version=version,
        version_created=report.created,
        counts=data.counts,
    )


def control_launch(*, parent: Run, checkpoint: Checkpoint, child: Run, by: User) -> Run:
    """`checkpoint` continued for `child`'s steps by `parent`'s own method and settings on its own
    data, without the reviews: what the run on the reviews has to beat."""
    schedule = {name: child.resolved[name] for name in CONTROL_SCHEDULE if name in child.resolved}
    return run_fork(
        checkpoint=checkpoint,
        by=by,
        name=f"{child.name[:90]} · control",
        max_steps=child.max_steps,
        hyperparameters=dict(parent.hyperparameters) | schedule,
    )

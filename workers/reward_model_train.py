"""Training a reward-model version: a learner process of its own (`python manage.py
train_reward_model VERSION_ID`), started and supervised by a Celery task on the learner queue
(workers/supervisor.py), like a run's learner.

The process reads the version's pairs (the task-set version's train split; its held-out split, or a
seeded share of the train pairs when that has none), measures held-out pair accuracy with the fresh
head (the baseline), trains with the Bradley–Terry loss (workers/learners/reward_model.py), writes
each step's loss, accuracy and epoch to the version, stops at a cancel, measures held-out and train
accuracy again, and saves the model (to a partial folder, renamed into place) before it marks the
version succeeded.

At each epoch's end it measures held-out pair accuracy (the page's live curve) and saves a
checkpoint (model, optimiser, scheduler, data position) to the artifact storage; a restarted learner
resumes at the recorded one. The data order is a pure function of (seed, step), so the replayed
steps see what the lost ones would have.
"""

import math
import os
import random
import shutil
from pathlib import Path
from typing import Any

from django.utils import timezone

from core.artifacts import artifact_delete, artifact_put
from reward_models.models import RewardModelVersion
from reward_models.store import (
    checkpoint_prefix,
    model_dir,
    model_publish,
    version_dir,
)
from runs.run_store import STORED_MARKER, checkpoint_fetch, checkpoint_is_local
from workers.learners.common import (
    CHECKPOINT_PREFIX,
    checkpoint_dirs,
    checkpoint_resume,
    checkpoint_save,
    epoch_rows,
)
from workers.learners.reward_model import (
    RewardModelConfig,
    pair_accuracy,
    reward_learner_create,
    reward_pairs_check,
    reward_step,
)

S = RewardModelVersion.Status
TRAIN_ACCURACY_PAIRS = 256  # train accuracy is measured on at most this many pairs
EPOCH_ACCURACY_PAIRS = 256  # the per-epoch held-out accuracy: on at most this many pairs


def version_pairs(version: RewardModelVersion) -> tuple[list[dict], list[dict]]:
    """(train pairs, held-out pairs) of the version's task-set version."""
    by_split: dict[str, list[dict]] = {}
    items = version.task_set_version.items.order_by("position").values_list("split", "data")
    for split, data in items:
        meta = data.get("metadata") or {}
        if {"chosen", "rejected"} <= set(meta):
            by_split.setdefault(split, []).append(
                {"prompt": data.get("prompt", ""), "chosen": meta["chosen"], "rejected": meta["rejected"]}
            )
    train, heldout = by_split.get("train", []), by_split.get("heldout", [])
    if not heldout and len(train) >= 2:
        hyper = version.hyperparameters
        order = list(range(len(train)))
        random.Random(hyper["seed"]).shuffle(order)
        cut = max(1, round(len(train) * hyper["heldout_fraction"])) if hyper["heldout_fraction"] > 0 else 0
        heldout = [train[index] for index in sorted(order[:cut])]
        train = [train[index] for index in sorted(order[cut:])]
    return reward_pairs_check(train), heldout


def reward_model_config(version: RewardModelVersion, pairs: int) -> RewardModelConfig:
    hyper = version.hyperparameters
    return RewardModelConfig(
        model=version.base_model,
        output_dir=str(version_dir(version.pk, version.key) / "learner"),
        seed=hyper["seed"],
        steps=min(hyper["max_steps"], math.ceil(hyper["epochs"] * pairs / hyper["batch_size"])),
        learning_rate=hyper["learning_rate"],
        lr_scheduler=hyper["lr_scheduler"],
        gradient_accumulation_steps=hyper["gradient_accumulation"],
        batch_size=hyper["batch_size"],
        center_rewards_coefficient=hyper["center_rewards_coefficient"],
        max_length=hyper["max_length"],
    )


def _update(version: RewardModelVersion, **fields) -> bool:
    """Write progress while the version is still ours to write (running); False once it is not."""
    return bool(
        RewardModelVersion.objects.filter(pk=version.pk, status=S.RUNNING).update(
            heartbeat_at=timezone.now(), **fields
        )
    )


def epochs_done(step: int, batch_size: int, pairs: int) -> float:
    """Passes over the training pairs after `step` steps (a batch may straddle two epochs)."""
    return step * batch_size / pairs


def epoch_ends(step: int, batch_size: int, pairs: int) -> bool:
    """Whether step `step` (counted from 1) finished an epoch."""
    return math.floor(epochs_done(step, batch_size, pairs)) > math.floor(
        epochs_done(step - 1, batch_size, pairs)
    )


def checkpoint_restore(version: RewardModelVersion, output_dir: str) -> None:
    """Make the version's recorded checkpoint the one in `output_dir` (fetched when this host lacks
    it); local checkpoints the record does not know (saved after it, by a learner that died before
    recording them) are set aside."""
    target = Path(output_dir) / f"{CHECKPOINT_PREFIX}{version.checkpoint_step}"
    for local in checkpoint_dirs(output_dir):
        if (
            not version.checkpoint_path
            or local != target
            or not checkpoint_is_local(version.checkpoint_path, local)
        ):
            shutil.rmtree(local, ignore_errors=True)
    if version.checkpoint_path and not checkpoint_dirs(output_dir):
        checkpoint_fetch(version.checkpoint_path, target)


def checkpoint_record(version: RewardModelVersion, learner, config: RewardModelConfig, step: int) -> bool:
    """Save the learner at `step`, upload it, and record it (the old one is deleted once replaced)."""
    learner.state.step = step
    local = checkpoint_save(learner, config)
    prefix = checkpoint_prefix(version.pk, version.key, step)
    (local / STORED_MARKER).write_text(artifact_put(local, prefix))
    old = RewardModelVersion.objects.filter(pk=version.pk).values_list("checkpoint_path", flat=True).get()
    recorded = _update(version, checkpoint_step=step, checkpoint_path=prefix)
    if recorded and old and old != prefix:
        artifact_delete(old)
    return recorded


def reward_model_train_main(version_id: int, log=print) -> None:
    version = RewardModelVersion.objects.select_related("task_set_version").get(pk=version_id)
    if version.status != S.RUNNING:
        return
    train, heldout = version_pairs(version)
    if not train:
        raise ValueError("no training pairs left once the held-out pairs were set aside")
    config = reward_model_config(version, len(train))
    learner = reward_learner_create(config)
    accuracy = {"max_length": config.max_length}
    checkpoint_restore(version, config.output_dir)
    start = checkpoint_resume(learner, config)
    fields: dict[str, Any] = {"learner_pid": os.getpid(), "steps": config.steps}  # model fields to write
    fields |= {"train_pairs": len(train), "heldout_pairs": len(heldout)}
    if start == 0:
        baseline = pair_accuracy(learner.model, learner.tokenizer, heldout, **accuracy)
        fields |= {"base_heldout_accuracy": baseline, "step": 0, "history": []}
        history: list[dict[str, Any]] = []
    else:  # what the lost steps after the checkpoint wrote is written again as they are replayed
        baseline = version.base_heldout_accuracy
        history = [entry for entry in version.history if entry["step"] <= start]
        fields |= {"step": start, "history": history}
    _update(version, **fields)
    log(
        f"reward model version {version.pk}: {len(train)} train pairs, {len(heldout)} held out, "
        f"{config.steps} steps" + (f"; resumed at step {start} (restart {version.restarts})" if start else "")
    )
    for step in range(start, config.steps):
        if (
            RewardModelVersion.objects.filter(pk=version.pk).values_list("status", flat=True).get()
            != S.RUNNING
        ):
            RewardModelVersion.objects.filter(pk=version.pk, status=S.CANCELLING).update(
                status=S.CANCELLED, finished_at=timezone.now(), error=f"cancelled at step {step}"
            )
            log(f"stopped at step {step}")
            return
        rows = epoch_rows(len(train), config.batch_size, config.seed, step)
        metrics = reward_step(learner, train, rows, config)
        done = step + 1
        entry: dict[str, Any] = {
            "step": done,
            "epoch": round(epochs_done(done, config.batch_size, len(train)), 4),
        }
        entry |= {name: round(value, 6) for name, value in metrics.items()}
        entry["restart"] = version.restarts  # which start of the learner trained this step
        ends_epoch = epoch_ends(done, config.batch_size, len(train))
        if ends_epoch and heldout:
            held = pair_accuracy(learner.model, learner.tokenizer, heldout[:EPOCH_ACCURACY_PAIRS], **accuracy)
            entry["heldout_accuracy"] = held
        history.append(entry)
        _update(version, step=done, history=history)
        log(f"step {done} " + " ".join(f"{name} {value}" for name, value in entry.items() if name != "step"))
        if ends_epoch and done < config.steps:
            checkpoint_record(version, learner, config, done)
            log(f"checkpoint at step {done}")
    model = learner.accelerator.unwrap_model(learner.model)
    final = pair_accuracy(model, learner.tokenizer, heldout, **accuracy)
    on_train = pair_accuracy(model, learner.tokenizer, train[:TRAIN_ACCURACY_PAIRS], **accuracy)
    partial = model_dir(version.pk, version.key).with_name(".model.partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    learner.tokenizer.save_pretrained(partial)
    path = model_publish(version.pk, version.key, partial)  # through the artifact storage
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(config.output_dir, ignore_errors=True)
    last = RewardModelVersion.objects.filter(pk=version.pk).values_list("checkpoint_path", flat=True).get()
    done = RewardModelVersion.objects.filter(pk=version.pk, status__in=(S.RUNNING, S.CANCELLING)).update(
        status=S.SUCCEEDED,
        heldout_accuracy=final,
        train_accuracy=on_train,
        path=path,
        checkpoint_path="",
        finished_at=timezone.now(),
        heartbeat_at=timezone.now(),
    )
    if done and last:
        artifact_delete(last)  # the trained model replaces it
    log(f"held-out pair accuracy {baseline} -> {final}; train {on_train}; saved to {path} ({done})")

"""Training a reward-model version: a learner process of its own (`python manage.py
train_reward_model VERSION_ID`), started and waited for by a Celery task on the learner queue, like a
run's learner (never a long loop inside a task body).

The process reads the version's pairs (the task-set version's train split; its held-out split, or a
seeded share of the train pairs when that has none), measures held-out pair accuracy with the fresh
head (the baseline), trains with the Bradley–Terry loss (workers/learners/reward_model.py), writes
each step's loss and accuracy to the version, stops at a cancel, measures held-out and train
accuracy again, and saves the model (to a partial folder, renamed into place) before it marks the
version succeeded.
"""

import math
import os
import random
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from reward_models.models import RewardModelVersion
from reward_models.store import log_path, model_dir, model_publish, version_dir
from workers.learners.common import epoch_rows
from workers.learners.reward_model import (
    RewardModelConfig,
    pair_accuracy,
    reward_learner_create,
    reward_pairs_check,
    reward_step,
)

S = RewardModelVersion.Status
LOG_TAIL_LINES = 20
TRAIN_ACCURACY_PAIRS = 256  # train accuracy is measured on at most this many pairs


def reward_model_claim(version_id: int) -> bool:
    """Take a queued version, or a running one whose learner stopped reporting (its host died)."""
    stale = timezone.now() - timedelta(seconds=settings.FLYWHEEL_LEARNER_HEARTBEAT_TIMEOUT)
    claimable = Q(status=S.QUEUED) | Q(status=S.RUNNING, heartbeat_at__lt=stale)
    return bool(
        RewardModelVersion.objects.filter(claimable, pk=version_id).update(
            status=S.RUNNING, heartbeat_at=timezone.now(), started_at=timezone.now(), error=""
        )
    )


def reward_model_supervise(version_id: int) -> None:
    """Run the version's learner process and settle the version if it dies without doing so."""
    if not reward_model_claim(version_id):  # done, cancelled, or a redelivery while it trains
        return
    version = RewardModelVersion.objects.get(pk=version_id)
    log = log_path(version.pk, version.key)
    with open(log, "ab") as output:
        process = subprocess.Popen(
            [
                sys.executable,
                str(Path(settings.BASE_DIR) / "manage.py"),
                "train_reward_model",
                str(version_id),
            ],
            cwd=settings.BASE_DIR,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    RewardModelVersion.objects.filter(pk=version_id).update(learner_pid=process.pid)
    code = process.wait()
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])
        RewardModelVersion.objects.filter(pk=version_id, status__in=(S.RUNNING, S.CANCELLING)).update(
            status=S.FAILED,
            error=f"the learner exited with code {code}\n{tail}".strip(),
            finished_at=timezone.now(),
        )


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
    baseline = pair_accuracy(learner.model, learner.tokenizer, heldout, **accuracy)
    _update(
        version,
        learner_pid=os.getpid(),
        steps=config.steps,
        train_pairs=len(train),
        heldout_pairs=len(heldout),
        base_heldout_accuracy=baseline,
    )
    log(
        f"reward model version {version.pk}: {len(train)} train pairs, {len(heldout)} held out, "
        f"{config.steps} steps"
    )
    history = []
    for step in range(config.steps):
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
        history.append({"step": step + 1} | {name: round(value, 6) for name, value in metrics.items()})
        _update(version, step=step + 1, history=history)
        log(f"step {step + 1} " + " ".join(f"{name} {value:.4f}" for name, value in metrics.items()))
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
    done = RewardModelVersion.objects.filter(pk=version.pk, status__in=(S.RUNNING, S.CANCELLING)).update(
        status=S.SUCCEEDED,
        heldout_accuracy=final,
        train_accuracy=on_train,
        path=path,
        finished_at=timezone.now(),
        heartbeat_at=timezone.now(),
    )
    log(f"held-out pair accuracy {baseline} -> {final}; train {on_train}; saved to {path} ({done})")

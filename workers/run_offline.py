"""SFT and DPO runs: the learner trains on the task set itself, with no rollouts.

SFT learns each train item's reference (an answer item's `reference`, a code item's
`reference_solution`); DPO learns the preference pairs held in the items' metadata (`chosen`,
`rejected`, as the reviews export writes them), against the starting policy as reference. The
lifecycle is the GRPO run's: the same status checks, budgets, published versions, metric points,
checkpoints, held-out evaluation on the eval queue, and an exact resume from the last checkpoint.
"""

import math
import time
from typing import Any

from inference.chat import item_prompt
from runs.models import Run
from runs.run_store import learner_dir
from runs.services import metrics_write
from workers.learners.common import (
    Learner,
    epoch_rows,
    learner_create,
    reference_create,
)
from workers.learners.dpo import DPOConfig, dpo_pairs_check, dpo_step
from workers.learners.sft import SFTConfig, sft_examples, sft_step
from workers.run_learner import (
    Log,
    StopRequestedError,
    adapter_settings,
    budget_spent,
    checkpoint,
    evaluate_later,
    finish,
    mark_running,
    publish,
    resume,
    rollback_to,
    start_model,
    status_check,
    stop_at,
    train_items,
)


def offline_config(run: Run) -> SFTConfig | DPOConfig:
    hyper = run.resolved
    common: dict[str, Any] = {
        "model": start_model(run),
        "output_dir": str(learner_dir(run.pk)),
        "seed": hyper["seed"],
        "steps": run.max_steps,
        "learning_rate": hyper["learning_rate"],
        "lr_scheduler": hyper["lr_scheduler"],
        "gradient_accumulation_steps": hyper["gradient_accumulation"],
        "mixed_precision": hyper["mixed_precision"],
        "gradient_checkpointing": hyper.get("gradient_checkpointing") == "on",
        "micro_batch_tokens": hyper.get("micro_batch_tokens", 0),
        **adapter_settings(hyper),
        "checkpoint_every": hyper["checkpoint_every"],
        "batch_size": hyper["batch_size"],
        "chat": run.tier_config.get("chat", True),
    }
    if run.method == Run.Method.DPO:
        return DPOConfig(**common, beta=hyper["beta"])
    return SFTConfig(**common)


def offline_data(run: Run) -> list[dict]:
    """The run's training examples (SFT) or preference pairs (DPO), from its train split."""
    items = train_items(run)
    if run.method == Run.Method.DPO:
        return dpo_pairs_check(
            [
                {"prompt": item_prompt(item), "chosen": meta["chosen"], "rejected": meta["rejected"]}
                for item in items
                if {"chosen", "rejected"} <= set(meta := item.get("metadata") or {})
            ]
        )
    return sft_examples(
        [
            {
                "prompt": item_prompt(item),
                "completion": item.get("reference_solution") or item.get("reference"),
                "tool_chat": item.get("tool_chat"),
            }
            for item in items
        ]
    )


def offline_steps(run: Run, examples: int) -> int:
    """max_steps, or fewer when the `epochs` passes over the data end first."""
    hyper = run.resolved
    return min(run.max_steps, math.ceil(hyper["epochs"] * examples / hyper["batch_size"]))


def offline_main(run_id: int, log: Log = print) -> None:
    run = Run.objects.select_related("task_set_version").get(pk=run_id)
    config, data = offline_config(run), offline_data(run)
    learner, _ = learner_create(config)
    reference = reference_create(config, learner) if run.method == Run.Method.DPO else None
    step = resume(run, learner, config)
    rollback_to(run, step)
    publish(run, step, learner)
    if step == 0:
        evaluate_later(run.pk, 0)
    run = mark_running(run)
    steps = offline_steps(run, len(data))
    log(f"run {run.pk}: {run.method} learner at step {step} of {steps}, {len(data)} examples")
    reason = None
    learner.model.train()
    started_at = step
    while step < steps:
        try:
            status_check(run)
        except StopRequestedError as stop:
            stop_at(run, learner, config, step, str(stop))
            return
        if (reason := budget_spent(run)) is not None:
            break
        started = time.monotonic()
        metrics = _learn(run, learner, reference, config, data, step)
        learner.state.step = step = step + 1
        publish(run, step, learner)
        values = {f"learner/{name}": value for name, value in metrics.items()}
        metrics_write(run, step, values | {"time/learn": time.monotonic() - started})
        if step % config.checkpoint_every == 0 or step == steps:
            checkpoint(run, learner, config, step)
        if _evaluation_due(run, step, steps):
            evaluate_later(run.pk, step)
        log(f"run {run.pk}: step {step} {metrics}")
    finish(
        run, learner, config, step, reason, requested=step > started_at and _evaluation_due(run, step, steps)
    )


def _evaluation_due(run: Run, step: int, steps: int) -> bool:
    return step % int(run.resolved["eval_every"]) == 0 or step == steps


def _learn(run: Run, learner: Learner, reference, config, data: list[dict], step: int) -> dict[str, float]:
    rows = epoch_rows(len(data), config.batch_size, config.seed, step)
    if run.method == Run.Method.DPO:
        return dpo_step(learner, reference, data, rows, config)
    return sft_step(learner, data, rows, config)

"""The learner of a run: one long-lived process per run (`python manage.py run_learner RUN_ID`),
started and watched by a Celery task, never run inside a task body.

Per step s (the weights after s steps are policy version s):
1. dispatch: rollout batches exist for steps s .. s+k, each sampled with the newest published
   version, so rollouts run while the learner trains and never more than k versions ahead;
2. wait for step s's batches; the step closes on its complete groups once they are all in or the
   episode deadline has passed (live stragglers are recorded, not waited for; a batch whose worker
   died is claimed again and waited for);
3. learn on the complete groups (GRPO: group advantages, clipped ratio against the behaviour
   log-probs, optional KL), skipping errored trajectories and those older than s - k: the step of
   `manage.py train_learner grpo` (`grpo_step`), fed by the rollout workers;
4. mark what was learned (`learned_in_step`), publish version s+1, write metrics, checkpoint.

A restart resumes from the last checkpoint: what later steps had learned is released again, and
episodes sampled by versions the resume rolled back are cancelled, so no trajectory is lost and
none is learned from twice.
"""

import importlib
import logging
import math
import os
import shutil
import socket
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from pathlib import Path
from statistics import fmean, pstdev
from types import ModuleType
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Case, FloatField, Max, Q, Value, When
from django.utils import timezone

from core import events
from core.exceptions import StateError
from costs import selectors as cost_selectors
from costs import services as costs
from costs.services import usage_record
from episodes import services as episode_services
from evaluations import services as suites
from evaluations import tasks as suite_tasks
from inference.generation import Completion
from projects.models import TaskItem
from runs import monitors, outcomes
from runs.learners import algorithm_get, plays_external
from runs.lifecycle import run_event, run_fail, run_transition
from runs.models import Checkpoint, MetricPoint, RolloutBatch, Run, RunEvent, Trajectory, TrajectoryStep
from runs.run_store import (
    checkpoint_fetch,
    checkpoint_is_local,
    checkpoint_upload,
    learner_dir,
    policies_discard_after,
    policy_dir,
    policy_publish,
)
from runs.services import metrics_write
from runs.tier_policies import run_final_evaluate
from workers import tasks
from workers.learner_group import (
    group_batch,
    group_checkpoint,
    group_follow,
    group_init,
    group_prepare,
    group_stop,
)
from workers.learners.common import (
    CHECKPOINT_PREFIX,
    checkpoint_dirs,
    checkpoint_resume,
    checkpoint_save,
    learner_create,
)
from workers.learners.device_figures import step_figures, step_memory_reset, synchronise
from workers.learners.grpo import GRPOConfig, grpo_step, learnable, step_items
from workers.rollout import Trajectory as Episode
from workers.run_rollout import item_dicts, lease_lapsed, rollout_batches_expire
from workers.usage import device_class, warm_up_first, worker_name

logger = logging.getLogger(__name__)
S = Run.Status
POLL_SECONDS = 0.2
FINAL_EVAL_NOTICE_SECONDS = 5.0  # say on the run page why it is not finished yet
FINAL_EVAL_RESEND_SECONDS = 300.0  # ask again for an evaluation not written by then
Log = Callable[[str], None]


class StopRequestedError(Exception):
    """The run was paused or cancelled while the learner waited."""


class FinalEvaluationError(Exception):
    """The held-out evaluation a finished run waits for failed (its message says why)."""


def start_model(run: Run) -> str:
    if run.parent_checkpoint is not None:
        checkpoint = run.parent_checkpoint
        return str(policy_dir(checkpoint.run_id, checkpoint.policy_version))
    return run.tier_config["base_model"]


def adapter_settings(hyper: dict) -> dict:
    """The learner's adapter settings from a run's resolved hyperparameters (older runs: none)."""
    names = ("adapter", "lora_rank", "lora_alpha", "lora_dropout", "lora_target_modules")
    return {name: hyper[name] for name in names if name in hyper}


def common_settings(run: Run) -> dict[str, Any]:
    """The learner settings every algorithm takes, from the run (an algorithm's `run_config` adds
    its own); an online algorithm also gets the tier's `chat`."""
    hyper = run.resolved
    return {
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
        "chat": run.tier_config.get("chat", True),
    }


def learner_module(run: Run) -> ModuleType:
    """The module of the run's algorithm that learns (runs/learners.py names it)."""
    algorithm = algorithm_get(run.method)
    if algorithm is None:
        raise ValueError(f"run {run.pk}: no learner is registered for method {run.method!r}")
    return importlib.import_module(algorithm.learner)


def learner_config(run: Run) -> Any:
    return learner_module(run).run_config(run, common_settings(run))


def train_items(run: Run) -> list[dict]:
    ids = (
        run.task_set_version.items.filter(split=run.train_split)
        .order_by("position")
        .values_list("pk", flat=True)
    )
    return item_dicts(list(ids))


# --- the loop ------------------------------------------------------------------------------


def learner_main(run_id: int, log: Log = print) -> None:
    """The run's learner, whatever its algorithm: one that learns from the run's rollouts (`online`),
    one that learns from the task set's examples, or one whose module serves its own loop. Under
    `accelerate launch` rank 0 leads and the others follow it (workers/learner_group.py)."""
    method = Run.objects.filter(pk=run_id).values_list("method", flat=True).get()
    algorithm = algorithm_get(method)
    module = importlib.import_module(algorithm.learner) if algorithm is not None else None
    # A learner that runs its own loop (the Tinker API's models).
    if module is not None and hasattr(module, "serve"):
        module.serve(run_id, log)
        return
    if algorithm is not None and not algorithm.online:
        _offline_main(run_id, log)
        return
    group_init()
    learner = _online_main(run_id, log)
    if learner is not None and learner.accelerator.is_main_process:
        group_stop(learner.accelerator)


def _online_main(run_id: int, log: Log):
    run = Run.objects.select_related("task_set_version", "reward_rule_version").get(pk=run_id)
    module = learner_module(run)
    config = module.run_config(run, common_settings(run))
    items = train_items(run)
    learner, _ = learner_create(config)
    group_prepare(learner)
    reference = module.reference_for(config, learner)
    step = resume(run, learner, config)
    if not learner.accelerator.is_main_process:
        group_follow(learner, config, reference, learner.tokenizer.pad_token_id)
        return None
    rollback_to(run, step)
    publish(run, step, learner)
    if step == 0:
        evaluate_later(run.pk, 0)  # the starting point, so the chart shows the lift
    run = mark_running(run)
    log(f"run {run.pk}: learner at step {step} (pid {os.getpid()})")
    started_at = step
    while step < run.max_steps:
        try:
            status_check(run)
            if (reason := budget_spent(run)) is not None:
                break
            if step > 0 and costs.run_budget_check(run=run, step=step) is not None:
                status_check(run)  # now pausing: stops here, checkpointed at this step
            dispatch(run, step, config, items)
            waited = time.monotonic()
            episodes, rows = wait_for_step(run, step, config)
            wait_seconds = time.monotonic() - waited
        except StopRequestedError as stop:
            stop_at(run, learner, config, step, str(stop))
            return learner
        learned = time.monotonic()
        step_memory_reset(learner.accelerator.device)
        chosen, metrics = grpo_step(
            learner,
            episodes,
            config,
            reference,
            step,
            choose=getattr(module, "learnable", learnable),  # an algorithm may weigh episodes its own way
            batch_of=partial(group_batch, learner.accelerator),  # every process learns its share
            learn=module.learn_batch,
        )
        synchronise(learner.accelerator.device)
        learn_seconds = time.monotonic() - learned
        metrics |= device_figures(learner, metrics, learn_seconds)
        step = learner.state.step
        mark_learned(rows, chosen.keep, chosen.advantages, step - 1)
        learner_usage_record(run, step, learner, rows, chosen.keep, learn_seconds)
        publish(run, step, learner)
        metrics |= {"entropy": sampled_entropy(episodes), "learned": len(chosen.keep)}
        alerts = record_metrics(
            run, step, rows, metrics, chosen.dropped, learn=time.monotonic() - learned, wait=wait_seconds
        )
        cost_metrics_write(run, step)
        if step % config.checkpoint_every == 0 or step == run.max_steps:
            checkpoint(run, learner, config, step)
        if evaluation_due(run, step):
            evaluate_later(run.pk, step)
        log(f"run {run.pk}: step {step} learned {len(chosen.keep)} episodes {metrics}")
        if (alert := stopping_alert(alerts)) is not None:
            fail_at(run, learner, config, step, alert)
            return learner
    else:
        reason = None
    _cancel_pending(run)
    finish(run, learner, config, step, reason, requested=step > started_at and evaluation_due(run, step))
    return learner


def learner_usage_record(
    run: Run, step: int, learner, rows: list[Trajectory], keep: list[int], seconds: float
) -> None:
    """The step's learner units: time on each of its devices (every rank holds one for the
    step), and the sampled tokens of the episodes it learned from. A step run again after a resume
    replaces its record (costs.services.usage_record)."""
    accelerator = learner.accelerator
    usage_record(
        run_id=run.pk,
        step=step,
        component="learner",
        kind="learner",
        worker=worker_name(),
        warm_up=warm_up_first("learner"),  # the first step of this learner process
        device_class=device_class(accelerator.device),
        device_seconds=seconds * accelerator.num_processes,
        tokens_trained=sum(rows[index].completion_tokens for index in keep),
    )


def device_figures(learner, metrics: dict[str, float], seconds: float) -> dict[str, float]:
    """The step's `step_seconds`, `peak_memory_mb` and `mfu` (workers/learners/device_figures.py):
    MFU from the step's trained `tokens` and the device's peak (FLYWHEEL_DEVICE_PEAK_TFLOPS, else a
    known GPU's); none without either. Under several processes, rank 0's share on one device."""
    model = learner.accelerator.unwrap_model(learner.model)
    return step_figures(
        model,
        learner.accelerator.device,
        metrics.get("tokens"),
        seconds,
        settings.FLYWHEEL_DEVICE_PEAK_TFLOPS,
    )


def cost_metrics_write(run: Run, step: int) -> None:
    """What the run has spent by the end of this step, as metrics: the cost chart's points and
    the evidence of the step at which a budget was crossed."""
    spent = cost_selectors.run_spent(run=run)
    metrics_write(run, step, {"cost/total": float(spent.total), "cost/device_hours": spent.device_hours})


def _offline_main(run_id: int, log: Log) -> None:
    """A run whose algorithm learns from the task set itself (SFT's references, DPO's pairs), with
    no rollouts: the same status checks, budgets, published versions, metric points, checkpoints,
    held-out evaluation and exact resume as an online run."""
    run = Run.objects.select_related("task_set_version").get(pk=run_id)
    module = learner_module(run)
    config = module.run_config(run, common_settings(run))
    data = module.run_data(run, train_items(run))
    learner, _ = learner_create(config)
    reference = module.reference_for(config, learner)
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
        if step > 0 and costs.run_budget_check(run=run, step=step) is not None:
            stop_at(run, learner, config, step, S.PAUSING)  # paused at its budget, checkpointed here
            return
        started = time.monotonic()
        step_memory_reset(learner.accelerator.device)
        metrics = module.learn_examples(learner, reference, config, data, step)
        synchronise(learner.accelerator.device)
        metrics |= device_figures(learner, metrics, time.monotonic() - started)
        learner.state.step = step = step + 1
        learner_usage_record(run, step, learner, [], [], time.monotonic() - started)
        publish(run, step, learner)
        values = {f"learner/{name}": value for name, value in metrics.items()}
        metrics_write(run, step, values | {"time/learn": time.monotonic() - started})
        cost_metrics_write(run, step)
        if step % config.checkpoint_every == 0 or step == steps:
            checkpoint(run, learner, config, step)
        if _offline_evaluation_due(run, step, steps):
            evaluate_later(run.pk, step)
        log(f"run {run.pk}: step {step} {metrics}")
    requested = step > started_at and _offline_evaluation_due(run, step, steps)
    finish(run, learner, config, step, reason, requested=requested)


def offline_steps(run: Run, examples: int) -> int:
    """max_steps, or fewer when the `epochs` passes over the data end first."""
    hyper = run.resolved
    return min(run.max_steps, math.ceil(hyper.get("epochs", 1) * examples / hyper["batch_size"]))


def _offline_evaluation_due(run: Run, step: int, steps: int) -> bool:
    return step % int(run.resolved["eval_every"]) == 0 or step == steps


def evaluation_due(run: Run, step: int) -> bool:
    """Whether the loop asks for a held-out evaluation after `step` (its schedule, and the last)."""
    return step % int(run.resolved["eval_every"]) == 0 or step == run.max_steps


def finish(run: Run, learner, config, step: int, reason: str | None, *, requested: bool) -> None:
    """A run is finished only once its final checkpoint is evaluated: checkpoint, wait for the
    held-out evaluation of the final version (and of the start, version 0), record the outcome
    against the start (runs/outcomes.py), then mark the run succeeded and ask for the final
    checkpoint under every tier of the project. A pause or cancel while waiting is honoured; a
    resumed run comes back here and waits again."""
    checkpoint(run, learner, config, step)
    try:
        final_evaluation_wait(run, step, ask=not requested)
    except StopRequestedError as stop:
        stop_at(run, learner, config, step, str(stop))
        return
    except FinalEvaluationError as failed:  # retry waits for a fresh evaluation from the checkpoint
        run_fail(
            run=run, message=str(failed), where=f"the final evaluation of step {step}, on the eval queue"
        )
        return
    comparison = outcomes.run_outcome_settle(run=run, step=step)
    message = "succeeded" if reason is None else f"succeeded: stopped early, {reason}"
    if comparison is not None:
        message += f"; {outcomes.outcome_sentence(run.outcome_detail)}"
    regressed = comparison is not None and comparison.verdict == Run.Outcome.REGRESSED
    run_transition(
        run,
        allowed=(S.RUNNING, S.PAUSING),
        to=S.SUCCEEDED,
        message=message,
        level="warning" if regressed else "info",
    )
    run_final_evaluate(run.pk)  # the final checkpoint under every tier of the project, on the eval queue


def final_evaluation_wait(run: Run, step: int, *, ask: bool) -> None:
    """Block until the held-out evaluations of version 0 and `step` are written: asked for now
    when `ask` (the loop did not: it stopped early, or this learner resumed at the end), and again
    for one that seems lost (a broker that restarted without persistence). A failed one raises."""
    # Failures since the run last changed status (a retry starts afresh) count.
    status = RunEvent.objects.filter(run=run, kind="status").order_by("-pk")
    since = status.values_list("pk", flat=True).first() or 0
    started = asked_at = time.monotonic()
    told = False
    while missing := [version for version in sorted({0, step}) if not heldout_written(run, version)]:
        status_check(run)
        failed = RunEvent.objects.filter(
            run=run, kind="evaluation_failed", pk__gt=since, data__step__in=missing
        ).first()
        if failed is not None:
            raise FinalEvaluationError(failed.message)
        if ask or time.monotonic() - asked_at > FINAL_EVAL_RESEND_SECONDS:
            for version in missing:
                evaluate_later(run.pk, version)
            asked_at, ask = time.monotonic(), False
        if not told and time.monotonic() - started > FINAL_EVAL_NOTICE_SECONDS:
            run_event(
                run, "evaluation", f"waiting for the held-out evaluation of step {missing[-1]} to finish"
            )
            told = True
        time.sleep(POLL_SECONDS)


def heldout_written(run: Run, version: int) -> bool:
    return MetricPoint.objects.filter(run=run, name="heldout/pass_rate", step=version).exists()


def stopping_alert(alerts: list[RunEvent]) -> RunEvent | None:
    """The first alert whose monitor's action is stop (runs/monitors.py), if any."""
    return next((alert for alert in alerts if alert.data.get("action") == "stop"), None)


def fail_at(run: Run, learner, config, step: int, alert: RunEvent) -> None:
    """A monitor stopped the run: checkpoint (to fork from), drop pending work, fail with its reason."""
    checkpoint(run, learner, config, step)
    _cancel_pending(run)
    run_fail(run=run, message=alert.message, where=f"monitor {alert.data.get('monitor')} after step {step}")


def mark_running(run: Run) -> Run:
    fields: dict[str, Any] = {
        "learner_pid": os.getpid(),
        "learner_host": socket.gethostname(),
        "heartbeat_at": timezone.now(),
    }
    if run.started_at is None:
        fields["started_at"] = timezone.now()
    try:
        return run_transition(run, allowed=(S.STARTING,), to=S.RUNNING, message="running", **fields)
    except StateError:  # a restarted learner of a run that was already running
        Run.objects.filter(pk=run.pk).update(**fields)
        run.refresh_from_db()
        return run


def status_check(run: Run) -> None:
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now())
    status = Run.objects.filter(pk=run.pk).values_list("status", flat=True).get()
    if status in (S.PAUSING, S.CANCELLING):
        raise StopRequestedError(status)
    if status != S.RUNNING:
        raise StopRequestedError(f"status is {status}")


def _cancel_pending(run: Run) -> None:
    """Work nobody started is not needed any more; work in progress finishes for the record. An
    external agent's episode cannot finish for the record (nobody learns from it), so the batches
    agents play are cancelled too, and their open episodes with them."""
    ended = (
        (RolloutBatch.Status.PENDING, RolloutBatch.Status.RUNNING)
        if external(run)
        else (RolloutBatch.Status.PENDING,)
    )
    batches = RolloutBatch.objects.filter(run=run, status__in=ended)
    ids = list(batches.values_list("pk", flat=True))
    batches.update(status=RolloutBatch.Status.CANCELLED)
    episode_services.episodes_cancel(batches=ids)


def external(run: Run) -> bool:
    """Whether agents outside Flywheel play the run's episodes (episodes/), not rollout workers."""
    return plays_external(run.method)


def stop_at(run: Run, learner, config: GRPOConfig, step: int, why: str) -> None:
    _cancel_pending(run)
    if why == S.PAUSING:
        checkpoint(run, learner, config, step)
        run_transition(run, allowed=(S.PAUSING,), to=S.PAUSED, message=f"paused at step {step}")
    elif why == S.CANCELLING:
        run_transition(run, allowed=(S.CANCELLING,), to=S.CANCELLED, message=f"cancelled at step {step}")


def budget_spent(run: Run) -> str | None:
    run.refresh_from_db(fields=["started_at", "sandbox_cpu_seconds"])
    if run.max_wall_seconds and run.started_at:
        if timezone.now() - run.started_at > timedelta(seconds=run.max_wall_seconds):
            return f"the wall-time budget of {run.max_wall_seconds} s is spent"
    if run.max_sandbox_cpu_seconds and run.sandbox_cpu_seconds >= run.max_sandbox_cpu_seconds:
        return f"the sandbox budget of {run.max_sandbox_cpu_seconds:g} CPU-seconds is spent"
    return None


# --- policy versions and rollback -----------------------------------------------------------


def publish(run: Run, version: int, learner) -> None:
    model = learner.accelerator.unwrap_model(learner.model)
    policy_publish(run.pk, version, model, learner.tokenizer)
    Run.objects.filter(pk=run.pk).update(
        policy_version=version, learner_step=version, heartbeat_at=timezone.now()
    )
    events.run_event(run.pk, "policy", {"version": version})


@transaction.atomic
def rollback_to(run: Run, step: int) -> None:
    """Resume at `step`: release what later steps learned, cancel what rolled-back versions sampled."""
    Trajectory.objects.filter(run=run, learned_in_step__gte=step).update(learned_in_step=None, advantage=None)
    stale_batches = RolloutBatch.objects.filter(run=run, policy_version__gt=step)
    # The batches first: a rollout worker still playing one stores its episodes, then looks at its
    # batch (workers/run_rollout.py `_store`), so whichever of the two comes second cancels them.
    stale_batches.update(status=RolloutBatch.Status.CANCELLED)
    Trajectory.objects.filter(run=run, batch__in=stale_batches).update(outcome=Trajectory.Outcome.CANCELLED)
    episode_services.episodes_cancel(batches=stale_batches)
    # What the rolled-back steps measured describes weights that no longer exist.
    MetricPoint.objects.filter(run=run, step__gt=step).delete()
    Checkpoint.objects.filter(run=run, step__gt=step).delete()
    policies_discard_after(run.pk, step)


# --- dispatch and waiting ------------------------------------------------------------------


def chunks_per_step(items_per_step: int) -> int:
    """How many rollout batches a step's items make: one per rollout process, or batches of at
    most FLYWHEEL_ROLLOUT_BATCH_ITEMS items. Smaller batches keep every worker busy: one that
    finishes early takes the next batch (the next step's, ahead of the learner) instead of
    idling while a slow batch ends the step."""
    if settings.FLYWHEEL_ROLLOUT_BATCH_ITEMS > 0:
        return max(1, -(-items_per_step // settings.FLYWHEEL_ROLLOUT_BATCH_ITEMS))
    return max(1, min(settings.FLYWHEEL_ROLLOUT_CONCURRENCY, items_per_step))


def batch_parts(items: list[dict]) -> list[list[int]]:
    """A step's items as rollout batches for parallel workers. Agent items get batches of their
    own, so short episodes never wait behind long ones: their batches finish and count at once.

    >>> batch_parts([{"pk": n, "kind": "agent" if n > 3 else "answer"} for n in range(6)])
    [[0, 2], [1, 3], [4], [5]]
    """
    parts = []
    for agents in (False, True):
        ids = [item["pk"] for item in items if (item["kind"] == "agent") == agents]
        count = chunks_per_step(len(ids)) if ids else 0
        parts += [ids[part::count] for part in range(count)]
    return parts


def dispatch(run: Run, step: int, config: GRPOConfig, items: list[dict]) -> None:
    """Make sure steps step .. step+k have live batches, sampled by the newest version (= step)."""
    created = []
    for future in range(step, min(step + config.max_staleness, run.max_steps - 1) + 1):
        if (
            RolloutBatch.objects.filter(run=run, step=future)
            .exclude(status=RolloutBatch.Status.CANCELLED)
            .exists()
        ):
            continue
        base = RolloutBatch.objects.filter(run=run).count()
        deadline = timezone.now() + timedelta(seconds=float(run.resolved["episode_deadline_seconds"]))
        for part, item_ids in enumerate(batch_parts(step_items(items, config, future))):
            created.append(
                RolloutBatch.objects.create(
                    run=run,
                    index=base + part,
                    step=future,
                    policy_version=step,
                    item_ids=item_ids,
                    deadline_at=deadline,
                ).pk
            )
    if external(run):
        return  # agents take the new batches' episodes from the run's episodes endpoint
    for batch_id in created:
        _enqueue_rollout(batch_id)


def _enqueue_rollout(batch_id: int) -> None:
    _send(tasks.rollout_batch, batch_id)


def _send(task, *args) -> None:
    """Enqueue, surviving a broker that is down for a moment: the learner sends pending work
    again until it is claimed, and evaluations can be asked for again, so nothing is lost."""
    try:
        task.apply_async(args=args, retry=True, retry_policy={"max_retries": 3, "interval_start": 0.5})
    except Exception:  # noqa: BLE001 - any broker error: logged, and covered by the resend
        logger.warning("could not enqueue %s%s; will send again", task.name, args, exc_info=True)


def wait_for_step(run: Run, step: int, config: GRPOConfig) -> tuple[list[Episode], list[Trajectory]]:
    """Block until step's batches are done, or its deadline passed with some complete groups and
    only live stragglers left. A batch whose worker died is not a straggler: it is claimed again
    (with a fresh deadline) and waited for, so a killed worker costs time, never episodes."""
    checked_at = time.monotonic()
    while True:
        status_check(run)
        batches = RolloutBatch.objects.filter(run=run, step=step).exclude(
            status=RolloutBatch.Status.CANCELLED
        )
        statuses = list(batches.values_list("status", flat=True))
        rows = _learnable_rows(run, step, config)
        groups = _complete_groups(rows, config.group_size)
        ended = (RolloutBatch.Status.DONE, RolloutBatch.Status.FAILED)
        all_done = statuses and all(status in ended for status in statuses)
        deadline = batches.aggregate(latest=Max("deadline_at"))["latest"]
        past_deadline = groups and deadline and timezone.now() > deadline
        # An external agent's episode has no lease to watch: its step waits for every slot (a
        # timed-out episode's slot is played again), never closing on a made-up reward.
        stragglers_only = not external(run) and past_deadline and _only_live_stragglers(batches)
        if all_done or stragglers_only:
            chosen = [row for group in groups for row in group]
            if not all_done:
                late = len(statuses) - sum(status in ended for status in statuses)
                run_event(
                    run,
                    "straggler",
                    f"step {step} closed at its deadline on {len(groups)} complete groups; "
                    f"{late} late batches are recorded when they finish, not learned from",
                    level="warning",
                )
            return _episodes(chosen), chosen
        if time.monotonic() - checked_at > _check_every():
            if external(run):  # an agent that went quiet: its slot goes to the next one who asks
                episode_services.episodes_expire(run=run)
            else:
                _resend_stuck(batches)
            checked_at = time.monotonic()
        time.sleep(POLL_SECONDS)


def _check_every() -> float:
    """How often to look for lost work: often enough to catch a lapsed lease within half a lease."""
    return min(settings.FLYWHEEL_ROLLOUT_RESEND_SECONDS, settings.FLYWHEEL_ROLLOUT_LEASE_SECONDS / 2)


def _only_live_stragglers(batches) -> bool:
    """Every unfinished batch is held by a worker that still renews its lease."""
    unfinished = batches.exclude(status__in=(RolloutBatch.Status.DONE, RolloutBatch.Status.FAILED))
    return not unfinished.filter(Q(status=RolloutBatch.Status.PENDING) | lease_lapsed()).exists()


def _resend_stuck(batches) -> None:
    """Messages can be lost (a broker restart without persistence) and workers can die: send
    again what is still pending or whose worker stopped renewing its lease; the claim makes
    duplicates harmless. A batch whose worker died on every attempt is ended, its episodes errored."""
    rollout_batches_expire(batches)
    stuck = batches.filter(Q(status=RolloutBatch.Status.PENDING) | lease_lapsed())
    for batch_id in stuck.values_list("pk", flat=True):
        _enqueue_rollout(batch_id)


def _learnable_rows(run: Run, step: int, config: GRPOConfig) -> list[Trajectory]:
    return list(
        Trajectory.objects.filter(
            run=run,
            batch__step=step,
            learned_in_step__isnull=True,
            outcome__in=(Trajectory.Outcome.SCORED, Trajectory.Outcome.ERRORED),
            policy_version__gte=step - config.max_staleness,
        ).order_by("batch_id", "item_id", "sample_index")
    )


def _complete_groups(rows: list[Trajectory], group_size: int) -> list[list[Trajectory]]:
    groups: dict[tuple[int | None, int], list[Trajectory]] = defaultdict(list)
    for row in rows:
        groups[(row.batch_id, row.item_id)].append(row)
    return [group for group in groups.values() if len(group) == group_size]


def _episodes(rows: list[Trajectory]) -> list[Episode]:
    """The episodes as the learner needs them: every generated sequence with its behaviour
    log-probs (a multi-step episode has one per turn), the steps read in one query."""
    turns: dict[int, list[Completion]] = defaultdict(list)
    steps = TrajectoryStep.objects.filter(trajectory__in=[row.pk for row in rows])
    for step in steps.order_by("trajectory", "index"):
        turns[step.trajectory_id].append(_completion(step.data()))
    nothing = [Completion(text="", token_ids=[], logprobs=[], finish_reason="error")]  # failed batch
    return [
        Episode(
            item_index=row.item_id,
            completion=(turns[row.pk] or nothing)[-1],
            reward=row.reward,
            outcome=row.outcome,
            policy_version=row.policy_version,
            passed=row.reward is not None and row.reward >= 1.0,
            turns=turns[row.pk] if len(turns[row.pk]) > 1 else [],
        )
        for row in rows
    ]


def _completion(data: dict) -> Completion:
    return Completion(
        text=data.get("completion", data.get("action", "")),
        token_ids=data.get("token_ids", []),
        logprobs=data.get("logprobs", []),
        finish_reason=data.get("finish_reason", ""),
        prompt_token_ids=data.get("prompt_token_ids", []),
    )


def mark_learned(rows: list[Trajectory], keep: list[int], advantages, step: int) -> None:
    """Claim the learned trajectories for this step, in one statement; a trajectory is only ever
    claimed once."""
    if not keep:
        return
    advantage = Case(
        *(When(pk=rows[index].pk, then=Value(float(advantages[index]))) for index in keep),
        output_field=FloatField(),
    )
    Trajectory.objects.filter(pk__in=[rows[index].pk for index in keep], learned_in_step__isnull=True).update(
        learned_in_step=step, advantage=advantage
    )


# --- metrics, checkpoints, evaluation ------------------------------------------------------


def record_metrics(
    run: Run, step: int, rows: list[Trajectory], learner_metrics: dict, dropped: dict, **times
) -> list[RunEvent]:
    """The step's metrics, then the monitors' new alerts (which the loop acts on)."""
    scored = [row for row in rows if row.outcome == Trajectory.Outcome.SCORED]
    rewards = [row.reward for row in scored if row.reward is not None]
    values: dict[str, float] = {f"learner/{name}": value for name, value in learner_metrics.items()}
    if rewards:
        values |= {
            "reward/mean": fmean(rewards),
            "reward/std": pstdev(rewards),
            "reward/min": min(rewards),
            "reward/max": max(rewards),
            "train/pass_rate": sum(reward >= 1.0 for reward in rewards) / len(rewards),
        }
    for name in {key for row in scored for key in row.components}:
        parts = [row.components[name] for row in scored if row.components.get(name) is not None]
        if parts:
            values[f"reward/{name}"] = fmean(parts)
    if rows:
        values["episodes/flagged_rate"] = sum(
            any(not f.get("note") for f in row.flags) for row in rows
        ) / len(rows)
        values["episodes/errored_rate"] = sum(
            row.outcome == Trajectory.Outcome.ERRORED for row in rows
        ) / len(rows)
        values["episodes/response_tokens"] = fmean(row.completion_tokens for row in rows)
        values["episodes/staleness"] = fmean(step - 1 - row.policy_version for row in rows)
    values |= {f"dropped/{name}": count for name, count in dropped.items()}
    values |= {f"time/{name}": seconds for name, seconds in times.items()}
    values["episodes/learned"] = learner_metrics.get("learned", 0)
    # Whether the step could teach anything: the share of its episodes in groups whose rewards
    # were all equal (GRPO's advantage is 0 there), the nothing_to_learn monitor's evidence.
    equal = dropped.get("zero_variance", 0)
    if equal + values["episodes/learned"]:
        values["episodes/zero_variance_share"] = equal / (equal + values["episodes/learned"])
    batches = RolloutBatch.objects.filter(run=run, step=step - 1, status=RolloutBatch.Status.DONE)
    values["time/generate"] = sum(batches.values_list("generate_seconds", flat=True))
    values["time/score"] = sum(batches.values_list("score_seconds", flat=True))
    tokens = sum(row.completion_tokens for row in rows)
    if values["time/generate"]:
        values["throughput/tokens_per_s"] = tokens / values["time/generate"]
    metrics_write(run, step, values)
    return monitors.run_monitor(run_id=run.pk, step=step)


def sampled_entropy(episodes: list[Episode]) -> float:
    """Mean negative log-probability of the sampled tokens: a Monte Carlo estimate of the policy's
    per-token entropy under its own sampling, free because the rollouts recorded the log-probs."""
    logprobs = [
        value for episode in episodes for completion in episode.completions for value in completion.logprobs
    ]
    return -fmean(logprobs) if logprobs else 0.0


def checkpoint(run: Run, learner, config: GRPOConfig, step: int) -> None:
    if Checkpoint.objects.filter(run=run, step=step).exists():
        return
    group_checkpoint(learner)  # the other ranks save their part with it
    path = checkpoint_save(learner, config)
    size = sum(file.stat().st_size for file in Path(path).rglob("*") if file.is_file())
    stored = checkpoint_upload(run.pk, step, path)
    usage_record(
        run_id=run.pk,
        step=step,
        component="checkpoint",
        kind="storage",
        worker=worker_name(),
        storage_bytes=size,
    )
    Checkpoint.objects.create(run=run, step=step, policy_version=step, path=stored)
    run_event(run, "checkpoint", f"checkpoint at step {step}", data={"step": step})


def resume(run: Run, learner, config) -> int:
    """Resume from the run's last recorded checkpoint, fetched through the artifact storage (the
    learner may have moved hosts); local checkpoints the record does not know are set aside."""
    latest = Checkpoint.objects.filter(run=run).order_by("-step").first()
    if latest is not None and Path(latest.path).is_absolute():  # recorded before the storage
        return checkpoint_resume(learner, config)
    if learner.accelerator.is_local_main_process:  # one fetch per host for all its ranks
        for local in checkpoint_dirs(config.output_dir):
            if latest is None or not checkpoint_is_local(latest.path, local):
                shutil.rmtree(local, ignore_errors=True)
        if latest is not None and not checkpoint_dirs(config.output_dir):
            checkpoint_fetch(latest.path, Path(config.output_dir) / f"{CHECKPOINT_PREFIX}{latest.step}")
    learner.accelerator.wait_for_everyone()
    return checkpoint_resume(learner, config)


def evaluate_later(run_id: int, version: int) -> None:
    _send(tasks.eval_policy, run_id, version)
    if (suite := suites.suite_evaluation_schedule(run_id=run_id, version=version)) is not None:
        _send(suite_tasks.suite_evaluate, suite.pk)  # the run's suite, on the eval queue: never waited for


def restart_allowed(run: Run) -> bool:
    return run.restarts < settings.FLYWHEEL_LEARNER_MAX_RESTARTS


def held_out_items(run: Run) -> list[dict]:
    limit = int(run.resolved.get("eval_items") or 0)
    ids = (
        run.task_set_version.items.filter(split=run.eval_split)
        .order_by("position")
        .values_list("pk", flat=True)
    )
    return item_dicts(list(ids[:limit] if limit else ids))


def item_count(run: Run) -> int:
    return TaskItem.objects.filter(version=run.task_set_version, split=run.train_split).count()

"""Writes for runs: create (validated up front), clone and fork, and every status change.

A status change is a conditional UPDATE from the statuses that allow it, so two requests (or a
request and a worker) can never both win; the loser gets a StateError (409) and nothing changes.
Every change is recorded as a RunEvent, and announced after the transaction commits.
"""

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from core import events
from core.exceptions import StateError
from inference.model_sources import is_directory
from inference.settings import engine_refusal, looks_like_path, tier_problems, tier_snapshot
from projects.models import Project, TaskSetVersion
from rewards import engine as reward_engine
from rewards.models import RewardRuleVersion
from rewards.services import reward_rule_version_mark_used
from runs import listeners, tasks
from runs import monitor_settings as run_monitors
from runs.learners import algorithm_get, hyperparameters_resolve, method_problem
from runs.models import Checkpoint, Run, RunEvent
from tiers.models import Tier

S = Run.Status
CONFIG_FIELDS = (
    "task_set_version",
    "train_split",
    "eval_split",
    "reward_rule_version",
    "tier_config",
    "method",
    "resolved",
    "max_steps",
    "max_wall_seconds",
    "max_sandbox_cpu_seconds",
    "budget_money",
    "budget_device_hours",
    "priority",
)


@dataclass(frozen=True)
class RunRequest:
    """What a launch asks for; the form and REST both build one."""

    project: Project
    name: str
    task_set_version: TaskSetVersion
    reward_rule_version: RewardRuleVersion
    tier: Tier
    method: str = Run.Method.GRPO
    hyperparameters: dict[str, Any] | None = None
    max_steps: int = 20
    max_wall_seconds: int | None = None
    max_sandbox_cpu_seconds: float | None = None
    budget_money: Decimal | None = None
    budget_device_hours: float | None = None
    priority: int = 0
    train_split: str = "train"
    eval_split: str = "heldout"
    monitors: dict[str, float] | None = None
    monitor_actions: dict[str, str] | None = None
    calibration: bool = False  # launched by an estimate (costs/services.py: run_calibrate)


# Checks that apps above runs add for what a run names of theirs (evaluations: the suite version
# of `eval_suite_version`), each (request, resolved hyperparameters) -> problems by field. They
# register in their AppConfig.ready, so runs imports none of them.
REQUEST_CHECKS: list[Callable[[RunRequest, dict[str, Any]], dict[str, str]]] = []


def run_problems(request: RunRequest) -> tuple[dict[str, Any], dict[str, str]]:
    """(resolved hyperparameters, every reason the run would fail at its first step)."""
    problems: dict[str, str] = {}
    if (refusal := method_problem(request.method)) is not None:
        return {}, {"method": refusal}
    algorithm = algorithm_get(request.method)
    assert algorithm is not None  # method_problem refuses a name with no algorithm
    resolved, hyper_problems = hyperparameters_resolve(request.method, request.hyperparameters or {})
    problems |= {f"hyperparameters.{name}": message for name, message in hyper_problems.items()}
    # Every independent problem is reported at once; only checks that rest on what failed wait.
    ownership = _ownership_problems(request)
    problems |= ownership
    # A method whose data comes from elsewhere (a Tinker client's loop) is not held to the task set
    # and the reward rule it is filed under.
    data = algorithm.data
    if not ownership:
        if not hyper_problems and data:
            problems |= _data_problems(request, resolved)
            for check in REQUEST_CHECKS:
                problems |= check(request, resolved)
        problems |= _tier_problems(request.tier, request.method)
        lora = (resolved or request.hyperparameters or {}).get("adapter") == "lora"
        if refusal := engine_refusal(request.tier, lora=lora):
            problems["tier"] = f"tier {request.tier.name} {refusal}"
        if data:
            problems |= _reward_problems(request)
    if request.max_steps < 1:
        problems["max_steps"] = "must be at least 1"
    if request.max_wall_seconds is not None and request.max_wall_seconds < 1:
        problems["max_wall_seconds"] = "must be at least 1 second"
    if request.max_sandbox_cpu_seconds is not None and request.max_sandbox_cpu_seconds <= 0:
        problems["max_sandbox_cpu_seconds"] = "must be more than 0"
    if request.budget_money is not None and request.budget_money <= 0:
        problems["budget_money"] = "must be more than 0"
    if request.budget_device_hours is not None and request.budget_device_hours <= 0:
        problems["budget_device_hours"] = "must be more than 0 device-hours"
    if not request.name.strip():
        problems["name"] = "is required"
    problems |= _monitor_problems(request)
    return resolved, problems


def _monitor_problems(request: RunRequest) -> dict[str, str]:
    problems: dict[str, str] = {}
    for name, value in (
        ("monitors", lambda: run_monitors.thresholds_clean(request.monitors or {})),
        ("monitor_actions", lambda: run_monitors.actions_clean(request.monitor_actions or {})),
    ):
        try:
            value()
        except ValidationError as exc:
            problems |= {
                f"{name}.{key.removeprefix('actions.')}": " ".join(m) for key, m in exc.message_dict.items()
            }
    return problems


def _ownership_problems(request: RunRequest) -> dict[str, str]:
    project_id = request.project.pk
    problems = {}
    if request.task_set_version.task_set.project_id != project_id:
        problems["task_set_version"] = "belongs to another project"
    if request.reward_rule_version.rule.project_id != project_id:
        problems["reward_rule_version"] = "belongs to another project"
    if request.tier.project_id != project_id:
        problems["tier"] = "belongs to another project"
    return problems


def _data_problems(request: RunRequest, resolved: dict[str, Any]) -> dict[str, str]:
    counts = request.task_set_version.split_counts
    problems = {}
    for field_name, split in (("train_split", request.train_split), ("eval_split", request.eval_split)):
        if split not in ("train", "heldout"):
            problems[field_name] = "must be train or heldout"
        elif not counts.get(split):
            version = request.task_set_version
            problems[field_name] = f"{version} has no {split} items; re-split it or choose another split"
    items = request.task_set_version.items.filter(split=request.train_split)
    algorithm = algorithm_get(request.method)
    if algorithm is not None and algorithm.data_check is not None:
        problems |= algorithm.data_check(items, resolved)
    return problems


def pair_field_problem(value: Any) -> str | None:
    """Why a DPO pair's `chosen` or `rejected` is not a completion the learner can read, or None.

    A completion is a non-blank string, or a conversation (TRL's format: a list of messages with
    string `role` and `content`) holding an assistant message with text.

    >>> pair_field_problem("x = 1") is None
    True
    >>> pair_field_problem({"run": 3})
    'must be a text (a string or a list of messages), not an object'
    >>> pair_field_problem([{"role": "user", "content": "hi"}])
    'holds no assistant message with text'
    """
    if isinstance(value, str):
        return None if value.strip() else "is empty"
    if not isinstance(value, list):
        return f"must be a text (a string or a list of messages), not {_json_type(value)}"
    for index, message in enumerate(value):
        if not isinstance(message, dict) or not all(
            isinstance(message.get(key), str) for key in ("role", "content")
        ):
            return f"message {index} must be an object with a string role and content"
    if not any(m["role"] == "assistant" and m["content"].strip() for m in value):
        return "holds no assistant message with text"
    return None


def _json_type(value: Any) -> str:
    names = {dict: "an object", bool: "a boolean", int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    return "".join(m["content"] for m in value if m["role"] == "assistant")


def pair_problems(items) -> dict[str, str]:
    """DPO trains on items whose metadata holds `chosen` and `rejected` completions; anything the
    learner could not read, or a pair that teaches nothing (the same text twice), is refused here
    rather than at its first step."""
    pairs = items.filter(data__metadata__has_key="chosen").filter(data__metadata__has_key="rejected")
    bad: list[str] = []
    found = 0
    for external_id, kind, data in pairs.values_list("external_id", "kind", "data"):
        found += 1
        metadata = data["metadata"]
        if kind == "agent":
            bad.append(f"{external_id}: an agent item has no single prompt to pair completions for")
            continue
        fields = {name: pair_field_problem(metadata[name]) for name in ("chosen", "rejected")}
        wrong = [f"metadata.{name} {problem}" for name, problem in fields.items() if problem]
        if not wrong and _text_of(metadata["chosen"]) == _text_of(metadata["rejected"]):
            wrong = ["metadata.chosen and metadata.rejected are the same text"]
        if wrong:
            bad.append(f"{external_id}: {'; '.join(wrong)}")
    if not found:
        return {"method": "DPO needs preference pairs: items whose metadata holds chosen and rejected"}
    if bad:
        return {
            "task_set_version": f"{len(bad)} of {found} preference pairs cannot be trained on: "
            + " | ".join(bad[:5])
            + (f" | and {len(bad) - 5} more" if len(bad) > 5 else "")
        }
    return {}


def _tier_problems(tier: Tier, method: str) -> dict[str, str]:
    problems = {f"tier.{name}": message for name, message in tier_problems(tier_snapshot(tier)).items()}
    algorithm = algorithm_get(method)
    if algorithm is not None and algorithm.online and tier.temperature == 0:
        problems["tier.temperature"] = (
            f"{algorithm.label} compares sampled completions; a greedy tier (temperature 0) samples one"
        )
    if looks_like_path(tier.base_model) and not is_directory(tier.base_model):
        # The folder went away after the tier was saved: say so, and how to fix the tier.
        problems["tier.base_model"] = (
            f"tier {tier.name}: no folder {tier.base_model} on this machine (moved or deleted since the tier "
            "was saved); edit the tier's base_model to a saved model's folder or a hub id"
        )
    return problems


def _reward_problems(request: RunRequest) -> dict[str, str]:
    kinds = request.task_set_version.items.values_list("kind", flat=True).distinct()
    problems = {}
    for kind in sorted(set(kinds)):
        for problem in reward_engine.validate_rule(request.reward_rule_version.spec, item_kind=kind):
            problems[f"reward_rule_version.{problem.path}"] = f"for {kind} items: {problem.message}"
    return problems


@transaction.atomic
def run_create(
    *,
    request: RunRequest,
    by: User,
    parent: Run | None = None,
    checkpoint: Checkpoint | None = None,
) -> Run:
    resolved, problems = run_problems(request)
    if problems:
        raise ValidationError(problems)
    run = Run.objects.create(
        project=request.project,
        name=request.name.strip(),
        task_set_version=request.task_set_version,
        train_split=request.train_split,
        eval_split=request.eval_split,
        reward_rule_version=request.reward_rule_version,
        tier=request.tier,
        tier_config=tier_snapshot(request.tier),
        method=request.method,
        hyperparameters=request.hyperparameters or {},
        resolved=resolved,
        max_steps=request.max_steps,
        max_wall_seconds=request.max_wall_seconds,
        max_sandbox_cpu_seconds=request.max_sandbox_cpu_seconds,
        budget_money=request.budget_money,
        budget_device_hours=request.budget_device_hours,
        priority=request.priority,
        calibration=request.calibration,
        parent=parent,
        parent_checkpoint=checkpoint,
        created_by=by,
        monitors=run_monitors.thresholds_clean(request.monitors or {}),
        monitor_actions=run_monitors.actions_clean(request.monitor_actions or {}),
    )
    reward_rule_version_mark_used(version=request.reward_rule_version)
    origin = f" from checkpoint {checkpoint.step} of run {parent.pk}" if checkpoint and parent else ""
    event = run_event(run, "status", f"queued{origin}", data={"status": S.QUEUED})
    listeners.status_changed(run=run, event=event, status=S.QUEUED)
    _schedule_after_commit()
    return run


def run_request_from(run: Run, **overrides: Any) -> RunRequest:
    """The request that made `run`, with some fields changed: for clone and fork."""
    if run.tier is None and overrides.get("tier") is None:
        raise ValidationError({"tier": "the parent's tier was deleted; choose a tier"})
    algorithm = algorithm_get(overrides.get("method", run.method))
    if algorithm is not None and not algorithm.launchable:
        raise ValidationError(
            {"method": f"a run of {algorithm.label} starts from its own API, not as a copy or a fork"}
        )
    fields: dict[str, Any] = {  # RunRequest's keywords, some replaced by the caller's overrides
        "project": run.project,
        "name": overrides.pop("name", None) or f"{run.name} (copy)",
        "task_set_version": run.task_set_version,
        "reward_rule_version": run.reward_rule_version,
        "tier": run.tier,
        "method": run.method,
        "hyperparameters": dict(run.hyperparameters),
        "max_steps": run.max_steps,
        "max_wall_seconds": run.max_wall_seconds,
        "max_sandbox_cpu_seconds": run.max_sandbox_cpu_seconds,
        "budget_money": run.budget_money,
        "budget_device_hours": run.budget_device_hours,
        "priority": run.priority,
        "train_split": run.train_split,
        "eval_split": run.eval_split,
        "monitors": dict(run.monitors or {}),
        "monitor_actions": dict(run.monitor_actions or {}),
    }
    return RunRequest(**(fields | overrides))


def run_clone(*, run: Run, by: User, **overrides: Any) -> Run:
    return run_create(request=run_request_from(run, **overrides), by=by, parent=run)


def run_fork(*, checkpoint: Checkpoint, by: User, **overrides: Any) -> Run:
    """A new run that starts from the weights of `checkpoint` instead of the base model."""
    parent = checkpoint.run
    overrides.setdefault("name", f"{parent.name} (fork @ {checkpoint.step})")
    return run_create(
        request=run_request_from(parent, **overrides), by=by, parent=parent, checkpoint=checkpoint
    )


def config_diff(parent: Run, child: Run) -> list[dict[str, Any]]:
    """The configuration fields that differ, flattened one level for readability."""
    before, after = run_config(parent), run_config(child)
    keys = sorted(set(before) | set(after))
    return [
        {"field": k, "parent": before.get(k), "run": after.get(k)}
        for k in keys
        if before.get(k) != after.get(k)
    ]


def run_config(run: Run) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for name in CONFIG_FIELDS:
        value = getattr(run, name)
        if isinstance(value, dict):
            config |= {f"{name}.{key}": inner for key, inner in value.items()}
        else:
            config[name] = str(value) if hasattr(value, "pk") else value
    return config


# --- status changes ------------------------------------------------------------------------


def run_event(
    run: Run, kind: str, message: str, *, level: str = "info", data: dict | None = None
) -> RunEvent:
    event = RunEvent.objects.create(run=run, kind=kind, message=message, level=level, data=data or {})
    payload = {
        "run": run.pk,
        "kind": kind,
        "level": level,
        "message": message,
        "id": event.pk,
        "data": event.data,
        "created_at": event.created_at.isoformat(),
    }
    events.project_event(run.project_id, "run.event", payload)
    events.run_event(run.pk, "event", payload)
    return event


@transaction.atomic
def run_transition(
    run: Run,
    *,
    allowed: tuple[str, ...],
    to: str,
    message: str = "",
    level: str = "info",
    error: dict | None = None,
    **fields: Any,
) -> Run:
    """Move `run` to `to` if its status is one of `allowed`; otherwise StateError and no change."""
    updates: dict[str, Any] = {"status": to, "updated_at": timezone.now(), **fields}
    if to in Run.TERMINAL:
        updates["finished_at"] = timezone.now()
    if error is not None:
        updates["error"] = error
    changed = Run.objects.filter(pk=run.pk, status__in=allowed).update(**updates)
    if not changed:
        current = Run.objects.filter(pk=run.pk).values_list("status", flat=True).first()
        raise StateError(f"run {run.pk} is {current}; this needs it to be {' or '.join(allowed)}")
    run.refresh_from_db()
    event = run_event(
        run, "status", message or to, level=level, data={"status": to, **({"error": error} if error else {})}
    )
    listeners.status_changed(run=run, event=event, status=to)
    events.run_event(run.pk, "status", {"status": to})
    if to in Run.TERMINAL or to == S.PAUSED:
        # Its place in the project's quota is free: the next queued run starts now, not at the
        # next periodic tick (a deployment without beat would otherwise never start it).
        _schedule_after_commit()
    return run


def run_pause(*, run: Run) -> Run:
    if run.status in (S.QUEUED, S.STARTING):
        return run_transition(
            run, allowed=(S.QUEUED, S.STARTING), to=S.PAUSED, message="paused before it started"
        )
    return run_transition(run, allowed=(S.RUNNING,), to=S.PAUSING, message="pausing at the next step")


def run_resume(*, run: Run) -> Run:
    run = run_transition(run, allowed=(S.PAUSED,), to=S.QUEUED, message="resumed; queued")
    _schedule_after_commit()
    return run


def run_cancel(*, run: Run) -> Run:
    if run.status in (S.QUEUED, S.PAUSED):
        return run_transition(run, allowed=(S.QUEUED, S.PAUSED), to=S.CANCELLED, message="cancelled")
    return run_transition(
        run, allowed=(S.STARTING, S.RUNNING, S.PAUSING), to=S.CANCELLING, message="cancelling"
    )


def run_retry(*, run: Run) -> Run:
    """Start a failed or cancelled run again from its last checkpoint."""
    run = run_transition(
        run, allowed=(S.FAILED, S.CANCELLED), to=S.QUEUED, message="retried; queued", error=None, restarts=0
    )
    Run.objects.filter(pk=run.pk).update(error=None, finished_at=None)
    run.refresh_from_db()
    _schedule_after_commit()
    return run


def run_fail(*, run: Run, message: str, where: str) -> Run:
    active = (S.QUEUED, S.STARTING, S.RUNNING, S.PAUSING, S.CANCELLING)
    return run_transition(
        run,
        allowed=active,
        to=S.FAILED,
        level="error",
        message=f"failed: {message}",
        error={"message": message, "where": where},
    )


def queue_position(run: Run) -> int | None:
    """1 for the next queued run of its project to start; None when it is not queued."""
    if run.status != S.QUEUED:
        return None
    ahead = Run.objects.filter(project_id=run.project_id, status=S.QUEUED).filter(
        Q(priority__gt=run.priority)
        | Q(priority=run.priority, created_at__lt=run.created_at)
        | Q(priority=run.priority, created_at=run.created_at, pk__lt=run.pk)
    )
    return ahead.count() + 1


def _schedule_after_commit() -> None:
    transaction.on_commit(lambda: tasks.runs_schedule.delay())

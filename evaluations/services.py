"""Writes of evaluation suites: create a suite, add a version (versions never change), evaluate a
version against a target (queued, then run on the eval queue by the task beside this module), the
schedule's request from a run's learner, and the worker's claim and record.

Every check runs before anything is written, and each refusal names its field."""

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F, Max, Q
from django.utils import timezone

from evaluations import tasks
from evaluations.models import DEFAULT_SAMPLING, Suite, SuiteEntry, SuiteEvaluation, SuiteResult, SuiteVersion
from inference.settings import tier_snapshot
from projects.models import Project, TaskItem, TaskSetVersion
from rewards.models import RewardRuleVersion
from runs.models import Checkpoint, Run
from runs.run_store import policy_prefix
from tiers.models import Tier
from tiers.services import checkpoint_resolve

S = SuiteEvaluation.Status
MAX_ENTRIES = 20
MAX_SAMPLES = 100
SPLITS = ("train", "heldout")
STALE_CLAIM = timedelta(hours=2)  # a running evaluation whose worker died is claimed again
MAX_ATTEMPTS = 3


def _check_name(project: Project, name: str) -> str:
    name = (name or "").strip()
    if not name:
        raise ValidationError({"name": "is required"})
    if len(name) > 100:
        raise ValidationError({"name": "at most 100 characters"})
    if Suite.objects.filter(project=project, name=name).exists():
        raise ValidationError({"name": f"this project already has a suite named {name!r}"})
    return name


def sampling_clean(sampling: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, str]]:
    """(the sampling with its defaults filled in, problems by field). Greedy pass@1 by default.

    >>> sampling_clean({"samples": 4, "k": [1, 2], "temperature": 0.8})[1]
    {}
    >>> sampling_clean({"samples": 2, "k": [3]})[1]  # doctest: +NORMALIZE_WHITESPACE
    {'sampling.k': 'each k must be an integer from 1 to samples (2)',
     'sampling.temperature': 'more than one sample needs a temperature above 0: greedy samples are identical'}
    """
    if sampling is not None and not isinstance(sampling, dict):
        return dict(DEFAULT_SAMPLING), {
            "sampling": "must be an object: samples, k, temperature, pass_threshold"
        }
    submitted = sampling or {}
    problems = {
        f"sampling.{name}": "not a sampling setting (samples, k, temperature, pass_threshold)"
        for name in submitted
        if name not in DEFAULT_SAMPLING
    }
    clean = DEFAULT_SAMPLING | {name: value for name, value in submitted.items() if name in DEFAULT_SAMPLING}
    n = clean["samples"]
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_SAMPLES:
        problems["sampling.samples"] = f"must be an integer from 1 to {MAX_SAMPLES}"
        n = None
    ks = clean["k"] if isinstance(clean["k"], list) else [clean["k"]]
    bad_k = any(not isinstance(k, int) or isinstance(k, bool) or k < 1 or (n and k > n) for k in ks)
    if not ks or bad_k:
        problems["sampling.k"] = f"each k must be an integer from 1 to samples ({n if n else 'n'})"
    else:
        clean["k"] = sorted(set(ks))
    for name, low, high in (("temperature", 0.0, 5.0), ("pass_threshold", -1e9, 1e9)):
        value = clean[name]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
            problems[f"sampling.{name}"] = f"must be a number from {low:g} to {high:g}"
        else:
            clean[name] = float(value)
    if n and n > 1 and "sampling.temperature" not in problems and clean["temperature"] == 0:
        problems["sampling.temperature"] = (
            "more than one sample needs a temperature above 0: greedy samples are identical"
        )
    return clean, problems


def _entry_clean(project: Project, index: int, entry: Any) -> tuple[dict[str, Any], dict[str, str]]:
    where = f"entries[{index}]"
    if not isinstance(entry, dict):
        return {}, {where: "must be an object: task_set_version, split, reward_rule_version, limit"}
    problems = {
        f"{where}.{name}": "not an entry field (task_set_version, split, reward_rule_version, limit)"
        for name in entry
        if name not in ("task_set_version", "split", "reward_rule_version", "limit")
    }
    clean: dict[str, Any] = {"split": entry.get("split", "heldout"), "limit": entry.get("limit")}
    version = TaskSetVersion.objects.filter(
        pk=_int(entry.get("task_set_version")), task_set__project=project, published=True
    ).first()
    if version is None:
        problems[f"{where}.task_set_version"] = (
            f"no task-set version {entry.get('task_set_version')!r} in this project"
        )
    clean["task_set_version"] = version
    rule = RewardRuleVersion.objects.filter(
        pk=_int(entry.get("reward_rule_version")), rule__project=project
    ).first()
    if rule is None:
        problems[f"{where}.reward_rule_version"] = (
            f"no reward-rule version {entry.get('reward_rule_version')!r} in this project"
        )
    clean["reward_rule_version"] = rule
    limit = clean["limit"]
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        problems[f"{where}.limit"] = "must be a positive integer, or null for every item"
    if clean["split"] not in SPLITS:
        problems[f"{where}.split"] = "must be train or heldout"
    elif version is not None and not TaskItem.objects.filter(version=version, split=clean["split"]).exists():
        problems[f"{where}.split"] = f"the {clean['split']} split of {version} has no items"
    return clean, problems


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def entries_clean(project: Project, entries: Any) -> tuple[list[dict[str, Any]], dict[str, str]]:
    if not isinstance(entries, list) or not entries:
        return [], {
            "entries": "give at least one entry: {task_set_version, split, reward_rule_version, limit}"
        }
    if len(entries) > MAX_ENTRIES:
        return [], {"entries": f"at most {MAX_ENTRIES} entries in one suite version"}
    cleaned: list[dict] = []
    problems: dict[str, Any] = {}
    for index, entry in enumerate(entries):
        clean, entry_problems = _entry_clean(project, index, entry)
        cleaned.append(clean)
        problems |= entry_problems
    return cleaned, problems


@transaction.atomic
def suite_create(
    *,
    project: Project,
    name: str,
    by: User,
    description: str = "",
    entries: list[dict] | None = None,
    sampling: dict | None = None,
) -> Suite:
    """A new suite; with `entries`, its version 1 too (checked first: a bad entry creates nothing)."""
    name = _check_name(project, name)
    if entries is not None:
        _version_problems(project, entries, sampling)
    try:
        with transaction.atomic():
            suite = Suite.objects.create(project=project, name=name, description=description, created_by=by)
    except IntegrityError:  # created by a concurrent request between the check and the insert
        raise ValidationError({"name": f"this project already has a suite named {name!r}"}) from None
    if entries is not None:
        suite_version_create(suite=suite, entries=entries, sampling=sampling, by=by)
    return suite


def _version_problems(project: Project, entries: Any, sampling: Any) -> tuple[list[dict], dict]:
    cleaned, problems = entries_clean(project, entries)
    clean_sampling, sampling_problems = sampling_clean(sampling)
    if problems or sampling_problems:
        raise ValidationError(problems | sampling_problems)
    return cleaned, clean_sampling


@transaction.atomic
def suite_version_create(
    *, suite: Suite, entries: list[dict], by: User, sampling: dict | None = None, note: str = ""
) -> SuiteVersion:
    """The suite's next version: its entries and sampling as given, never changed afterwards."""
    cleaned, clean_sampling = _version_problems(suite.project, entries, sampling)
    locked = Suite.objects.select_for_update().get(pk=suite.pk)
    number = (locked.versions.aggregate(top=Max("number"))["top"] or 0) + 1
    version = SuiteVersion.objects.create(
        suite=locked, number=number, sampling=clean_sampling, note=note, created_by=by
    )
    SuiteEntry.objects.bulk_create(
        [SuiteEntry(version=version, position=index, **entry) for index, entry in enumerate(cleaned)]
    )
    return version


def _target(
    project: Project,
    *,
    run: Run | None,
    version: int | None,
    checkpoint: Checkpoint | None,
    tier: Tier | None,
) -> dict[str, Any]:
    """The evaluation's target fields: what to load and under which settings."""
    given = [name for name, value in (("run", run), ("checkpoint", checkpoint), ("tier", tier)) if value]
    if len(given) != 1:
        raise ValidationError({"target": "give exactly one of run (with version), checkpoint or tier"})
    if version is not None and run is None:
        raise ValidationError({"version": "a policy version needs a run"})
    if checkpoint is not None:
        run, version, kind = checkpoint.run, checkpoint.policy_version, SuiteEvaluation.Target.CHECKPOINT
    else:
        kind = SuiteEvaluation.Target.POLICY
    if run is not None:
        if run.project_id != project.pk:
            raise ValidationError({given[0]: "belongs to another project"})
        version = run.policy_version if version is None else version
        if not 0 <= version <= run.policy_version:
            raise ValidationError(
                {"version": f"the run has published policy versions 0 to {run.policy_version}"}
            )
        return {
            "target": kind,
            "run": run,
            "policy_version": version,
            "checkpoint": checkpoint,
            "model": policy_prefix(run.pk, version),
            "tier_config": run.tier_config,
        }
    assert tier is not None  # exactly one target was given, and it was neither a run nor a checkpoint
    if tier.project_id != project.pk:
        raise ValidationError({"tier": "belongs to another project"})
    path, _, _ = checkpoint_resolve(tier=tier)  # the tier's base model, checked loadable
    return {
        "target": SuiteEvaluation.Target.TIER,
        "tier": tier,
        "model": path,
        "tier_config": {"id": tier.pk} | tier_snapshot(tier),
    }


@transaction.atomic
def suite_evaluate(
    *,
    suite_version: SuiteVersion,
    by: User | None,
    run: Run | None = None,
    version: int | None = None,
    checkpoint: Checkpoint | None = None,
    tier: Tier | None = None,
) -> SuiteEvaluation:
    """Queue an evaluation of the suite version on a run's policy version (default: its newest), a
    checkpoint, or a tier as it is; it runs on the eval queue once this transaction commits."""
    project = suite_version.suite.project
    fields = _target(project, run=run, version=version, checkpoint=checkpoint, tier=tier)
    evaluation = SuiteEvaluation.objects.create(
        project=project, suite_version=suite_version, created_by=by, **fields
    )
    transaction.on_commit(lambda: tasks.suite_evaluate.delay(evaluation.pk))
    return evaluation


def suite_evaluation_schedule(*, run_id: int, version: int) -> SuiteEvaluation | None:
    """What a run's learner asks for with each held-out evaluation when the run names a suite
    version: that suite on the policy version, recorded once. Returns it while it is still queued
    (the caller sends it; the task's claim makes a second send harmless), else None. Never waits."""
    run = Run.objects.filter(pk=run_id).first()
    suite_version_id = int((run.resolved or {}).get("eval_suite_version") or 0) if run else 0
    if run is None or not suite_version_id:
        return None
    suite_version = SuiteVersion.objects.filter(pk=suite_version_id, suite__project_id=run.project_id).first()
    if suite_version is None:
        return None
    evaluation = SuiteEvaluation.objects.filter(
        suite_version=suite_version, run=run, policy_version=version, scheduled=True
    ).first()
    if evaluation is None:
        try:
            with transaction.atomic():
                evaluation = SuiteEvaluation.objects.create(
                    project_id=run.project_id,
                    suite_version=suite_version,
                    scheduled=True,
                    target=SuiteEvaluation.Target.POLICY,
                    run=run,
                    policy_version=version,
                    model=policy_prefix(run.pk, version),
                    tier_config=run.tier_config,
                )
        except IntegrityError:  # asked twice at once: the other request recorded it
            return None
    return evaluation if evaluation.status == S.QUEUED else None


def suite_evaluation_claim(*, evaluation_id: int) -> SuiteEvaluation | None:
    """Claim a queued evaluation (or one whose worker died while running it) for this worker; a
    redelivered message finds it claimed and gets None."""
    now = timezone.now()
    claimed = SuiteEvaluation.objects.filter(
        Q(status=S.QUEUED) | Q(status=S.RUNNING, started_at__lt=now - STALE_CLAIM, attempts__lt=MAX_ATTEMPTS),
        pk=evaluation_id,
    ).update(status=S.RUNNING, started_at=now, attempts=F("attempts") + 1)
    if not claimed:
        return None
    SuiteResult.objects.filter(evaluation_id=evaluation_id).delete()  # a dead worker's part, done again
    return SuiteEvaluation.objects.select_related("suite_version", "run", "tier").get(pk=evaluation_id)


@transaction.atomic
def suite_results_record(*, evaluation: SuiteEvaluation, results: list[SuiteResult]) -> None:
    """An entry's results per item, written as each entry finishes."""
    SuiteResult.objects.bulk_create(results)


def suite_evaluation_finish(*, evaluation: SuiteEvaluation, metrics: dict, error: str = "") -> None:
    SuiteEvaluation.objects.filter(pk=evaluation.pk, status=S.RUNNING).update(
        status=S.FAILED if error else S.SUCCEEDED, metrics=metrics, error=error, finished_at=timezone.now()
    )


def run_suite_problems(request: Any, resolved: dict[str, Any]) -> dict[str, str]:
    """A run's `eval_suite_version` must name a version of a suite of the run's project
    (registered with runs.lifecycle.REQUEST_CHECKS)."""
    suite_version = resolved.get("eval_suite_version") or 0
    if not suite_version:
        return {}
    if not SuiteVersion.objects.filter(pk=suite_version, suite__project_id=request.project.pk).exists():
        return {
            "hyperparameters.eval_suite_version": (
                f"no evaluation suite version {suite_version} in project {request.project.name}"
            )
        }
    return {}

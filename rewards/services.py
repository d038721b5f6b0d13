"""Writes for reward rules: create, edit (always a new version), mark used, delete; and the reads
that compute something from a rule: validation, diffs between versions, dry-runs.

A rule's spec is checked by the engine (`rewards.engine.validate_rule`) before anything is saved;
every problem names its place in the spec (`spec.graders.tests.calculate_output`).
"""

import difflib
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.exceptions import StateError
from inference.judge import tier_judge
from inference.settings import tier_snapshot
from projects.models import Project, TaskItem, TaskSetVersion
from projects.published_formats import recognise_line
from projects.task_format import validate_item
from rewards import engine, openai_format
from rewards.graders.reward_model import project_scorer
from rewards.models import RewardRule, RewardRuleVersion

DRY_RUN_MAX_PAIRS = 500
DIFF_CONTEXT_LINES = 3


# --- specs ---------------------------------------------------------------------------------


def spec_pretty_json(spec: Any) -> str:
    """The canonical pretty form: what the JSON view shows and what diffs compare."""
    return json.dumps(spec, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def spec_content_hash(spec: Any) -> str:
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Problem:
    path: str
    message: str


def spec_problems(spec: Any) -> list[Problem]:
    """Everything wrong with a spec, each at its dotted place; empty when the engine accepts it."""
    return [Problem(problem.path, problem.message) for problem in engine.validate_rule(spec)]


def spec_param(path: str, field_name: str = "spec") -> str:
    return f"{field_name}.{path}" if path else field_name


def _check_spec(spec: Any, field_name: str = "spec") -> None:
    problems = spec_problems(spec)
    if not problems:
        return
    errors: dict[str, list[str]] = {}
    for problem in problems:
        errors.setdefault(spec_param(problem.path, field_name), []).append(problem.message)
    raise ValidationError(errors)


def _check_name(project: Project, name: str, exclude_pk: int | None = None) -> str:
    name = name.strip()
    if not name:
        raise ValidationError({"name": "is required"})
    taken = RewardRule.objects.filter(project=project, name=name)
    if exclude_pk is not None:
        taken = taken.exclude(pk=exclude_pk)
    if taken.exists():
        raise ValidationError({"name": f"this project already has a reward rule named {name!r}"})
    return name


# --- rules and versions --------------------------------------------------------------------


def reward_rule_create(
    *,
    project: Project,
    name: str,
    spec: Any,
    by: User,
    description: str = "",
    note: str = "",
) -> RewardRule:
    """A rule and its version 1; an invalid spec or a taken name saves nothing."""
    name = _check_name(project, name)
    _check_spec(spec)
    try:
        with transaction.atomic():
            rule = RewardRule.objects.create(
                project=project, name=name, description=description, created_by=by
            )
            _version_create(rule=rule, number=1, spec=spec, by=by, note=note or "created")
    except IntegrityError:  # a concurrent create took the name between the check and the insert
        raise ValidationError({"name": f"this project already has a reward rule named {name!r}"}) from None
    return rule


def _version_create(*, rule: RewardRule, number: int, spec: dict, by: User, note: str) -> RewardRuleVersion:
    return RewardRuleVersion.objects.create(
        rule=rule,
        number=number,
        spec=spec,
        content_hash=spec_content_hash(spec),
        note=note[:500],
        created_by=by,
    )


@dataclass
class RuleUpdate:
    rule: RewardRule
    version: RewardRuleVersion  # the latest version after the update
    version_created: bool


def reward_rule_update(
    *,
    rule: RewardRule,
    by: User,
    name: str | None = None,
    description: str | None = None,
    spec: Any = None,
    note: str = "",
) -> RuleUpdate:
    """Rename or describe the rule; a new spec ALWAYS becomes a new version (existing versions,
    used or not, are never modified) unless it equals the latest version's, which changes nothing."""
    if name is not None:
        name = _check_name(rule.project, name, exclude_pk=rule.pk)
    if spec is not None:
        _check_spec(spec)
    with transaction.atomic():
        locked = RewardRule.objects.select_for_update().get(pk=rule.pk)
        locked.name = locked.name if name is None else name
        locked.description = locked.description if description is None else description
        locked.save(update_fields=["name", "description"])
        latest = locked.versions.latest("number")  # version 1 is created with the rule
        if spec is None or latest.content_hash == spec_content_hash(spec):
            return RuleUpdate(locked, latest, False)
        version = _version_create(rule=locked, number=latest.number + 1, spec=spec, by=by, note=note)
    return RuleUpdate(locked, version, True)


def reward_rule_version_mark_used(*, version: RewardRuleVersion) -> RewardRuleVersion:
    """Record the first use by a run; from then on the version is part of a run's record.
    A conditional UPDATE, so marking twice (or from two runs at once) keeps the first time."""
    RewardRuleVersion.objects.filter(pk=version.pk, used_at__isnull=True).update(used_at=timezone.now())
    version.refresh_from_db(fields=["used_at"])
    return version


@transaction.atomic
def reward_rule_delete(*, rule: RewardRule) -> None:
    locked = RewardRule.objects.select_for_update().get(pk=rule.pk)
    used = locked.versions.filter(used_at__isnull=False).order_by("number").first()
    if used is not None:
        raise StateError(
            f"version {used.number} of {locked.name} was used by a run; "
            "a used rule is kept as part of the run's record"
        )
    locked.delete()


# --- diff ----------------------------------------------------------------------------------


def reward_rule_diff(*, old: RewardRuleVersion, new: RewardRuleVersion) -> list[str]:
    """A unified diff of the two specs' canonical pretty JSON, one string a line (no newlines);
    empty when they are equal."""
    name = old.rule.name
    return [
        line.rstrip("\n")
        for line in difflib.unified_diff(
            spec_pretty_json(old.spec).splitlines(keepends=True),
            spec_pretty_json(new.spec).splitlines(keepends=True),
            fromfile=f"{name} v{old.number}",
            tofile=f"{name} v{new.number}",
            n=DIFF_CONTEXT_LINES,
        )
    ]


def diff_line_kind(line: str) -> str:
    """For colouring: header, hunk, added, removed or context."""
    if line.startswith(("---", "+++")):
        return "header"
    if line.startswith("@@"):
        return "hunk"
    return {"+": "added", "-": "removed"}.get(line[:1], "context")


# --- OpenAI grader JSON --------------------------------------------------------------------


def reward_rule_import_openai(
    *, project: Project, name: str, grader: Any, by: User, description: str = ""
) -> RewardRule:
    """A rule from an OpenAI grader object, pasted as is; problems name their place in `grader`."""
    if not isinstance(grader, dict):
        raise ValidationError({"grader": "an OpenAI grader is a JSON object with a type"})
    try:
        spec = openai_format.from_openai(grader)
    except openai_format.OpenAIFormatError as exc:
        errors: dict[str, list[str]] = {}
        for path, message in exc.problems:
            errors.setdefault(spec_param(path, "grader"), []).append(message)
        raise ValidationError(errors) from None
    name = _check_name(project, name)
    _check_spec(spec, field_name="grader")
    return reward_rule_create(
        project=project, name=name, spec=spec, by=by, description=description, note="imported from OpenAI"
    )


def reward_rule_export_openai(*, version: RewardRuleVersion) -> dict:
    """The version as OpenAI grader JSON; a rule using what OpenAI lacks is refused (StateError, 409)
    with every place that stands in the way."""
    try:
        return openai_format.to_openai(version.spec)
    except openai_format.OpenAIFormatError as exc:
        raise StateError(f"version {version.number} has no OpenAI form: {exc}") from None


# --- dry-run (and, later, backtest) --------------------------------------------------------


def item_dict(item: TaskItem) -> dict[str, Any]:
    """A stored task item in the shape graders read (and the export writes), with what a stub of
    the solution passes once checked (`stub_check`)."""
    stored = {} if item.stub_check is None else {"stub_check": item.stub_check}
    return {"id": item.external_id, "kind": item.kind, "split": item.split, **item.data} | stored


def task_items_for_dry_run(*, version: TaskSetVersion, item_ids: list[str] | None = None) -> list[dict]:
    """Items of a task set version, as graders read them: the ids asked for, in that order, or
    else the first items in file order (enough for any dry-run)."""
    if not item_ids:
        return [item_dict(item) for item in version.items.order_by("position")[:DRY_RUN_MAX_PAIRS]]
    found = {item.external_id: item for item in version.items.filter(external_id__in=item_ids)}
    missing = [item_id for item_id in item_ids if item_id not in found]
    if missing:
        shown = ", ".join(repr(item_id) for item_id in missing[:5])
        raise ValidationError({"item_ids": f"not in {version}: {shown}"})
    return [item_dict(found[item_id]) for item_id in item_ids]


@dataclass
class ScoredPair:
    item_id: str
    sample: dict[str, Any]
    result: dict[str, Any]  # engine.ScoreResult.to_dict()


@dataclass
class ScoreSummary:
    count: int = 0
    scored: int = 0
    errored: int = 0
    flagged: int = 0
    mean_total: float | None = None
    min_total: float | None = None
    max_total: float | None = None
    component_means: dict[str, float | None] = field(default_factory=dict)


@dataclass
class DryRun:
    version: RewardRuleVersion
    pairs: list[ScoredPair]
    summary: ScoreSummary
    components: list[str]  # every sub-reward name, sorted, for table columns


def pair_samples(items: list[Any], samples: list[Any]) -> list[tuple[dict, dict]]:
    """Match each sample with its item: by the sample's `item_id`, else by position. A sample may
    be a plain string, the completion text. Problems name the place (`samples[2].item_id`)."""
    errors: dict[str, list[str]] = {}
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            errors.setdefault(f"items[{index}]", []).append("an item is a JSON object")
    by_id = {str(item.get("id")): item for item in items if isinstance(item, dict) and "id" in item}
    pairs: list[tuple[dict, dict]] = []
    for index, sample in enumerate(samples):
        where = f"samples[{index}]"
        if isinstance(sample, str):
            sample = {"output_text": sample}
        if not isinstance(sample, dict):
            errors.setdefault(where, []).append("a sample is a JSON object or a completion string")
            continue
        sample = dict(sample)
        item_id = sample.pop("item_id", None)
        if item_id is not None:
            item = by_id.get(str(item_id))
            if item is None:
                errors.setdefault(f"{where}.item_id", []).append(f"no item has the id {item_id!r}")
                continue
        elif index < len(items):
            item = items[index]
        else:
            errors.setdefault(where, []).append(
                f"there are {len(items)} items: give this sample an `item_id` to pair it with one"
            )
            continue
        pairs.append((item, sample))
    if not samples:
        errors["samples"] = ["give at least one sample to score"]
    if len(samples) > DRY_RUN_MAX_PAIRS:
        errors["samples"] = [f"at most {DRY_RUN_MAX_PAIRS} samples per dry-run; got {len(samples)}"]
    if errors:
        raise ValidationError(errors)
    return pairs


def _samples(pairs: list[tuple[dict, dict]]) -> list[tuple[dict, "engine.Sample"]]:
    out: list[tuple[dict, engine.Sample]] = []
    errors: dict[str, list[str]] = {}
    for index, (item, sample) in enumerate(pairs):
        for name, problem in sample_problems(sample):
            errors.setdefault(f"samples[{index}].{name}", []).append(problem)
        if any(key.startswith(f"samples[{index}].") for key in errors):
            continue
        try:
            out.append((item, engine.Sample.from_dict(sample)))
        except (ValueError, KeyError, TypeError) as exc:
            errors[f"samples[{index}]"] = [f"not a sample: {exc}"]
    if errors:
        raise ValidationError(errors)
    return out


SAMPLE_TYPES: dict[str, tuple[type, str]] = {
    "output_text": (str, "a string"),
    "files": (dict, "an object of path -> content"),
    "steps": (list, "a list of step objects"),
    "tokens": (int, "an integer"),
    "metadata": (dict, "an object"),
}


def sample_problems(sample: dict) -> list[tuple[str, str]]:
    """A pasted sample's fields of the wrong type, as (field, message): graders would fail on them
    with an exception (a 500) rather than a score.

    >>> sample_problems({"output_text": "x", "steps": 1, "files": {"a.py": 2}})
    [('steps', 'must be a list of step objects'), ('files.a.py', 'must be a string')]
    """
    problems = []
    for name, (kind, what) in SAMPLE_TYPES.items():
        value = sample.get(name)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            problems.append((name, f"must be {what}"))
    if isinstance(sample.get("steps"), list) and not all(isinstance(step, dict) for step in sample["steps"]):
        problems.append(("steps", "must be a list of step objects"))
    for path, content in (sample.get("files") or {}).items() if isinstance(sample.get("files"), dict) else ():
        if not isinstance(content, str):
            problems.append((f"files.{path}", "must be a string"))
    return problems


def pasted_items(items: list[Any]) -> list[Any]:
    """Pasted dry-run items read as an import reads a file's lines (`task_format.validate_item`):
    MBPP's list of asserts joined, a published HumanEval/MBPP/APPS/LiveCodeBench line mapped to a
    code item, and a bad item refused naming its place (`items[1].tests`) instead of failing a
    grader. An item that is not an object is left for `pair_samples` to name."""
    out: list[Any] = []
    errors: dict[str, list[str]] = {}
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            out.append(item)
            continue
        parsed, problems = validate_item(index + 1, item)
        for problem in problems:
            errors.setdefault(f"items[{index}]" + (f".{problem.field}" if problem.field else ""), []).append(
                problem.message
            )
        if parsed is not None:
            named = "id" in item or recognise_line(item) is not None  # else a sample pairs by position
            out.append(
                ({"id": parsed.external_id} if named else {})
                | {"kind": parsed.kind, **parsed.data}
                | _split_of(parsed)
            )
    if errors:
        raise ValidationError(errors)
    return out


def _split_of(parsed: Any) -> dict[str, str]:
    return {"split": parsed.split} if parsed.split else {}


def project_judge(project: Project) -> engine.Judge:
    """The judge of `score_model` / `label_model` graders: the grader's `model` names one of the
    project's tiers, which generates the verdict. Models (and torch) load on the first judgement only."""
    return tier_judge({tier.name: tier_snapshot(tier) for tier in project.tiers.all()})


def project_reward_models(project: Project):
    """The scorer of `reward_model` graders: the project's trained reward models by name. Models (and
    torch) load on the first score only."""
    return project_scorer(project.pk)


def score_pairs(
    *, version: RewardRuleVersion, pairs: list[tuple[dict, dict]], pool: Any = None, judge: Any = None
) -> DryRun:
    """Score (item, sample dict) pairs with a version through the engine. The dry-run calls this
    with pasted pairs; a backtest will call it with a past run's stored trajectories."""
    scored = _samples(pairs)
    judge = judge or project_judge(version.rule.project)
    try:
        results = engine.score_batch(
            version.spec,
            scored,
            pool=pool,
            judge=judge,
            reward_models=project_reward_models(version.rule.project),
        )
    except engine.RuleError as exc:  # saved under an older engine that accepted what this one does not
        raise StateError(
            f"version {version.number} does not validate any more: {exc}; save a fixed version"
        ) from None
    out = [
        ScoredPair(str(item.get("id", "")), sample.to_dict(), result.to_dict())
        for (item, sample), result in zip(scored, results, strict=True)
    ]
    components: list[str] = []
    for pair in out:
        components += [name for name in pair.result["components"] if name not in components]
    # Sorted: PostgreSQL's jsonb does not keep the order in which a rule lists its graders.
    components.sort()
    return DryRun(version, out, summarize(out, components), components)


def summarize(pairs: list[ScoredPair], components: list[str]) -> ScoreSummary:
    totals = [p.result["total"] for p in pairs if not p.result["errored"] and p.result["total"] is not None]
    summary = ScoreSummary(
        count=len(pairs),
        scored=len(totals),
        errored=sum(1 for p in pairs if p.result["errored"]),
        flagged=sum(1 for p in pairs if p.result["flags"]),
    )
    if totals:
        summary.mean_total = sum(totals) / len(totals)
        summary.min_total, summary.max_total = min(totals), max(totals)
    for name in components:
        values = [p.result["components"].get(name) for p in pairs if not p.result["errored"]]
        values = [v for v in values if v is not None]
        summary.component_means[name] = sum(values) / len(values) if values else None
    return summary


def reward_rule_dry_run(
    *, version: RewardRuleVersion, items: list[Any], samples: list[Any], pool: Any = None, judge: Any = None
) -> DryRun:
    """Score items and samples with a version; nothing is stored. Pasted items go through
    `pasted_items` first (the views do it; a task set's items are stored valid)."""
    return score_pairs(version=version, pairs=pair_samples(items, samples), pool=pool, judge=judge)

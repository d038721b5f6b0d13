"""Jobs of OpenAI's fine-tuning API, launched as Flywheel runs through the same services the pages
and REST use (task set import, reward rule import, run create, pause, resume, cancel). What goes
wrong is an `ApiError` naming OpenAI's `param` and `code`.

Creating a job checks the request's fields at once (model, files, method, grader, hyperparameters)
and keeps the job `validating_files`, as OpenAI answers; after commit a Celery task
(`finetuning.tasks.job_launch`) checks the files line by line against the method and launches the
run, or fails the job with OpenAI's error naming the file, the line and the field.

A file becomes a task set version when a job uses it: task set `openai <training file id>`
(`+ <validation file id>`), one version per distinct content, the validation file's lines as the
held-out split, each item's id naming its file and line.
"""

import csv
import hashlib
import io
import json
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.files.base import ContentFile
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from core.exceptions import StateError
from core.roles import Permission
from finetuning import formats, graders, tasks
from finetuning.errors import ApiError
from finetuning.files import decoded_lines, file_bytes, refuse_problems
from finetuning.models import FineTuningFile, FineTuningJob, FineTuningJobEvent, job_id
from projects import selectors as project_selectors
from projects import services as project_services
from projects.models import Project, TaskItem, TaskSet, TaskSetVersion
from projects.task_format import ParsedItem, canonical_json
from rewards import services as reward_services
from rewards.models import RewardRule
from runs import lifecycle
from runs.hyperparameters import AUTO
from runs.models import Checkpoint, MetricPoint, Run
from tiers.models import Tier

SFT_RULE = {
    "type": "string_check",
    "name": "exact",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.reference }}",
    "operation": "eq",
}
# A job still validating this long after it was created is sent to a worker again (its message was
# lost, or the broker was down when the job committed); a second delivery launches nothing twice.
LAUNCH_RESEND_AFTER = timedelta(minutes=5)
RFT_GROUP_SIZE = 8  # GRPO's completions per item at compute_multiplier 1
SUFFIX = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class JobRequest:
    """POST /v1/fine_tuning/jobs, read: each field checked, in OpenAI's names."""

    model: str
    training_file: FineTuningFile
    validation_file: FineTuningFile | None
    method: str
    method_body: dict
    hyperparameters: dict
    grader: dict | None
    suffix: str
    seed: int
    metadata: dict


def job_request_parse(*, project: Project, body: Any) -> JobRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", None, "invalid_value")
    unknown = sorted(
        set(body)
        - {
            "model",
            "training_file",
            "validation_file",
            "suffix",
            "seed",
            "metadata",
            "method",
            "hyperparameters",
            "integrations",
        }
    )
    if unknown:
        raise ApiError(400, f"unknown parameter {unknown[0]!r}", unknown[0], "unknown_parameter")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(
            400,
            "model is required: a tier (tier-<id> or its name) or a fine_tuned_model",
            "model",
            "missing_required_parameter",
        )
    training = _file_of(project, body.get("training_file"), "training_file")
    sent = body.get("validation_file")
    validation = None if sent in (None, "") else _file_of(project, sent, "validation_file")
    method, method_body, hyperparameters, grader = _method_of(body)
    suffix = body.get("suffix") or ""
    if suffix and (not isinstance(suffix, str) or not SUFFIX.match(suffix)):
        raise ApiError(400, "suffix must be 1-64 letters, digits, '_', '.' or '-'", "suffix", "invalid_value")
    seed = body.get("seed")
    if seed is None:
        seed = 0
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31:
        raise ApiError(400, "seed must be an integer from 0 to 2147483647", "seed", "invalid_value")
    metadata = body.get("metadata") or {}
    if (
        not isinstance(metadata, dict)
        or len(metadata) > 16
        or any(
            not isinstance(k, str) or len(k) > 64 or not isinstance(v, str) or len(v) > 512
            for k, v in metadata.items()
        )
    ):
        raise ApiError(
            400,
            "metadata: at most 16 string keys (64 characters) with string values (512)",
            "metadata",
            "invalid_value",
        )
    return JobRequest(
        model, training, validation, method, method_body, hyperparameters, grader, suffix, seed, metadata
    )


def _file_of(project: Project, file_id: Any, param: str) -> FineTuningFile:
    found = (
        FineTuningFile.objects.filter(pk=file_id, project=project).first()
        if isinstance(file_id, str)
        else None
    )
    if found is None:
        raise ApiError(400, f"invalid {param}: no file {file_id!r} in this project", param, "invalid_file_id")
    if found.purpose != FineTuningFile.Purpose.FINE_TUNE:
        raise ApiError(
            400,
            f"{param} {file_id} has purpose {found.purpose}; upload it with purpose fine-tune",
            param,
            "invalid_file_purpose",
        )
    return found


def _method_of(body: dict) -> tuple[str, dict, dict, dict | None]:
    """(method, its object as sent, its hyperparameters, its grader) from `method` (or the legacy
    top-level `hyperparameters`, which mean supervised)."""
    method = body.get("method")
    if method is None:
        method = {
            "type": formats.SUPERVISED,
            formats.SUPERVISED: {"hyperparameters": body.get("hyperparameters") or {}},
        }
    if not isinstance(method, dict) or method.get("type") not in formats.METHODS:
        raise ApiError(
            400, f"method.type must be one of {', '.join(formats.METHODS)}", "method.type", "invalid_value"
        )
    kind = method["type"]
    inner = method.get(kind) or {}
    if not isinstance(inner, dict):
        raise ApiError(400, f"method.{kind} must be an object", f"method.{kind}", "invalid_value")
    hyperparameters = inner.get("hyperparameters") or {}
    if not isinstance(hyperparameters, dict):
        raise ApiError(
            400, "hyperparameters must be an object", f"method.{kind}.hyperparameters", "invalid_value"
        )
    grader = inner.get("grader")
    if kind == formats.REINFORCEMENT and not isinstance(grader, dict):
        raise ApiError(
            400,
            "a reinforcement job needs a grader object",
            "method.reinforcement.grader",
            "missing_required_parameter",
        )
    return kind, method, hyperparameters, grader


OPENAI_HYPERPARAMETERS = {
    formats.SUPERVISED: {"n_epochs", "batch_size", "learning_rate_multiplier"},
    formats.DPO: {"n_epochs", "batch_size", "learning_rate_multiplier", "beta"},
    formats.REINFORCEMENT: {
        "n_epochs",
        "batch_size",
        "learning_rate_multiplier",
        "eval_interval",
        "eval_samples",
        "compute_multiplier",
        "reasoning_effort",
    },
}


def flywheel_hyperparameters(method: str, sent: dict, *, seed: int, train_items: int) -> tuple[dict, int]:
    """(Flywheel's hyperparameters, max_steps) for OpenAI's, "auto" where OpenAI accepts it.

    >>> flywheel_hyperparameters("reinforcement", {"n_epochs": 2, "batch_size": 4, "compute_multiplier": 0.5},
    ...                          seed=7, train_items=6)
    ({'seed': 7, 'batch_size': 4, 'group_size': 4}, 3)
    """
    place = f"method.{method}.hyperparameters"
    unknown = sorted(set(sent) - OPENAI_HYPERPARAMETERS[method])
    if unknown:
        raise ApiError(
            400,
            f"{unknown[0]} is not a hyperparameter of {method} jobs",
            f"{place}.{unknown[0]}",
            "invalid_value",
        )
    flywheel: dict[str, Any] = {"seed": seed}
    epochs = _number(sent, "n_epochs", place, int, 1, 1000, default=1)
    batch = _number(sent, "batch_size", place, int, 1, 4096, default=min(8, max(1, train_items)))
    flywheel["batch_size"] = batch
    if (multiplier := _number(sent, "learning_rate_multiplier", place, float, 1e-4, 100.0)) is not None:
        flywheel["learning_rate"] = 3e-4 * multiplier
    if method == formats.DPO and (beta := _number(sent, "beta", place, float, 0.0, 100.0)) is not None:
        flywheel["beta"] = beta
    if method == formats.REINFORCEMENT:
        compute = _number(sent, "compute_multiplier", place, float, 0.25, 8.0, default=1.0)
        flywheel["group_size"] = max(2, round(RFT_GROUP_SIZE * compute))
        if (interval := _number(sent, "eval_interval", place, int, 1, 100000)) is not None:
            flywheel["eval_every"] = interval
        _number(sent, "eval_samples", place, int, 1, 1000)  # one sample per held-out item here
    else:
        flywheel["epochs"] = epochs
    return flywheel, max(1, math.ceil(epochs * train_items / batch))


def _number(
    sent: dict, name: str, place: str, kind: type, low: float, high: float, default: Any = None
) -> Any:
    value = sent.get(name, AUTO)
    if value == AUTO:
        return default
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and (kind is float or isinstance(value, int))
    )
    if not ok or not low <= value <= high:
        what = "an integer" if kind is int else "a number"
        raise ApiError(
            400,
            f'{name} must be "auto" or {what} from {low:g} to {high:g}',
            f"{place}.{name}",
            "invalid_value",
        )
    return value


def _base_of(project: Project, model: str) -> tuple[Tier, Checkpoint | None]:
    """The tier a job trains (`tier-<id>` or a tier's name in the project), or a finished job's
    fine_tuned_model to continue from (its final checkpoint, on its tier)."""
    previous = (
        FineTuningJob.objects.filter(fine_tuned_model=model, project=project).select_related("run").first()
    )
    if previous is not None:
        run = previous.run
        checkpoint = run.checkpoints.order_by("-step").first() if run is not None else None
        if run is None or run.status != Run.Status.SUCCEEDED or checkpoint is None or run.tier is None:
            raise ApiError(
                400,
                f"{model} has not finished training; continue from it once it succeeds",
                "model",
                "model_not_available",
            )
        return run.tier, checkpoint
    tiers = Tier.objects.filter(project=project)
    match = re.fullmatch(r"tier-(\d{1,18})", model)
    tier = tiers.filter(pk=int(match[1])).first() if match else tiers.filter(name=model).first()
    if tier is None:
        names = (
            ", ".join(f"tier-{pk} ({name})" for pk, name in tiers.values_list("pk", "name")[:10])
            or "none yet"
        )
        raise ApiError(
            404,
            f"The model `{model}` does not exist or you do not have access to it. This project's "
            f"tiers: {names}",
            "model",
            "model_not_found",
        )
    return tier, None


def fine_tuned_name(*, base: str, project: Project, suffix: str, ident: str) -> str:
    """`ft:<base>:<project>:<suffix>:<id>`, as OpenAI names a fine-tuned model.

    >>> from types import SimpleNamespace
    >>> team = SimpleNamespace(name="My Team")
    >>> fine_tuned_name(base="tier-3", project=team, suffix="", ident="ftjob-abcdef12")
    'ft:tier-3:my-team::abcdef12'
    """
    return f"ft:{base}:{slugify(project.name) or 'project'}:{suffix}:{ident.removeprefix('ftjob-')[:8]}"


def job_create(*, project: Project, by: User, body: Any) -> FineTuningJob:
    """Check the request's fields and keep the job, `validating_files`; its files are validated and
    its run launched after commit (`job_launch`, on a worker). Nothing is kept when a field is
    refused."""
    project_selectors.require(user=by, project_id=project.pk, permission=Permission.EDIT)
    request = job_request_parse(project=project, body=body)
    _base_of(project, request.model)
    # Its refusals only: the values wait for the count of the training file's lines.
    flywheel_hyperparameters(request.method, request.hyperparameters, seed=request.seed, train_items=1)
    _grader_spec(project, request)
    ident = job_id()
    with transaction.atomic():
        job = FineTuningJob.objects.create(
            id=ident,
            project=project,
            model=request.model,
            training_file=request.training_file.pk,
            validation_file=request.validation_file.pk if request.validation_file else "",
            suffix=request.suffix,
            seed=request.seed,
            metadata=request.metadata,
            method=request.method_body,
            fine_tuned_model=fine_tuned_name(
                base=request.model, project=project, suffix=request.suffix, ident=ident
            ),
            created_by_id=by.pk,
        )
        _event(job, f"Created fine-tuning job: {job.id}")
        for file, what in _files_of(request):
            _event(job, f"Validating {what} file: {file.pk}", status=FineTuningJob.Status.VALIDATING_FILES)
        transaction.on_commit(lambda: tasks.job_launch.delay(ident))
    return job


def _files_of(request: JobRequest) -> list[tuple[FineTuningFile, str]]:
    files = [(request.training_file, "training")]
    return files + ([(request.validation_file, "validation")] if request.validation_file else [])


def _event(job: FineTuningJob, message: str, *, level: str = "info", status: str = "", **data: Any) -> None:
    FineTuningJobEvent.objects.create(
        job=job, level=level, message=message, data=({"status": status} if status else {}) | data
    )


def _grader_spec(project: Project, request: JobRequest) -> dict | None:
    """The job's grader as the rule its run scores with (a line's own fields read from the item's
    metadata), once it validates and each model grader names a tier of the project."""
    if request.grader is None:
        return None
    return graders.grader_checked(
        formats.grader_for_items(request.grader), project=project, param=f"method.{request.method}.grader"
    )


def jobs_launch_resend() -> list[str]:
    """Send again the launches of jobs still validating well after they were made (the scheduler's
    tick); returns their ids."""
    stale = FineTuningJob.objects.filter(
        status=FineTuningJob.Status.VALIDATING_FILES, created_at__lt=timezone.now() - LAUNCH_RESEND_AFTER
    ).values_list("pk", flat=True)
    resent = list(stale[:100])
    for ident in resent:
        tasks.job_launch.delay(ident)
    return resent


def job_launch(*, job_id: str) -> FineTuningJob | None:
    """Validate a `validating_files` job's files line by line against its method, make them a task
    set version and launch the run; or fail the job with OpenAI's error (the file, the line and the
    field) and keep nothing. A redelivery, or a job cancelled meanwhile, finds nothing to do."""
    job = (
        FineTuningJob.objects.filter(pk=job_id, status=FineTuningJob.Status.VALIDATING_FILES)
        .select_related("project", "created_by")
        .first()
    )
    if job is None:
        return None
    try:
        if job.created_by is None:
            raise ApiError(400, "the user who created the job is gone", None, "invalid_request")
        request = job_request_parse(project=job.project, body=_request_body(job))
        tier, checkpoint = _base_of(job.project, request.model)
        spec = _grader_spec(job.project, request)
        items = _job_items(request)
        train_count = sum(1 for item in items if item.split == "train")
        hyperparameters, max_steps = flywheel_hyperparameters(
            request.method, request.hyperparameters, seed=request.seed, train_items=train_count
        )
        with transaction.atomic():
            claimed = FineTuningJob.objects.filter(
                pk=job.pk, status=FineTuningJob.Status.VALIDATING_FILES
            ).update(status=FineTuningJob.Status.LAUNCHED)
            if not claimed:  # launched by another delivery, or cancelled, since it was read
                return None
            version = _task_set_version(job.project, job.created_by, request, items)
            _event(
                job,
                "Files validated, moving job to queued state",
                status="queued",
                task_set_version=version.pk,
                items=len(items),
            )
            run = _run_launch(job, request, version, spec, tier, checkpoint, hyperparameters, max_steps)
            FineTuningJob.objects.filter(pk=job.pk).update(run=run, task_set_version=version)
    except ApiError as exc:
        _job_fail(job, exc)
        return None
    job.refresh_from_db()
    return job


def _request_body(job: FineTuningJob) -> dict[str, Any]:
    """The job's request as it was sent (its method object includes legacy `hyperparameters`)."""
    return {
        "model": job.model,
        "training_file": job.training_file,
        "validation_file": job.validation_file or None,
        "suffix": job.suffix,
        "seed": job.seed,
        "metadata": job.metadata,
        "method": job.method,
    }


def _run_launch(
    job: FineTuningJob,
    request: JobRequest,
    version: TaskSetVersion,
    spec: dict | None,
    tier: Tier,
    checkpoint: Checkpoint | None,
    hyperparameters: dict,
    max_steps: int,
) -> Run:
    assert job.created_by is not None  # job_launch refused a job without one
    rule = _reward_rule(job.project, job.created_by, request, job.id, spec)
    run_request = lifecycle.RunRequest(
        project=job.project,
        name=f"{request.suffix or 'fine-tune'} ({job.id})"[:100],
        task_set_version=version,
        reward_rule_version=rule.versions.get(),
        tier=tier,
        method={formats.SUPERVISED: Run.Method.SFT, formats.DPO: Run.Method.DPO}.get(
            request.method, Run.Method.GRPO
        ),
        hyperparameters=hyperparameters,
        max_steps=max_steps,
        eval_split="heldout" if request.validation_file else "train",
        monitor_actions={"nothing_to_learn": "alert"},
    )
    try:
        return lifecycle.run_create(
            request=run_request,
            by=job.created_by,
            parent=checkpoint.run if checkpoint else None,
            checkpoint=checkpoint,
        )
    except ValidationError as exc:
        raise _run_refusal(exc) from None


def _job_fail(job: FineTuningJob, exc: ApiError) -> None:
    """The job failed before its run, with OpenAI's error object: a file's problem is
    `invalid_training_file` (or `invalid_validation_file`), naming the line and the field."""
    code = {"training_file": "invalid_training_file", "validation_file": "invalid_validation_file"}.get(
        exc.param or "", exc.code
    )
    error = {"code": code, "message": str(exc), "param": exc.param}
    with transaction.atomic():
        failed = FineTuningJob.objects.filter(pk=job.pk, status=FineTuningJob.Status.VALIDATING_FILES).update(
            status=FineTuningJob.Status.FAILED, error=error, finished_at=timezone.now()
        )
        if failed:
            what = {"training_file": "Training file", "validation_file": "Validation file"}.get(
                exc.param or ""
            )
            message = f"{what} failed validation: {exc}" if what else f"The job failed: {exc}"
            _event(job, message, level="error", status="failed", error=error)


def _job_items(request: JobRequest) -> list[ParsedItem]:
    items = []
    for file, split, param in (
        (request.training_file, "train", "training_file"),
        (request.validation_file, "heldout", "validation_file"),
    ):
        if file is None:
            continue
        try:
            lines = decoded_lines(file_bytes(file))
        except ApiError as exc:  # checked at upload; named here as the job's file all the same
            raise ApiError(400, f"{file.pk}: {exc}", param, "invalid_file_format") from None
        except OSError as exc:
            raise ApiError(400, f"{file.pk} cannot be read: {exc}", param, "invalid_file_format") from None
        refuse_problems([p for n, raw in lines for p in formats.line_problems(n, raw, request.method)], param)
        for number, raw in lines:
            data = formats.item_data(raw, request.method)
            text = data["messages"][-1]["content"]
            # The id names the file and the line (the same file may train and validate).
            ident = f"{file.pk}:line-{number}" if split == "train" else f"{file.pk}:validation-line-{number}"
            items.append(
                ParsedItem(number, ident, formats.item_kind(raw, request.method), split, text[:10000], data)
            )
    return items


def _task_set_version(
    project: Project, by: User, request: JobRequest, items: list[ParsedItem]
) -> TaskSetVersion:
    """The files as a task set version (a new one only when their content is new)."""
    name = f"openai {request.training_file.pk}" + (
        f" + {request.validation_file.pk}" if request.validation_file else ""
    )
    task_set = TaskSet.objects.filter(project=project, name=name).first()
    if task_set is None:
        task_set = _task_set_create(project, by, request, name)
    # Lines map onto items by method (a supervised line and a reinforcement line differ), so the
    # version's content is the items made: the same files and method reuse their version.
    digest = hashlib.sha256()
    for item in items:
        digest.update(canonical_json([item.external_id, item.split, item.data]).encode())
    task_set = TaskSet.objects.select_for_update().get(pk=task_set.pk)
    same = task_set.versions.filter(content_hash=digest.hexdigest()).first()
    if same is not None:
        return same
    latest = task_set.versions.first()
    version = TaskSetVersion.all_objects.create(
        task_set=task_set,
        number=(latest.number or 0) + 1 if latest else 1,
        published=True,
        content_hash=digest.hexdigest(),
        item_count=len(items),
        split_seed=0,
        heldout_fraction=0.0,
        source_name=f"{request.method} job: {name}"[:255],
        created_by_id=by.pk,
        kind_counts=dict(Counter(item.kind for item in items)),
        split_counts=dict(Counter(item.split for item in items)),
    )
    now = timezone.now()
    TaskItem.objects.bulk_create(
        TaskItem(
            version=version,
            position=position,
            external_id=item.external_id,
            kind=item.kind,
            split=item.split or "train",  # every item made here names its split
            text=item.text,
            data=item.data,
            created_at=now,
        )
        for position, item in enumerate(items)
    )
    return version


def _task_set_create(project: Project, by: User, request: JobRequest, name: str) -> TaskSet:
    description = f"OpenAI fine-tuning files: {request.training_file.filename}"
    if request.validation_file:
        description += f" (held-out: {request.validation_file.filename})"
    try:
        with transaction.atomic():
            return project_services.task_set_create(
                project=project, name=name, by=by, description=description
            )
    except ValidationError:  # another job on the same files made it first
        return TaskSet.objects.get(project=project, name=name)


def _reward_rule(
    project: Project, by: User, request: JobRequest, ident: str, spec: dict | None
) -> RewardRule:
    """The run's rule: the job's grader (imported as OpenAI's grader JSON when it uses OpenAI's
    types only), or for a job without one the held-out check of its replies."""
    name = f"{ident} grader"
    try:
        if spec is None:
            return reward_services.reward_rule_create(
                project=project,
                name=name,
                spec=SFT_RULE,
                by=by,
                note=f"held-out check of {request.method} job {ident}",
            )
        if request.grader is not None and graders.uses_openai_types_only(request.grader):
            return reward_services.reward_rule_import_openai(
                project=project,
                name=name,
                grader=spec,
                by=by,
                description=f"the grader of fine-tuning job {ident}",
            )
        return reward_services.reward_rule_create(
            project=project,
            name=name,
            spec=spec,
            by=by,
            description=f"the grader of fine-tuning job {ident}",
            note="a fine-tuning job's grader, with Flywheel's own grader types",
        )
    except ValidationError as exc:
        raise _run_refusal(exc, prefix=f"method.{request.method}.") from None


def _run_refusal(exc: ValidationError, prefix: str = "") -> ApiError:
    problems = exc.message_dict if hasattr(exc, "error_dict") else {"": exc.messages}
    param, messages = next(iter(problems.items()))
    if prefix:  # a rule's refusal: its spec is the job's grader
        param = "grader" + param.removeprefix("spec").removeprefix("grader") if param else "grader"
    else:
        param = {"tier": "model", "task_set_version": "training_file"}.get(param.split(".")[0], param)
    text = "; ".join(f"{name}: {' '.join(m)}" if name else " ".join(m) for name, m in problems.items())
    return ApiError(400, text, f"{prefix}{param}" if param else None, "invalid_value")


def job_cancel(*, job: FineTuningJob, by: User) -> FineTuningJob:
    """Cancel the job: while it validates its files, the job itself (its task then finds nothing to
    do); once launched, its run."""
    project_selectors.require(user=by, project_id=job.project_id, permission=Permission.EDIT)
    with transaction.atomic():
        cancelled = FineTuningJob.objects.filter(
            pk=job.pk, status=FineTuningJob.Status.VALIDATING_FILES
        ).update(status=FineTuningJob.Status.CANCELLED, finished_at=timezone.now())
        if cancelled:
            _event(job, "Fine-tuning job cancelled while validating its files", status="cancelled")
    if cancelled:
        job.refresh_from_db()
        return job
    return _job_change(job, by, lifecycle.run_cancel)


def job_pause(*, job: FineTuningJob, by: User) -> FineTuningJob:
    return _job_change(job, by, lifecycle.run_pause)


def job_resume(*, job: FineTuningJob, by: User) -> FineTuningJob:
    return _job_change(job, by, lifecycle.run_resume)


def _job_change(job: FineTuningJob, by: User, change: Callable[..., Run]) -> FineTuningJob:
    project_selectors.require(user=by, project_id=job.project_id, permission=Permission.EDIT)
    job.refresh_from_db()
    if job.run is None:
        what = {
            FineTuningJob.Status.VALIDATING_FILES: "is validating its files; it can be paused once queued",
            FineTuningJob.Status.FAILED: "failed before training",
            FineTuningJob.Status.CANCELLED: "was cancelled before training",
        }.get(FineTuningJob.Status(job.status), f"is {job.status}")
        raise ApiError(409, f"job {job.id} {what}", None, "invalid_state")
    try:
        change(run=job.run)
    except StateError as exc:
        raise ApiError(409, str(exc), None, "invalid_state") from None
    job.run.refresh_from_db()
    return job


def job_results_ensure(*, job: FineTuningJob) -> FineTuningJob:
    """The job's result file (a CSV of its step metrics, as OpenAI's), made once its run has
    finished (a job that failed or was cancelled before its run has none)."""
    if job.result_file_id is not None or job.run is None or not job.run.is_terminal:
        return job
    content = results_csv(job.run).encode()
    with transaction.atomic():
        locked = FineTuningJob.objects.select_for_update().get(pk=job.pk)
        if locked.result_file_id is None:
            results = FineTuningFile(
                project_id=job.project_id,
                filename="step_metrics.csv",
                purpose=FineTuningFile.Purpose.RESULTS,
                bytes=len(content),
            )
            results.content.save(f"{results.id}.csv", ContentFile(content), save=False)
            results.save()
            FineTuningJob.objects.filter(pk=job.pk).update(result_file=results)
    job.refresh_from_db()
    return job


def results_csv(run: Run) -> str:
    """One row per step: `step`, then each metric the run recorded, named as Flywheel names them."""
    points = MetricPoint.objects.filter(run=run).order_by("step", "name").values_list("step", "name", "value")
    names = sorted({name for _, name, _ in points})
    rows: dict[int, dict[str, float]] = {}
    for step, name, value in points:
        rows.setdefault(step, {})[name] = value
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["step", *names])
    for step in sorted(rows):
        writer.writerow([step, *(json.dumps(rows[step][n]) if n in rows[step] else "" for n in names)])
    return out.getvalue()

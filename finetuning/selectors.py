"""Reads for OpenAI's fine-tuning API: the project a call acts in, files, jobs, their events and
checkpoints (the run's), and the served models that jobs' fine_tuned_model names stand for."""

import dataclasses
import re
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Max, Min, QuerySet

from core.roles import Permission
from finetuning.models import CheckpointPermission, FineTuningFile, FineTuningJob, FineTuningJobEvent
from projects import selectors as project_selectors
from projects.models import ApiToken, Project
from runs import selectors
from runs.models import Checkpoint, MetricPoint, Run, RunEvent
from serving.served_models import ServedModel, checkpoint_model

CHECKPOINT_SUFFIX = re.compile(r"^(?P<model>ft:.+):ckpt-step-(?P<step>\d{1,18})$")


class NoProjectError(LookupError):
    """The call names no project it may act in."""


def project_of(
    *,
    user: User,
    header: str | None,
    token_digest: str | None = None,
    named_by: str = "the OpenAI-Project header",
) -> Project:
    """The project named by `header` (its id or name; `named_by` says where the caller sends it),
    else the bearer token's default project, else the caller's only project; a project the caller
    is not in is reported as absent."""
    mine = Project.objects.filter(pk__in=project_selectors.visible_project_ids(user=user))
    if header:
        found = mine.filter(pk=int(header)).first() if re.fullmatch(r"[0-9]{1,18}", header) else None
        found = found or mine.filter(name=header).first()
        if found is None:
            raise NoProjectError(f"{named_by}: no project {header!r} that you are a member of")
        return found
    token = ApiToken.objects.filter(digest=token_digest).first() if token_digest else None
    if token is not None and token.default_project_id is not None:
        found = mine.filter(pk=token.default_project_id).first()
        if found is None:  # the caller has left the project since the token was made
            raise NoProjectError(
                f"this token's default project ({token.default_project_id}) is no longer one of yours: "
                f"name the project with {named_by} (its id or name)"
            )
        return found
    projects = list(mine.order_by("pk")[:2])
    if len(projects) != 1:
        raise NoProjectError(
            f"name the project with {named_by} (its id or name), or give the API token a "
            f"default project: you are a member of {'no project' if not projects else 'several'}"
        )
    return projects[0]


def files_of(*, project: Project, purpose: str | None = None) -> QuerySet[FineTuningFile]:
    files = FineTuningFile.objects.filter(project=project)
    return files.filter(purpose=purpose) if purpose else files


def file_for(*, user: User, file_id: str) -> FineTuningFile | None:
    found = FineTuningFile.objects.filter(pk=file_id).first()
    if found is None or not _can(user, found.project_id, Permission.VIEW):
        return None
    return found


def jobs_of(*, project: Project, metadata: dict[str, str] | None = None) -> QuerySet[FineTuningJob]:
    jobs = FineTuningJob.objects.filter(project=project).select_related("run")
    for key, value in (metadata or {}).items():
        jobs = jobs.filter(**{f"metadata__{key}": value})
    return jobs


def job_for(*, user: User, job_id: str) -> FineTuningJob | None:
    job = FineTuningJob.objects.filter(pk=job_id).select_related("run", "project").first()
    if job is None or not _can(user, job.project_id, Permission.VIEW):
        return None
    return job


def _can(user: User, project_id: int, permission: str) -> bool:
    return selectors.role_allows(project_selectors.role_of(user=user, project_id=project_id), permission)


# --- events and checkpoints --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class JobEvent:
    id: str
    created_at: datetime
    level: str
    message: str
    type: str
    data: dict[str, Any]


def job_events(*, job: FineTuningJob) -> list[JobEvent]:
    """The job's own events (its files validated or refused), then its run's events and one
    `metrics` event per step that recorded metrics, newest first."""
    events = [
        JobEvent(f"ftevent-j{e.pk}", e.created_at, e.level, e.message, "message", e.data)
        for e in FineTuningJobEvent.objects.filter(job=job).order_by("pk")
    ]
    run = job.run
    if run is None:
        return sorted(events, key=lambda e: (e.created_at, e.id), reverse=True)
    events += [
        JobEvent(
            f"ftevent-{e.pk}",
            e.created_at,
            {"warning": "warn"}.get(e.level, e.level),
            e.message,
            "message",
            e.data,
        )
        for e in RunEvent.objects.filter(run=run).order_by("pk")
    ]
    steps = step_metrics(run)
    times = dict(
        MetricPoint.objects.filter(run=run)
        .values("step")
        .annotate(at=Max("created_at"))
        .values_list("step", "at")
    )
    events += [
        JobEvent(
            f"ftevent-m{run.pk}-{step}",
            times[step],
            "info",
            f"Step {step}: metrics",
            "metrics",
            openai_metrics(step, values),
        )
        for step, values in steps.items()
    ]
    return sorted(events, key=lambda e: (e.created_at, e.id), reverse=True)


def step_metrics(run: Run) -> dict[int, dict[str, float]]:
    steps: dict[int, dict[str, float]] = {}
    for step, name, value in (
        MetricPoint.objects.filter(run=run).order_by("step").values_list("step", "name", "value")
    ):
        steps.setdefault(step, {})[name] = value
    return steps


OPENAI_METRIC_NAMES = {
    "learner/loss": "train_loss",
    "reward/mean": "train_reward_mean",
    "heldout/reward": "full_valid_reward_mean",
    "heldout/pass_rate": "full_valid_pass_rate",
}


def openai_metrics(step: int, values: dict[str, float]) -> dict[str, Any]:
    """A step's metrics in OpenAI's names where it has them, and every Flywheel metric as recorded."""
    named = {
        OPENAI_METRIC_NAMES[name]: value for name, value in values.items() if name in OPENAI_METRIC_NAMES
    }
    return {"step": step, **named, "flywheel": values}


def job_checkpoints(*, job: FineTuningJob) -> list[Checkpoint]:
    if job.run is None:
        return []
    return list(Checkpoint.objects.filter(run=job.run).order_by("-step"))


def job_step_metrics(*, job: FineTuningJob) -> dict[int, dict[str, float]]:
    return step_metrics(job.run) if job.run is not None else {}


def job_trained_tokens(job: FineTuningJob) -> int | None:
    """Tokens the learner trained on, once the job has finished (null before, as OpenAI's): for a
    reinforcement job its learned trajectories' tokens; for supervised and dpo the steps'
    `learner/tokens` (prompts and completions, padding not counted)."""
    run = job.run
    if run is None or not run.is_terminal:
        return None
    if run.method != Run.Method.GRPO:
        steps = MetricPoint.objects.filter(run=run, name="learner/tokens").values_list("value", flat=True)
        return int(sum(steps)) if steps else None
    learned = run.trajectories.exclude(learned_in_step=None)
    return sum(p + c for p, c in learned.values_list("prompt_tokens", "completion_tokens"))


def job_estimated_finish(job: FineTuningJob) -> datetime | None:
    """When a running job should finish at its step rate so far: from the time of its steps'
    first metrics, once two steps (from step 1: step 0 is the base model's evaluation) are done."""
    run = job.run
    if run is None or run.status not in (Run.Status.RUNNING, Run.Status.PAUSING) or not run.max_steps:
        return None
    done = list(
        MetricPoint.objects.filter(run=run, step__gte=1)
        .values("step")
        .annotate(at=Min("created_at"))
        .order_by("step")
        .values_list("step", "at")
    )
    if len(done) < 2:
        return None
    (first_step, first_at), (last_step, last_at) = done[0], done[-1]
    per_step = (last_at - first_at) / (last_step - first_step)
    return last_at + per_step * max(0, run.max_steps - last_step)


# --- fine-tuned models, served ---------------------------------------------------------------


def fine_tuned_model_for(*, user: User, model_id: str, fetch: bool = False) -> ServedModel | None:
    """A job's fine_tuned_model (its final checkpoint) or one checkpoint's name
    (`<fine_tuned_model>:ckpt-step-<n>`), if the caller may view the job; None otherwise."""
    if not model_id.startswith("ft:"):
        return None
    step = None
    if match := CHECKPOINT_SUFFIX.match(model_id):
        step = int(match["step"])
    name = match["model"] if match else model_id
    job = FineTuningJob.objects.filter(fine_tuned_model=name).select_related("run__project").first()
    if job is None or job.run is None:
        return None
    checkpoints = Checkpoint.objects.filter(run=job.run).select_related("run__project")
    if step is None:
        if job.run.status != Run.Status.SUCCEEDED:
            return None
        checkpoint = checkpoints.order_by("-step").first()
    else:
        checkpoint = checkpoints.filter(step=step).first()
    if checkpoint is None:
        return None
    if not _can(user, job.project_id, Permission.VIEW) and not shared_with(user=user, checkpoint=checkpoint):
        return None
    return dataclasses.replace(checkpoint_model(checkpoint, fetch=fetch), id=model_id)


def shared_with(*, user: User, checkpoint: Checkpoint) -> bool:
    """Whether one of the caller's projects was granted the checkpoint (a checkpoint permission)."""
    return CheckpointPermission.objects.filter(
        checkpoint=checkpoint, project__memberships__user_id=user.pk
    ).exists()


def fine_tuned_models_for(*, user: User) -> list[ServedModel]:
    jobs = FineTuningJob.objects.filter(
        project_id__in=project_selectors.visible_project_ids(user=user), run__status=Run.Status.SUCCEEDED
    ).select_related("run__project")
    models = []
    for job in jobs.order_by("-created_at"):
        checkpoint = (
            Checkpoint.objects.filter(run=job.run).select_related("run__project").order_by("-step").first()
        )
        if checkpoint is not None:
            models.append(dataclasses.replace(checkpoint_model(checkpoint), id=job.fine_tuned_model))
    shared = CheckpointPermission.objects.filter(project__memberships__user_id=user.pk).select_related(
        "job", "checkpoint__run__project"
    )
    for permission in shared.order_by("-created_at"):
        name = f"{permission.job.fine_tuned_model}:ckpt-step-{permission.checkpoint.step}"
        models.append(dataclasses.replace(checkpoint_model(permission.checkpoint), id=name))
    return models

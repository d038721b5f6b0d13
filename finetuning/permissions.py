"""Checkpoint permissions (OpenAI's `fine_tuning/checkpoints/{checkpoint}/permissions`): the owner
of a job's project lets other projects use one of its checkpoints. A checkpoint is named as /v1
serves it: `<fine_tuned_model>:ckpt-step-<n>`, or the job's `fine_tuned_model` for its final one."""

from django.contrib.auth.models import User
from django.db import transaction

from core.roles import Permission, role_allows
from finetuning.errors import ApiError
from finetuning.models import CheckpointPermission, FineTuningJob
from finetuning.selectors import CHECKPOINT_SUFFIX
from projects import selectors as project_selectors
from projects.models import Project
from runs.models import Checkpoint

MAX_PROJECTS = 100


def _may(user: User, project_id: int, permission: str) -> bool:
    return role_allows(project_selectors.role_of(user=user, project_id=project_id), permission)


def checkpoint_named(*, user: User, name: str) -> tuple[FineTuningJob, Checkpoint]:
    """The job and checkpoint a name means, if the caller may manage the job's project."""
    match = CHECKPOINT_SUFFIX.match(name)
    model = match["model"] if match else name
    job = FineTuningJob.objects.filter(fine_tuned_model=model).select_related("run").first()
    checkpoints = (
        Checkpoint.objects.filter(run_id=job.run_id)
        if job is not None and job.run_id is not None
        else Checkpoint.objects.none()
    )
    checkpoint = (
        checkpoints.filter(step=int(match["step"])).first()
        if match
        else checkpoints.order_by("-step").first()
    )
    if job is None or checkpoint is None or not _may(user, job.project_id, Permission.VIEW):
        raise ApiError(
            404, f"no fine-tuned model checkpoint {name!r}", "fine_tuned_model_checkpoint", "not_found"
        )
    if not _may(user, job.project_id, Permission.MANAGE):
        raise ApiError(
            403, "only an owner of the job's project shares its checkpoints", None, "permission_denied"
        )
    return job, checkpoint


def permissions_create(*, user: User, name: str, project_ids: object) -> list[CheckpointPermission]:
    """Grant each project the checkpoint (a grant already made is kept, not doubled); all or none."""
    job, checkpoint = checkpoint_named(user=user, name=name)
    if not isinstance(project_ids, list) or not project_ids or len(project_ids) > MAX_PROJECTS:
        raise ApiError(
            400, f"project_ids: a list of 1 to {MAX_PROJECTS} project ids", "project_ids", "invalid_value"
        )
    wanted = []
    for index, raw in enumerate(project_ids):
        text = str(raw) if isinstance(raw, (str, int)) and not isinstance(raw, bool) else ""
        project = Project.objects.filter(pk=int(text)).first() if text.isdigit() and len(text) < 19 else None
        if project is None:
            raise ApiError(400, f"project_ids[{index}]: no project {raw!r}", "project_ids", "invalid_value")
        if project.pk == job.project_id:
            raise ApiError(
                400,
                f"project_ids[{index}]: the job's own project uses it already",
                "project_ids",
                "invalid_value",
            )
        wanted.append(project)
    with transaction.atomic():
        return [
            CheckpointPermission.objects.get_or_create(
                job=job, checkpoint=checkpoint, project=project, defaults={"created_by_id": user.pk}
            )[0]
            for project in dict.fromkeys(wanted)
        ]


def permissions_of(
    *, user: User, name: str, project_id: str | None = None, descending: bool = False
) -> list[CheckpointPermission]:
    _, checkpoint = checkpoint_named(user=user, name=name)
    found = CheckpointPermission.objects.filter(checkpoint=checkpoint)
    if project_id:
        found = found.filter(project_id=int(project_id) if project_id.isdigit() else -1)
    ordered = found.order_by("-created_at", "-id") if descending else found.order_by("created_at", "id")
    return list(ordered)


def permission_delete(*, user: User, name: str, permission_id: str) -> str:
    _, checkpoint = checkpoint_named(user=user, name=name)
    deleted, _ = CheckpointPermission.objects.filter(checkpoint=checkpoint, pk=permission_id).delete()
    if not deleted:
        raise ApiError(
            404, f"no permission {permission_id!r} on this checkpoint", "permission_id", "not_found"
        )
    return permission_id

"""Flywheel's records in OpenAI's object shapes (`file`, `fine_tuning.job`, its events and
checkpoints), with Flywheel's own facts beside them under `flywheel`."""

from datetime import datetime
from typing import Any

from finetuning import selectors
from finetuning.models import CheckpointPermission, FineTuningFile, FineTuningJob
from runs.models import Checkpoint, Run

S = Run.Status
# A run's status in OpenAI's values; a job being cancelled reads cancelled at once, as OpenAI's does.
OPENAI_STATUS = {
    S.QUEUED: "queued",
    S.STARTING: "queued",
    S.RUNNING: "running",
    S.PAUSING: "running",
    S.PAUSED: "paused",
    S.CANCELLING: "cancelled",
    S.CANCELLED: "cancelled",
    S.SUCCEEDED: "succeeded",
    S.FAILED: "failed",
}


def seconds(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp())


def file_object(file: FineTuningFile) -> dict[str, Any]:
    return {
        "id": file.id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": seconds(file.created_at),
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def job_object(job: FineTuningJob) -> dict[str, Any]:
    run = job.run
    method = job.method["type"]
    hyperparameters = (job.method.get(method) or {}).get("hyperparameters") or {}
    if run is None:  # validating its files, or failed or cancelled before its run
        status, error, finished_at = job.status, job.error, job.finished_at
    else:
        status, error, finished_at = OPENAI_STATUS[S(run.status)], _run_error(run), run.finished_at
    return {
        "id": job.id,
        "object": "fine_tuning.job",
        "created_at": seconds(job.created_at),
        "error": error,
        "fine_tuned_model": job.fine_tuned_model if status == "succeeded" else None,
        "finished_at": seconds(finished_at) if status in ("succeeded", "failed", "cancelled") else None,
        "hyperparameters": {
            name: hyperparameters.get(name, "auto")
            for name in ("batch_size", "learning_rate_multiplier", "n_epochs")
        },
        "model": job.model,
        "organization_id": f"project-{job.project_id}",
        "result_files": [job.result_file_id] if job.result_file_id else [],
        "seed": job.seed,
        "status": status,
        "trained_tokens": selectors.job_trained_tokens(job),
        "training_file": job.training_file,
        "validation_file": job.validation_file or None,
        "estimated_finish": seconds(selectors.job_estimated_finish(job)),
        "integrations": [],
        "metadata": job.metadata or None,
        "method": job.method,
        "user_provided_suffix": job.suffix or None,
        "flywheel": {
            "run": run.pk if run else None,
            "status": run.status if run else None,
            "url": f"/runs/{run.pk}/" if run else None,
            "task_set_version": job.task_set_version_id,
            "resolved_hyperparameters": run.resolved if run else None,
            "max_steps": run.max_steps if run else None,
            "learner_step": run.learner_step if run else None,
        },
    }


def _run_error(run: Run) -> dict[str, Any] | None:
    """A failed run's error. Flywheel says where it failed (learner, rollout, ...): part of the
    message, since OpenAI's param names a request parameter and none was at fault."""
    if run.status != S.FAILED:
        return None
    failure = run.error or {}
    where = f" (in the {failure['where']})" if failure.get("where") else ""
    return {"code": "training_failed", "message": f"{failure.get('message', 'failed')}{where}", "param": None}


def event_object(event: selectors.JobEvent) -> dict[str, Any]:
    return {
        "id": event.id,
        "object": "fine_tuning.job.event",
        "created_at": seconds(event.created_at),
        "level": event.level,
        "message": event.message,
        "type": event.type,
        "data": event.data,
    }


def checkpoint_object(
    job: FineTuningJob, checkpoint: Checkpoint, metrics: dict[str, float]
) -> dict[str, Any]:
    return {
        "id": f"ftckpt-{checkpoint.pk}",
        "object": "fine_tuning.job.checkpoint",
        "created_at": seconds(checkpoint.created_at),
        "fine_tuned_model_checkpoint": f"{job.fine_tuned_model}:ckpt-step-{checkpoint.step}",
        "fine_tuning_job_id": job.id,
        "metrics": selectors.openai_metrics(checkpoint.step, metrics),
        "step_number": checkpoint.step,
    }


def permission_object(permission: CheckpointPermission) -> dict[str, Any]:
    return {
        "id": permission.id,
        "object": "checkpoint.permission",
        "created_at": seconds(permission.created_at),
        "project_id": str(permission.project_id),
    }

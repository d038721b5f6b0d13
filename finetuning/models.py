"""OpenAI's fine-tuning objects over Flywheel's: a file is kept byte for byte as uploaded; a job is
a run (its status, events, metrics and checkpoints are the run's), with the OpenAI request kept as
it was sent so that the job reads back the way the client wrote it. Until its files are validated
(a Celery task, `finetuning.tasks`) a job has no run: its own status, error and events say where
it stands."""

import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

from projects.models import Project, TaskSetVersion
from runs.models import Checkpoint, Run


def file_id() -> str:
    return "file-" + secrets.token_hex(12)


def job_id() -> str:
    return "ftjob-" + secrets.token_hex(12)


class FineTuningFile(models.Model):
    class Purpose(models.TextChoices):
        FINE_TUNE = "fine-tune"
        RESULTS = "fine-tune-results"

    id = models.CharField(primary_key=True, max_length=40, default=file_id, editable=False)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="fine_tuning_files")
    filename = models.CharField(max_length=255)
    purpose = models.CharField(max_length=24, choices=Purpose.choices)
    bytes = models.PositiveBigIntegerField()
    content = models.FileField(upload_to="finetuning/files/")
    line_format = models.CharField(max_length=16, blank=True, help_text="chat or preference, as uploaded")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.id} ({self.filename})"


class FineTuningJob(models.Model):
    class Status(models.TextChoices):
        """Where a job stands before it is a run; once `launched`, its run's status is its own."""

        VALIDATING_FILES = "validating_files"
        LAUNCHED = "launched"
        FAILED = "failed"
        CANCELLED = "cancelled"

    id = models.CharField(primary_key=True, max_length=40, default=job_id, editable=False)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="fine_tuning_jobs")
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.VALIDATING_FILES)
    # Null until the files are validated and the run is launched (never, when they fail).
    run = models.OneToOneField(
        Run, null=True, blank=True, on_delete=models.CASCADE, related_name="fine_tuning_job"
    )
    error = models.JSONField(
        null=True,
        blank=True,
        help_text="OpenAI's error object (code, message, param), when it failed before its run",
    )
    finished_at = models.DateTimeField(
        null=True, blank=True, help_text="When it failed or was cancelled before its run"
    )
    model = models.CharField(max_length=300, help_text="As the request named it")
    # File ids, not keys: a file may be deleted after a job used it (its lines live on in the
    # task set version, whose source_name names the file).
    training_file = models.CharField(max_length=40)
    validation_file = models.CharField(max_length=40, blank=True)
    task_set_version = models.ForeignKey(
        TaskSetVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    suffix = models.CharField(max_length=64, blank=True)
    seed = models.BigIntegerField()
    metadata = models.JSONField(default=dict, blank=True)
    method = models.JSONField(help_text="OpenAI's method object, as sent")
    fine_tuned_model = models.CharField(max_length=500, unique=True)
    result_file = models.OneToOneField(
        FineTuningFile, null=True, blank=True, on_delete=models.SET_NULL, related_name="results_of"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.id


class FineTuningJobEvent(models.Model):
    """What happened to a job before (and as) it became a run: its files validated or refused, a
    cancel while validating. The run's own events follow."""

    job = models.ForeignKey(FineTuningJob, on_delete=models.CASCADE, related_name="events")
    level = models.CharField(max_length=8, default="info")
    message = models.TextField()
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.job_id}: {self.message[:60]}"


def permission_id() -> str:
    return f"cp_{secrets.token_hex(12)}"


class CheckpointPermission(models.Model):
    """Another project's use of a job's checkpoint (OpenAI's `checkpoint.permission`): its members
    may then sample it on /v1 by the checkpoint's name, as they do their own models."""

    id = models.CharField(primary_key=True, max_length=40, default=permission_id, editable=False)
    job = models.ForeignKey(FineTuningJob, on_delete=models.CASCADE, related_name="checkpoint_permissions")
    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["checkpoint", "project"], name="one_permission_per_project")
        ]

    def __str__(self) -> str:
        return f"{self.id}: checkpoint {self.checkpoint_id} for project {self.project_id}"

"""Writes for OpenAI's fine-tuning API, in two modules: `finetuning.files` (uploads kept as sent,
checked line by line) and `finetuning.jobs` (jobs created `validating_files`, launched as Flywheel
runs by a task once their files validate, paused, resumed and cancelled, and their result files).
What goes wrong is a `finetuning.errors.ApiError`."""

from finetuning.errors import ApiError
from finetuning.files import file_bytes, file_delete, file_upload
from finetuning.jobs import (
    job_cancel,
    job_create,
    job_launch,
    job_pause,
    job_results_ensure,
    job_resume,
)

__all__ = [
    "ApiError",
    "file_bytes",
    "file_delete",
    "file_upload",
    "job_cancel",
    "job_create",
    "job_launch",
    "job_pause",
    "job_results_ensure",
    "job_resume",
]

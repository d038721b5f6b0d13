"""OpenAI's fine-tuning API, included at /v1/ before the inference routes (finetuning/api.py)."""

from django.urls import path, re_path

from finetuning import api

ID = r"(?P<{}>[A-Za-z0-9_-]{{1,40}})"

urlpatterns = [
    path("fine_tuning/alpha/graders/validate", api.grader_validate, name="openai-graders-validate"),
    path("fine_tuning/alpha/graders/run", api.grader_run, name="openai-graders-run"),
    path("files", api.files, name="openai-files"),
    re_path(rf"^files/{ID.format('file_id')}$", api.file_detail, name="openai-file"),
    re_path(rf"^files/{ID.format('file_id')}/content$", api.file_content, name="openai-file-content"),
    path("fine_tuning/jobs", api.jobs, name="openai-fine-tuning-jobs"),
    re_path(rf"^fine_tuning/jobs/{ID.format('job_id')}$", api.job_detail, name="openai-fine-tuning-job"),
    re_path(
        rf"^fine_tuning/jobs/{ID.format('job_id')}/cancel$", api.job_cancel, name="openai-fine-tuning-cancel"
    ),
    re_path(
        rf"^fine_tuning/jobs/{ID.format('job_id')}/pause$", api.job_pause, name="openai-fine-tuning-pause"
    ),
    re_path(
        rf"^fine_tuning/jobs/{ID.format('job_id')}/resume$", api.job_resume, name="openai-fine-tuning-resume"
    ),
    re_path(
        rf"^fine_tuning/jobs/{ID.format('job_id')}/events$", api.job_events, name="openai-fine-tuning-events"
    ),
    re_path(
        rf"^fine_tuning/jobs/{ID.format('job_id')}/checkpoints$",
        api.job_checkpoints,
        name="openai-fine-tuning-checkpoints",
    ),
    re_path(
        r"^fine_tuning/checkpoints/(?P<checkpoint>ft:[^/]{1,500})/permissions$",
        api.checkpoint_permissions,
        name="openai-checkpoint-permissions",
    ),
    re_path(
        rf"^fine_tuning/checkpoints/(?P<checkpoint>ft:[^/]{{1,500}})/permissions/{ID.format('permission_id')}$",
        api.checkpoint_permission,
        name="openai-checkpoint-permission",
    ),
]

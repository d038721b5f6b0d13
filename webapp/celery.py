"""The Celery app. Workers listen on the rollout, learner and eval queues."""

import os

from celery import Celery
from celery.signals import worker_init, worker_process_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("flywheel")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
@worker_process_init.connect
def limit_torch_threads(**kwargs) -> None:
    """Several workers and learners share a host's cores: oversubscribed BLAS threads slow them all."""
    from django.conf import settings

    if settings.FLYWHEEL_TORCH_THREADS > 0:
        import torch

        torch.set_num_threads(settings.FLYWHEEL_TORCH_THREADS)

"""The Celery app. Workers listen on the rollout, learner and eval queues."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("flywheel")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

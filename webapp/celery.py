"""The Celery app. Workers listen on the rollout, learner and eval queues."""

import os

from celery import Celery
from celery.signals import worker_init, worker_process_init, worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("flywheel")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

SAMPLING_QUEUES = ("rollout", "eval")  # their workers load policies and run sandboxes


def consumes(*queues: str) -> bool:
    """Whether this worker consumes any of `queues` (known from worker_init on: -Q is applied first)."""
    return bool(set(queues) & set(app.amqp.queues.consume_from or {}))


@worker_init.connect
@worker_process_init.connect
def limit_torch_threads(**kwargs) -> None:
    """Several workers and learners share a host's cores: oversubscribed BLAS threads slow them all."""
    from django.conf import settings

    if settings.FLYWHEEL_TORCH_THREADS > 0:
        import torch

        torch.set_num_threads(settings.FLYWHEEL_TORCH_THREADS)


@worker_init.connect
def generation_modules_load(**kwargs) -> None:
    """A worker that samples from policies (rollout, eval) imports transformers and its own sampling
    code before its pool forks: ~3 s its first batch would otherwise wait, paid once per host and
    shared by the pool's processes. (Sent after the worker has chosen its queues.)"""
    if consumes(*SAMPLING_QUEUES):
        from inference.policy import policy_modules_load

        policy_modules_load()
        import workers.run_eval  # noqa: F401
        import workers.run_rollout  # noqa: F401


@worker_process_init.connect
def learner_spare_load(**kwargs) -> None:
    """A worker process that supervises learners loads a spare learner at once: even its first
    run's learner starts loaded. (Sent in each pool process, and in a solo worker's own.)"""
    from django.conf import settings

    if settings.FLYWHEEL_LEARNER_SPARE and consumes("learner"):
        from workers.supervisor import learner_spare_refill

        learner_spare_refill()


@worker_ready.connect
def sandbox_check_start(sender, **kwargs) -> None:
    """A worker that runs sandboxes (rollout, eval) checks them once it is ready, in a process of its
    own (nothing forks from a thread here), and /healthz shows what it found under its name."""
    import subprocess
    import sys
    import threading

    from django.conf import settings

    if not (settings.FLYWHEEL_SANDBOX_WORKER_CHECK and consumes(*SAMPLING_QUEUES)):
        return
    manage = str(settings.BASE_DIR / "manage.py")
    argv = [sys.executable, manage, "check_sandboxes", "--record", sender.hostname]
    # Its stderr is the worker's: a failing check says why in the worker's log too.
    check = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    threading.Thread(target=check.wait, name="sandbox-check-reaper", daemon=True).start()

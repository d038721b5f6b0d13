"""The Celery app. Workers listen on the rollout, learner, eval and control queues."""

import os
import time

from celery import Celery
from celery.signals import (
    before_task_publish,
    task_failure,
    worker_init,
    worker_process_init,
    worker_ready,
    worker_shutdown,
)

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


# --- what the operations page shows (ops/heartbeats.py) ---------------------------------------

_ops_node = ""  # this worker's name, known from worker_init on (pool processes inherit it)
_ops_beat = None


@before_task_publish.connect
def sent_at_stamp(headers: dict | None = None, **kwargs) -> None:
    """When each message was sent, so the operations page can tell how long the oldest waits."""
    from ops.heartbeats import SENT_AT_HEADER

    if headers is not None:
        headers[SENT_AT_HEADER] = time.time()


@worker_init.connect
def ops_node_remember(sender, **kwargs) -> None:
    global _ops_node
    _ops_node = sender.hostname


def ops_running_tasks() -> list[dict]:
    """The tasks this worker runs now, read from Celery's own bookkeeping (in the main process:
    the pool processes report each task they take)."""
    from celery.worker.state import active_requests

    from ops.heartbeats import task_integer_args

    for _ in range(3):  # the set may change under us while a task is taken or finishes
        try:
            requests = list(active_requests)
            break
        except RuntimeError:
            continue
    else:
        requests = []
    return [
        {
            "task": request.name,
            "id": request.id,
            "args": task_integer_args(request.args),
            "since": request.time_start,
            "pid": request.worker_pid,
        }
        for request in requests
    ]


@worker_ready.connect
def ops_heartbeat_start(sender, **kwargs) -> None:
    """Beat from the worker's main process once its pool is up (no process forks from it after
    that but pool replacements, which never touch the beat's thread or its Redis connection)."""
    global _ops_beat
    from ops.heartbeats import WorkerBeat

    pool = type(sender.pool).__module__.rsplit(".", 1)[-1]
    _ops_beat = WorkerBeat(
        name=sender.hostname,
        queues=sorted(app.amqp.queues.consume_from or {}),
        concurrency=int(getattr(sender.controller, "concurrency", 0) or 0),
        pool=pool,
        tasks=ops_running_tasks,
    )
    _ops_beat.start()


@worker_shutdown.connect
def ops_heartbeat_stop(**kwargs) -> None:
    if _ops_beat is not None:
        _ops_beat.shutdown()


@worker_process_init.connect
def ops_sandbox_beat_start(sender=None, **kwargs) -> None:
    """A process that runs rollouts or evaluations reports its sandbox pool's counts."""
    if not consumes(*SAMPLING_QUEUES):
        return
    from ops.heartbeats import SandboxBeat
    from sandboxes.services import sandbox_pool_counts

    SandboxBeat(str(sender or _ops_node), sandbox_pool_counts).start()


@task_failure.connect
def ops_task_failure(sender=None, task_id: str = "", exception=None, args=None, **kwargs) -> None:
    from ops.heartbeats import task_failure_record

    worker = getattr(getattr(sender, "request", None), "hostname", None) or _ops_node
    name = getattr(sender, "name", str(sender))
    task_failure_record(worker=worker, task=name, task_id=task_id or "", args=args, exc=exception)

"""What advances a sweep between the periodic ticks: one of its trials' runs ending, or reporting
the sweep's objective (a held-out evaluation). Registered with runs.listeners in our AppConfig;
each enqueues a pass after the change commits."""

from django.db import transaction

from runs.models import Run, RunEvent
from sweeps import tasks
from sweeps.models import Sweep, SweepTrial

HELD_OUT = "heldout/"


def _advance_after_commit(sweep_id: int) -> None:
    transaction.on_commit(lambda: tasks.sweep_advance.delay(sweep_id))


def sweep_run_changed(*, run: Run, event: RunEvent, status: str) -> None:
    if status not in Run.TERMINAL:
        return
    sweep_id = SweepTrial.objects.filter(run_id=run.pk).values_list("sweep_id", flat=True).first()
    if sweep_id is not None:
        _advance_after_commit(sweep_id)


def sweep_metric_reported(*, run: Run, step: int, values: dict[str, float]) -> None:
    # On the learner's path at every step: a sweep's objective is a held-out figure, so a step's
    # training metrics are passed over without a query.
    if not any(name.startswith(HELD_OUT) for name in values):
        return
    found = (
        SweepTrial.objects.filter(
            run_id=run.pk, state=SweepTrial.State.RUNNING, sweep__status=Sweep.Status.RUNNING
        )
        .values_list("sweep_id", "sweep__metric")
        .first()
    )
    if found is not None and found[1] in values and step > 0:
        _advance_after_commit(found[0])

"""Extension points of the run layer for apps built on runs.

Apps above runs (webhooks, sweeps) register here in their AppConfig.ready, so runs imports none of
them. Listeners are called inside the transaction that wrote the event: what they write (a
webhook delivery, say) commits or rolls back with the status change or the alert.
"""

from collections.abc import Callable
from typing import Any, Protocol

from runs.models import Run, RunEvent


class StatusListener(Protocol):
    def __call__(self, *, run: Run, event: RunEvent, status: str) -> Any: ...


class MetricListener(Protocol):
    def __call__(self, *, run: Run, step: int, values: dict[str, float]) -> Any: ...


class AlertListener(Protocol):
    def __call__(self, *, run: Run, event: RunEvent, alert: dict[str, Any], done: str) -> Any: ...


# A run entered `status` (queued on launch, then every transition), its RunEvent just written.
STATUS_LISTENERS: list[StatusListener] = []
# A step's metric points were written (every learner step and every held-out evaluation): keep it
# cheap, it is on the learner's path.
METRIC_LISTENERS: list[MetricListener] = []
# A monitor raised an alert; `done` says what the run did about it ("paused", "none", ...).
ALERT_LISTENERS: list[AlertListener] = []


def listener_add(registry: list[Any], listener: Callable[..., Any]) -> None:
    """Register once: ready() may run more than once in tests."""
    if listener not in registry:
        registry.append(listener)


def status_changed(*, run: Run, event: RunEvent, status: str) -> None:
    for listener in STATUS_LISTENERS:
        listener(run=run, event=event, status=status)


def metrics_written(*, run: Run, step: int, values: dict[str, float]) -> None:
    for listener in METRIC_LISTENERS:
        listener(run=run, step=step, values=values)


def alert_raised(*, run: Run, event: RunEvent, alert: dict[str, Any], done: str) -> None:
    for listener in ALERT_LISTENERS:
        listener(run=run, event=event, alert=alert, done=done)

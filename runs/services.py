"""Writes of the runs app that are not a run's lifecycle: the demo's user and metric points. Views,
API, workers and commands call these; tiers are written through tiers/services.py."""

from django.contrib.auth.models import User
from django.db import connection, transaction
from django.utils import timezone

from core import events
from runs import listeners
from runs.models import MetricPoint, Run

IMPORT_BATCH_SIZE = 2000
PREVIEW_ITEMS = 5
DEFAULT_SPLIT_SEED = 0
DEFAULT_HELDOUT_FRACTION = 0.2


# --- demo ----------------------------------------------------------------------------------


def demo_user_ensure(*, username: str, password: str) -> User:
    user, _ = User.objects.get_or_create(username=username)
    if not user.check_password(password):
        user.set_password(password)
        user.save(update_fields=["password"])
    return user


# --- metric points -------------------------------------------------------------------------


def metrics_write(run: Run, step: int, values: dict[str, float]) -> None:
    """A step's metrics in one statement and one transaction, then the live viewers told after
    commit. Every learner step and evaluation writes here: building a model instance per point
    cost the ORM two thirds of this call (0.87 ms against 0.29 ms for 20 points, bench-live)."""
    created_at = connection.ops.adapt_datetimefield_value(timezone.now())
    rows = [(run.pk, name, step, float(value), created_at) for name, value in values.items()]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.executemany(_metric_insert(), rows)
        events.run_event(run.pk, "metrics", {"step": step, "values": values})
        listeners.metrics_written(run=run, step=step, values=values)


def _metric_insert() -> str:
    quote, meta = connection.ops.quote_name, MetricPoint._meta
    # Every concrete field has a column; the stubs type it optional for the relations that have none.
    column_of = {field.name: field.column for field in meta.concrete_fields if field.column}
    columns = [quote(column_of[name]) for name in ("run", "name", "step", "value", "created_at")]
    return f"INSERT INTO {quote(meta.db_table)} ({', '.join(columns)}) VALUES ({', '.join(['%s'] * 5)})"

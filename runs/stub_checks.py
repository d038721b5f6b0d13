"""The stub check of a task set version: each code item's tests run against a stub of the solution
(one that does nothing, one that raises), and the tests a stub passes stored with the item, where
graders read them (they pay nothing), and pages, REST and `verify` show them.

It runs after the version commits, in a Celery task on the eval queue (the task beside this,
runs/tasks.py, sent by name), so an import never waits on sandboxes; `import_tasks` runs it itself with a
progress bar. It only fills items not checked yet, so a second delivery, or a check run while
another is running, redoes nothing that is done.
"""

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import timedelta

from celery import current_app
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from kombu.exceptions import OperationalError

from rewards.graders.sandboxed import STUB_NOTE, stub_check
from rewards.references import ReferenceReport, references_verify
from runs.models import TaskItem, TaskSetVersion
from runs.models.library import StubCheckStatus
from sandboxes.interface import InfrastructureError

logger = logging.getLogger(__name__)
# A check still queued this long after its version was made is sent again (its message was lost,
# or the broker was down when the version committed); a second delivery redoes nothing.
STUB_CHECK_RESEND_AFTER = timedelta(minutes=5)

STUB_CHECK_TASK = "workers.eval.stub_check"
STUB_BATCH = 50  # items whose results are written, and whose progress is shown, together
MAX_WARNINGS_KEPT = 200  # on the version, for pages and REST; the command prints them all


@dataclass(frozen=True)
class StubWarning:
    """An item whose every test a stub passes: it can only ever pay 0."""

    item: str
    line: int | None

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line else "an item"
        return f"{where} ({self.item}): a stub passes every test, so this item can only ever pay 0"

    def as_dict(self) -> dict:
        return {"item": self.item, "line": self.line, "message": str(self)}


def stubbed_items(version: TaskSetVersion):
    return version.items.filter(kind=TaskItem.Kind.CODE)


def version_stub_check_queue(*, version: TaskSetVersion, enqueue: bool = True) -> None:
    """Mark a new version's stub check queued (when it has code items), and, unless the caller
    runs it itself, enqueue it once the version commits."""
    total = stubbed_items(version).count()
    if not total:
        return
    TaskSetVersion.all_objects.filter(pk=version.pk).update(
        stub_check_status=StubCheckStatus.QUEUED, stub_check_done=0, stub_check_total=total
    )
    version.stub_check_status, version.stub_check_done, version.stub_check_total = (
        StubCheckStatus.QUEUED,
        0,
        total,
    )
    if enqueue:
        transaction.on_commit(lambda: enqueue_check(version.pk))


def enqueue_check(version_id: int) -> None:
    # By name (runs/tasks.py `version_stub_check`): importing the task module here would join the
    # import service, whose task modules reach the workers, into one import cycle with them.
    try:
        current_app.send_task(STUB_CHECK_TASK, args=[version_id])
    except OperationalError as exc:
        # The version is committed either way: an import never fails for want of a broker (as
        # when `make up` seeds the demo before Redis starts). The scheduler's tick sends it later.
        logger.warning("stub check of task-set version %s not queued yet: %s", version_id, exc)


def stub_checks_resend() -> list[int]:
    """Send again the checks still queued well after their version was made (the scheduler's tick)."""
    stale = TaskSetVersion.all_objects.filter(
        stub_check_status=StubCheckStatus.QUEUED,
        created_at__lt=timezone.now() - STUB_CHECK_RESEND_AFTER,
    ).values_list("pk", flat=True)
    resent = list(stale[:100])
    for version_id in resent:
        enqueue_check(version_id)
    return resent


def version_stub_check_run(
    *,
    version_id: int,
    pool=None,
    progress: Callable[[int], None] | None = None,
    max_workers: int | None = None,
) -> list[StubWarning]:
    """Check the version's code items not checked yet, a batch of results written at a time; the
    warnings of the whole version (items whose every test a stub passes). `progress` gets the
    number of items just done. A sandbox that fails leaves its item unchecked (graders then check
    it themselves) and the check goes on."""
    version = TaskSetVersion.all_objects.filter(pk=version_id).first()
    if version is None:
        return []
    todo = list(stubbed_items(version).filter(stub_check__isnull=True).order_by("position"))
    total = stubbed_items(version).count()
    todo = _reuse_earlier_checks(version, todo, progress)
    TaskSetVersion.all_objects.filter(pk=version_id).update(
        stub_check_status=StubCheckStatus.RUNNING, stub_check_total=total
    )
    if todo:
        if pool is None:
            from sandboxes.services import sandbox_pool

            pool = sandbox_pool()
        workers = max(1, min(max_workers or pool.max_sandboxes, len(todo)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stub-check") as executor:
            futures = [executor.submit(_check_one, item, pool) for item in todo]
            done: list[tuple[TaskItem, dict | None]] = []
            for future in as_completed(futures):
                done.append(future.result())
                if len(done) >= STUB_BATCH:
                    _store(version_id, done, progress)
                    done = []
            _store(version_id, done, progress)
    warnings, no_credit = _findings(version)
    TaskSetVersion.all_objects.filter(pk=version_id).update(
        stub_check_status=StubCheckStatus.DONE,
        stub_check_done=total,
        stub_check_no_credit=no_credit,
        stub_check_warnings=[warning.as_dict() for warning in warnings[:MAX_WARNINGS_KEPT]],
    )
    return warnings


def _reuse_earlier_checks(version: TaskSetVersion, todo: list[TaskItem], progress) -> list[TaskItem]:
    """Copy the check of the same item (same id, same data) from an earlier version of the set (a
    re-split, a file that adds a few items); returns the items still to check."""
    known: dict[str, list[TaskItem]] = {}
    ids = [item.external_id for item in todo]
    for start in range(0, len(ids), 2000):  # bounded IN lists (SQLite caps a query's parameters)
        earlier = (
            TaskItem.objects.filter(
                version__task_set_id=version.task_set_id,
                external_id__in=ids[start : start + 2000],
                stub_check__isnull=False,
            )
            .exclude(version_id=version.pk)
            .order_by("-version_id")
            .only("external_id", "data", "stub_check")
        )
        for item in earlier:
            known.setdefault(item.external_id, []).append(item)
    reused, left = [], []
    for item in todo:
        match = next((other for other in known.get(item.external_id, ()) if other.data == item.data), None)
        (reused if match else left).append((item, match.stub_check) if match else item)
    for start in range(0, len(reused), STUB_BATCH):
        _store(version.pk, reused[start : start + STUB_BATCH], progress)
    return left


def _check_one(item: TaskItem, pool) -> tuple[TaskItem, dict | None]:
    try:
        return item, stub_check(item.grading_dict(), pool)
    except InfrastructureError as exc:
        return item, {"unchecked": f"the sandbox failed: {exc}"[:2000]}


def _store(version_id: int, done: list[tuple[TaskItem, dict | None]], progress) -> None:
    # An item that is not stubbed (no tests) is marked so with an empty check; one whose
    # sandbox failed is left unchecked (NULL), for graders to check themselves and a later run.
    checked = [item for item, result in done if result is None or "unchecked" not in result]
    for item, result in done:
        item.stub_check = result or {}
    with transaction.atomic():
        TaskItem.objects.bulk_update(checked, ["stub_check"])
        done_before = F("stub_check_done")
        TaskSetVersion.all_objects.filter(pk=version_id).update(stub_check_done=done_before + len(done))
    if progress is not None and done:
        progress(len(done))


def _findings(version: TaskSetVersion) -> tuple[list[StubWarning], int]:
    """(items whose every test a stub passes, in file order; how many items have a test one passes)."""
    items = stubbed_items(version).filter(stub_check__isnull=False).order_by("position")
    warnings, no_credit = [], 0
    for item in items.only("external_id", "line", "stub_check").iterator(chunk_size=2000):
        no_credit += bool(item.no_credit_tests)
        if item.stub_passes_every_test:
            warnings.append(StubWarning(item.external_id, item.line))
    return warnings, no_credit


def stub_check_summary(*, version: TaskSetVersion) -> dict:
    """The version's stub check as pages and REST show it (read from the version: no item scan)."""
    return {
        "status": version.stub_check_status or "none",
        "done": version.stub_check_done,
        "total": version.stub_check_total,
        "items_with_no_credit_tests": version.stub_check_no_credit,
        "warnings": version.stub_check_warnings,
        "note": STUB_NOTE,
    }


def version_verify(
    *, version: TaskSetVersion, pool=None, progress: Callable[[], None] | None = None
) -> ReferenceReport:
    """`verify`: the stub check of the items not checked yet (versions imported before it existed,
    or whose check is still queued), then each reference against its tests; the report names the
    tests a stub passes and the items it passes in full."""
    version_stub_check_run(version_id=version.pk, pool=pool)
    items = [item.grading_dict() for item in version.items.order_by("position")]
    return references_verify(items, pool=pool, progress=progress)

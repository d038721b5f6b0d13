"""The stub check of a task set version, as the library keeps it: each code item's tests are run
against a stub of the solution (one that does nothing, one that raises) by the graders
(rewards/stub_checks.py), and what a stub passes is stored with the item, where graders read it (they
pay nothing), and pages, REST and `verify` show it.

This side queues a new version's check after it commits (a Celery task on the eval queue, sent by
name: runs/tasks.py), sends again the checks whose message was lost, and summarises the result; an
import never waits on sandboxes.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from celery import current_app
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone
from kombu.exceptions import OperationalError

from projects.models import StubCheckStatus, TaskItem, TaskSetVersion

logger = logging.getLogger(__name__)
# A check still queued this long after its version was made is sent again (its message was lost,
# or the broker was down when the version committed); a second delivery redoes nothing.
STUB_CHECK_RESEND_AFTER = timedelta(minutes=5)

STUB_CHECK_TASK = "workers.eval.stub_check"
STUB_BATCH = 50  # items whose results are written, and whose progress is shown, together
STUB_NOTE = "no credit: a stub passes this test"
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


def stub_findings(version: TaskSetVersion) -> tuple[list[StubWarning], int]:
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


# --- verify: the stub check and each reference against its tests ----------------------------
# Running tests needs the graders, which build on the library: the rewards app registers the
# verifier when it loads (RewardsConfig.ready), so the library's pages and REST never import it.


class VerifyReport(Protocol):
    checked: int
    passed: int
    skipped: int
    errored: int
    broken: list
    stub_passes_every_test: list[str]

    def to_dict(self) -> dict: ...


VersionVerifier = Callable[..., VerifyReport]
_verifiers: list[VersionVerifier] = []


def version_verifier_register(verifier: VersionVerifier) -> None:
    _verifiers[:] = [verifier]


def version_verify(
    *, version: TaskSetVersion, pool=None, progress: Callable[[], None] | None = None
) -> VerifyReport:
    """`verify`: the stub check of the items not checked yet, then each reference against its tests
    (rewards/stub_checks.py `version_verify`)."""
    if not _verifiers:
        raise ImproperlyConfigured("no version verifier is registered: is the rewards app installed?")
    return _verifiers[0](version=version, pool=pool, progress=progress)

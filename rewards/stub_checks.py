"""Running the stub check of a task set version (projects/stub_checks.py queues it and keeps the
result): each code item's tests against two stubs of the solution, in sandboxes, and `verify`, which
also runs each reference against its tests.

It only fills items not checked yet, so a second delivery, or a check run while another is running,
redoes nothing that is done; `import_tasks` runs it itself with a progress bar.
"""

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed

from django.db import transaction
from django.db.models import F

from projects.models import StubCheckStatus, TaskItem, TaskSetVersion
from projects.stub_checks import MAX_WARNINGS_KEPT, STUB_BATCH, StubWarning, stub_findings, stubbed_items
from rewards.graders.sandboxed import stub_check
from rewards.references import ReferenceReport, references_verify
from sandboxes.interface import InfrastructureError
from sandboxes.services import sandbox_pool

logger = logging.getLogger(__name__)


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
    warnings, no_credit = stub_findings(version)
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
    reused: list[tuple[TaskItem, dict | None]] = []
    left: list[TaskItem] = []
    for item in todo:
        match = next((other for other in known.get(item.external_id, ()) if other.data == item.data), None)
        if match is not None:
            reused.append((item, match.stub_check))
        else:
            left.append(item)
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


def version_verify(
    *, version: TaskSetVersion, pool=None, progress: Callable[[], None] | None = None
) -> ReferenceReport:
    """`verify`: the stub check of the items not checked yet (versions imported before it existed,
    or whose check is still queued), then each reference against its tests; the report names the
    tests a stub passes and the items it passes in full."""
    version_stub_check_run(version_id=version.pk, pool=pool)
    items = [item.grading_dict() for item in version.items.order_by("position")]
    return references_verify(items, pool=pool, progress=progress)

"""Writes for projects, members, tokens, task sets and tiers. Views, API and commands call these."""

import hashlib
import json
import secrets
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.files import File
from django.db import IntegrityError, transaction
from django.utils import timezone

from core import events
from core.exceptions import StateError
from core.leases import process_gone, process_identity
from core.roles import Role
from core.tokens import token_digest
from projects.models import ApiToken, Membership, Project, StagedImport, TaskItem, TaskSet, TaskSetVersion
from projects.stub_checks import version_stub_check_queue
from projects.task_format import (
    IMPORT_FORMATS,
    LINE_PRESETS,
    FileFormatError,
    ItemError,
    ParsedItem,
    guess_format,
    item_line,
    read_items,
    stable_split,
)

IMPORT_BATCH_SIZE = 2000
PREVIEW_ITEMS = 5
DEFAULT_SPLIT_SEED = 0
DEFAULT_HELDOUT_FRACTION = 0.2


# --- projects and members ------------------------------------------------------------------


@transaction.atomic
def project_create(*, name: str, by: User, description: str = "") -> Project:
    if Project.objects.filter(name=name).exists():
        raise ValidationError({"name": f"a project named {name!r} already exists"})
    project = Project.objects.create(name=name, description=description, created_by=by)
    Membership.objects.create(project=project, user=by, role=Role.OWNER)
    return project


def project_update(*, project: Project, name: str | None = None, description: str | None = None) -> Project:
    if name is not None and Project.objects.filter(name=name).exclude(pk=project.pk).exists():
        raise ValidationError({"name": f"a project named {name!r} already exists"})
    project.name = project.name if name is None else name
    project.description = project.description if description is None else description
    project.save(update_fields=["name", "description"])
    return project


def project_delete(*, project: Project) -> None:
    project.delete()


@transaction.atomic
def member_add(*, project: Project, username: str, role: str) -> Membership:
    user = User.objects.filter(username=username).first()
    if user is None:
        raise ValidationError({"username": f"no user named {username!r}"})
    if role not in Role.values:
        raise ValidationError({"role": f"must be one of {', '.join(Role.values)}"})
    if Membership.objects.filter(project=project, user=user).exists():
        raise ValidationError({"username": f"{username} is already a member; change their role instead"})
    membership = Membership.objects.create(project=project, user=user, role=role)
    events.project_event(project.pk, "member.added", {"username": username, "role": role})
    return membership


@transaction.atomic
def member_set_role(*, membership: Membership, role: str) -> Membership:
    if role not in Role.values:
        raise ValidationError({"role": f"must be one of {', '.join(Role.values)}"})
    if membership.role == Role.OWNER and role != Role.OWNER:
        _ensure_another_owner(membership)
    membership.role = role
    membership.save(update_fields=["role"])
    return membership


@transaction.atomic
def member_remove(*, membership: Membership) -> None:
    if membership.role == Role.OWNER:
        _ensure_another_owner(membership)
    membership.delete()


def _ensure_another_owner(membership: Membership) -> None:
    # Lock every owner row, this one included: locking only the others let two owners demote
    # each other at once, each seeing the other still an owner, and leave the project ownerless.
    owners = Membership.objects.select_for_update().filter(project_id=membership.project_id, role=Role.OWNER)
    if not [pk for pk in owners.values_list("pk", flat=True) if pk != membership.pk]:
        raise StateError("a project needs at least one owner; make someone else owner first")


# --- API tokens ----------------------------------------------------------------------------

TOKEN_PREFIX = "fw_"


def api_token_create(
    *, user: User, name: str, default_project: Project | int | None = None
) -> tuple[ApiToken, str]:
    """Create a token and return it with its secret, which is never stored or shown again. Its
    default project (one the user is a member of) is where OpenAI-compatible calls that name no
    project act."""
    name = name.strip()
    if not name:
        raise ValidationError({"name": "give the token a name, such as the script that uses it"})
    project_id = default_project.pk if isinstance(default_project, Project) else default_project
    if project_id is not None and not Membership.objects.filter(user=user, project_id=project_id).exists():
        raise ValidationError({"default_project": f"no project {project_id} that you are a member of"})
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user, name=name, prefix=raw[:10], digest=token_digest(raw), default_project_id=project_id
    )
    return token, raw


def api_token_revoke(*, token: ApiToken) -> ApiToken:
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    token.refresh_from_db()
    return token


# --- task sets -----------------------------------------------------------------------------


def task_set_create(*, project: Project, name: str, by: User, description: str = "") -> TaskSet:
    name = name.strip()
    if not name:
        raise ValidationError({"name": "is required"})
    try:
        with transaction.atomic():
            return TaskSet.objects.create(project=project, name=name, description=description, created_by=by)
    except IntegrityError:
        raise ValidationError({"name": f"this project already has a task set named {name!r}"}) from None


def task_set_update(*, task_set: TaskSet, name: str | None = None, description: str | None = None) -> TaskSet:
    if name is not None:
        name = name.strip()
        if not name:
            raise ValidationError({"name": "is required"})
        if TaskSet.objects.filter(project_id=task_set.project_id, name=name).exclude(pk=task_set.pk).exists():
            raise ValidationError({"name": f"this project already has a task set named {name!r}"})
        task_set.name = name
    task_set.description = task_set.description if description is None else description
    task_set.save(update_fields=["name", "description"])
    return task_set


@dataclass
class ImportReport:
    """What an import found: counts, the first errors with their lines, a preview, the version."""

    item_count: int = 0
    kind_counts: dict[str, int] = field(default_factory=dict)
    split_counts: dict[str, int] = field(default_factory=dict)
    errors: list[ItemError] = field(default_factory=list)
    error_count: int = 0
    preview: list[ParsedItem] = field(default_factory=list)
    version: TaskSetVersion | None = None
    created: bool = False
    content_hash: str = ""

    @property
    def ok(self) -> bool:
        return self.error_count == 0

    def add_error(self, error: ItemError) -> None:
        self.error_count += 1
        if len(self.errors) < settings.FLYWHEEL_IMPORT_MAX_ERRORS:
            self.errors.append(error)


def _split_defaults(task_set: TaskSet) -> tuple[int, float]:
    latest = task_set.versions.first()
    if latest is None:
        return DEFAULT_SPLIT_SEED, DEFAULT_HELDOUT_FRACTION
    return latest.split_seed, latest.heldout_fraction


def _check_split_settings(seed: int, heldout_fraction: float) -> None:
    if not 0 <= heldout_fraction <= 1:
        raise ValidationError({"heldout_fraction": "must be between 0 and 1"})
    if not -(2**63) <= seed < 2**63:
        raise ValidationError({"split_seed": "must fit in 64 bits"})


def task_set_import(
    *,
    task_set: TaskSet,
    stream: Iterable[bytes],
    file_format: str,
    by: User,
    source_name: str = "",
    split_seed: int | None = None,
    heldout_fraction: float | None = None,
    dry_run: bool = False,
    preset: str = "auto",
    stub_check_enqueue: bool = True,
) -> ImportReport:
    """Stream a JSONL or CSV file into a new version; all of it or, on any error, none of it.

    A new version with code items has its stub check queued (projects/stub_checks.py), enqueued after
    it commits unless `stub_check_enqueue` is False (the caller runs it itself).

    `preset` says how JSONL lines are read (`task_format.validate_item`): auto, flywheel, or one
    published format (humaneval, mbpp, apps, codecontests, livecodebench) for every line.

    The items go in under a draft version, a short transaction per batch (other writers, and on
    SQLite every writer, get their turn between batches), and the draft is published in one
    short transaction at the end; a failed import deletes its draft, and drafts whose import
    died are swept (`task_set_drafts_sweep`). Identical content (same items, same splits) as
    the latest version creates no new version.
    """
    _check_format(file_format, preset)
    default_seed, default_fraction = _split_defaults(task_set)
    seed = default_seed if split_seed is None else split_seed
    fraction = default_fraction if heldout_fraction is None else heldout_fraction
    _check_split_settings(seed, fraction)
    task_set_drafts_sweep(task_set=task_set)
    report = ImportReport()
    draft = None if dry_run else _draft_create(task_set, seed, fraction, source_name, by)
    try:
        try:
            items = read_items(stream, file_format, preset)
            _store_items(report, draft, items, seed=seed, fraction=fraction)
        except FileFormatError as exc:
            report.add_error(exc.error)
        if report.ok and report.item_count == 0:
            report.add_error(ItemError(0, None, "the file holds no items"))
        if draft is None or not report.ok:  # no draft: a dry run
            return report
        _draft_publish(task_set, draft, report, stub_check_enqueue)
    finally:
        if draft is not None and report.version != draft:
            _draft_discard(draft.pk)
    if report.created:
        events.project_event(
            task_set.project_id,
            "task_set.version_created",
            {"task_set": task_set.pk, "version": draft.number, "items": draft.item_count},
        )
    return report


def _check_format(file_format: str, preset: str) -> None:
    if file_format not in ("jsonl", "csv"):
        raise ValidationError({"format": "must be jsonl or csv"})
    if preset not in LINE_PRESETS:
        raise ValidationError({"format": f"must be one of {', '.join(IMPORT_FORMATS)}; got {preset!r}"})


def task_set_create_with_import(
    *,
    project: Project,
    name: str,
    by: User,
    open_stream: Callable[[], Iterable[bytes]],
    file_format: str,
    preset: str = "auto",
    description: str = "",
    dry_run: bool = False,
    **options: Any,
) -> tuple[TaskSet | None, ImportReport]:
    """A new task set holding the file as its first version, or, on any error, no task set at all.
    Every path that creates a set from a file (the page, REST, the client, `import_tasks`) comes here.

    The file is read twice: validated before the set exists (a bad line, a taken name, bad split
    settings create nothing), then imported; a set whose import fails even so (a store error, an
    interruption) is deleted again. `dry_run`: the validation only; nothing is created.
    """
    _check_format(file_format, preset)
    name = name.strip()
    if not name:
        raise ValidationError({"name": "is required"})
    if TaskSet.objects.filter(project=project, name=name).exists():
        raise ValidationError({"name": f"this project already has a task set named {name!r}"})
    seed = DEFAULT_SPLIT_SEED if options.get("split_seed") is None else options["split_seed"]
    fraction = (
        DEFAULT_HELDOUT_FRACTION if options.get("heldout_fraction") is None else options["heldout_fraction"]
    )
    _check_split_settings(seed, fraction)
    check = ImportReport()
    try:
        items = read_items(open_stream(), file_format, preset)
        _store_items(check, None, items, seed=seed, fraction=fraction)
    except FileFormatError as exc:
        check.add_error(exc.error)
    if check.ok and check.item_count == 0:
        check.add_error(ItemError(0, None, "the file holds no items"))
    if dry_run or not check.ok:
        return None, check
    task_set = task_set_create(project=project, name=name, by=by, description=description)
    report = None
    try:
        report = task_set_import(
            task_set=task_set, stream=open_stream(), file_format=file_format, by=by, preset=preset, **options
        )
    finally:
        if report is None or not report.ok:
            task_set.delete()  # its versions and items go with it
    return (task_set if report.ok else None), report


def _draft_create(
    task_set: TaskSet, seed: int, fraction: float, source_name: str, by: User
) -> TaskSetVersion:
    return TaskSetVersion.all_objects.create(
        task_set=task_set,
        number=None,
        published=False,
        draft_owner=process_identity(),
        content_hash="",
        item_count=0,
        split_seed=seed,
        heldout_fraction=fraction,
        source_name=source_name[:255],
        created_by=by,
    )


@transaction.atomic
def _draft_publish(
    task_set: TaskSet, draft: TaskSetVersion, report: ImportReport, stub_check_enqueue: bool = True
) -> None:
    """Number and publish the draft, unless the latest version has the same content."""
    locked = TaskSet.objects.select_for_update().get(pk=task_set.pk)
    latest = locked.versions.first()
    if latest is not None and latest.content_hash == report.content_hash:
        report.version = latest
        return
    last_number = latest.number if latest else 0
    assert last_number is not None  # a published version has its number
    draft.number = last_number + 1
    draft.published, draft.draft_owner, draft.created_at = True, "", timezone.now()
    draft.content_hash = report.content_hash
    draft.item_count = report.item_count
    draft.kind_counts = report.kind_counts
    draft.split_counts = report.split_counts
    draft.save()
    report.version, report.created = draft, True
    version_stub_check_queue(version=draft, enqueue=stub_check_enqueue)


def _draft_discard(draft_id: int) -> None:
    """Delete a draft and its items, a batch per transaction."""
    items = TaskItem.objects.filter(version_id=draft_id)
    while batch := list(items.values_list("pk", flat=True)[:IMPORT_BATCH_SIZE]):
        TaskItem.objects.filter(pk__in=batch).delete()
    TaskSetVersion.all_objects.filter(pk=draft_id, published=False).delete()


DRAFT_MAX_AGE = timedelta(hours=6)


def task_set_drafts_sweep(*, task_set: TaskSet | None = None) -> int:
    """Delete the drafts of imports that died: their process is gone from this host, or they are
    older than any import takes. Returns how many. (Each import sweeps its task set first, and
    the scheduler's tick sweeps them all.)"""
    drafts = TaskSetVersion.all_objects.filter(published=False)
    if task_set is not None:
        drafts = drafts.filter(task_set=task_set)
    old = timezone.now() - DRAFT_MAX_AGE
    dead = [
        pk
        for pk, owner, created in drafts.values_list("pk", "draft_owner", "created_at")
        if created < old or process_gone(owner)
    ]
    for pk in dead:
        _draft_discard(pk)
    return len(dead)


def _store_items(
    report: ImportReport,
    version: TaskSetVersion | None,
    items: Iterable[tuple[ParsedItem | None, list[ItemError]]],
    *,
    seed: int,
    fraction: float,
) -> None:
    hasher = hashlib.sha256()
    first_line_of: dict[str, int] = {}
    kinds: Counter[str] = Counter()
    splits: Counter[str] = Counter()
    batch: list[TaskItem] = []
    now = timezone.now()
    for item, errors in items:
        for error in errors:
            report.add_error(error)
        if item is None:
            continue
        if (first_line := first_line_of.get(item.external_id)) is not None:
            message = f"duplicate id {item.external_id!r}; first used on line {first_line}"
            report.add_error(ItemError(item.line, "id", message))
            continue
        first_line_of[item.external_id] = item.line
        split = item.split or stable_split(item.external_id, seed=seed, heldout_fraction=fraction)
        hasher.update(item_line(item.external_id, item.kind, split, item.data).encode())
        kinds[item.kind] += 1
        splits[split] += 1
        if len(report.preview) < PREVIEW_ITEMS:
            item.split = split
            report.preview.append(item)
        if version is not None and report.ok:
            batch.append(
                TaskItem(
                    version=version,
                    position=report.item_count,
                    external_id=item.external_id,
                    kind=item.kind,
                    split=split,
                    text=item.text,
                    data=item.data,
                    created_at=now,
                    line=item.line,
                )
            )
            if len(batch) >= IMPORT_BATCH_SIZE:
                TaskItem.objects.bulk_create(batch)
                batch.clear()
        report.item_count += 1
    if version is not None and report.ok and batch:
        TaskItem.objects.bulk_create(batch)
    report.kind_counts = dict(sorted(kinds.items()))
    report.split_counts = dict(sorted(splits.items()))
    report.content_hash = hasher.hexdigest()


STAGED_IMPORT_TTL = timedelta(hours=24)


def staged_import_create(
    *, task_set: TaskSet, by: User, upload: File, file_format: str | None = None
) -> StagedImport:
    """Keep an upload until its preview is confirmed. One pending upload per user and task set,
    and uploads nobody confirmed within a day are removed, so abandoned previews do not pile up."""
    stale = StagedImport.objects.filter(user=by, task_set=task_set) | StagedImport.objects.filter(
        created_at__lt=timezone.now() - STAGED_IMPORT_TTL
    )
    for old in stale:
        staged_import_discard(staged=old)
    assert upload.name is not None  # a form's FileField refuses a file without a name
    file_format = file_format or guess_format(upload.name)
    staged = StagedImport(
        task_set=task_set, user=by, original_name=upload.name[:255], file_format=file_format
    )
    staged.file.save(f"{uuid.uuid4().hex}.{file_format}", upload, save=False)
    staged.save()
    return staged


def staged_import_discard(*, staged: StagedImport) -> None:
    staged.file.delete(save=False)
    staged.delete()


def task_set_export_lines(*, version: TaskSetVersion) -> Iterable[str]:
    """The version as JSONL, streamed; importing it reproduces the version exactly."""
    items = version.items.order_by("position").values_list("external_id", "kind", "split", "data")
    for external_id, kind, split, data in items.iterator(chunk_size=2000):
        yield item_line(external_id, kind, split, data)


def task_set_resplit(
    *, version: TaskSetVersion, by: User, split_seed: int, heldout_fraction: float
) -> ImportReport:
    """A new version with the same items split by (seed, fraction); explicit per-item splits
    in the source are not kept, since the stored split is what the rule is asked to replace."""
    _check_split_settings(split_seed, heldout_fraction)
    lines = (_without_split(line).encode() for line in task_set_export_lines(version=version))
    return task_set_import(
        task_set=version.task_set,
        stream=lines,
        file_format="jsonl",
        by=by,
        source_name=f"v{version.number} re-split (seed {split_seed}, held-out {heldout_fraction:g})",
        split_seed=split_seed,
        heldout_fraction=heldout_fraction,
    )


def _without_split(line: str) -> str:
    item = json.loads(line)
    item.pop("split", None)
    return json.dumps(item, ensure_ascii=False) + "\n"

"""Server-rendered pages of projects, members, tokens and the task library.

Every object comes through `projects.selectors`, so a non-member gets 404 and a role without the
permission gets 403, exactly as over REST; every write goes through `projects.services`. The parts of
a project's page that other apps own come from their registered sections (projects/sections.py).
"""

import json
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.utils.text import slugify
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.callers import caller
from core.roles import Permission, Role
from core.streaming import streamed
from projects import forms, sections, selectors, services, stub_checks
from projects.models import Membership, Project, StagedImport, TaskItem, TaskSet, TaskSetVersion
from projects.selectors import page_access
from projects.task_format import resolve_format

ITEMS_PER_PAGE = 50
FILE_FIELDS = ("files", "setup_files")


# --- projects ------------------------------------------------------------------------------


@login_required
@require_GET
def project_list(request: HttpRequest) -> HttpResponse:
    user = caller(request)
    my_role = Membership.objects.filter(project=OuterRef("pk"), user=user).values("role")[:1]
    projects = list(selectors.projects_of(user=user).annotate(my_role=Subquery(my_role)).order_by("name"))
    demo_model = settings.FLYWHEEL_HOME / "models" / "tiny-base"
    context = {
        "projects": projects,
        "form": forms.ProjectForm(),
        "demo_model": str(demo_model) if demo_model.is_dir() else "",
    } | sections.home_sections(request)
    return render(request, "runs/project_list.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def project_create(request: HttpRequest) -> HttpResponse:
    user = caller(request)
    form = forms.ProjectForm(request.POST if request.method == "POST" else None)
    if form.is_bound and form.is_valid():
        try:
            project = services.project_create(by=user, **form.cleaned_data)
        except ValidationError as exc:
            forms.add_service_errors(form, exc)
        else:
            messages.success(request, f"Project {project.name} created; you are its owner.")
            return redirect("project-detail", project_id=project.pk)
    return render(request, "runs/project_form.html", {"form": form})


def _task_sets_with_latest(project: Project) -> QuerySet[TaskSet]:
    latest = TaskSetVersion.objects.filter(task_set=OuterRef("pk")).order_by("-number")
    return project.task_sets.annotate(
        latest_number=Subquery(latest.values("number")[:1]),
        latest_items=Subquery(latest.values("item_count")[:1]),
    ).order_by("name")


@login_required
@require_GET
def project_detail(request: HttpRequest, project_id: int) -> HttpResponse:
    user = caller(request)
    project = selectors.project_for(user=user, project_id=project_id)
    context = (
        page_access(user=user, project=project)
        | {
            "task_sets": _task_sets_with_latest(project),
            "memberships": selectors.memberships_of(project=project),
        }
        | sections.project_sections(request, project)
    )
    return render(request, "runs/project_detail.html", context)


# --- members -------------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def project_members(request: HttpRequest, project_id: int) -> HttpResponse:
    user = caller(request)
    permission = Permission.MANAGE if request.method == "POST" else Permission.VIEW
    project = selectors.project_for(user=user, project_id=project_id, permission=permission)
    form = forms.MemberAddForm(request.POST if request.method == "POST" else None)
    if form.is_bound and form.is_valid():
        try:
            membership = services.member_add(project=project, **form.cleaned_data)
        except ValidationError as exc:
            forms.add_service_errors(form, exc)
        else:
            messages.success(request, f"{membership.user.username} added as {membership.role}.")
            return redirect("project-members", project_id=project.pk)
    context = page_access(user=user, project=project) | {
        "memberships": selectors.memberships_of(project=project),
        "roles": Role.choices,
        "form": form,
    }
    return render(request, "runs/members.html", context)


def _member_change_done(request: HttpRequest, project_id: int) -> HttpResponse:
    # Someone who just removed themselves can no longer see the project.
    user = caller(request)
    if selectors.role_of(user=user, project_id=project_id) is None:
        return redirect("project-list")
    return redirect("project-members", project_id=project_id)


@login_required
@require_POST
def member_role(request: HttpRequest, project_id: int, user_id: int) -> HttpResponse:
    user = caller(request)
    membership = selectors.membership_for(
        user=user, project_id=project_id, user_id=user_id, permission=Permission.MANAGE
    )
    form = forms.MemberRoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Role must be one of {', '.join(Role.values)}.")
    else:
        try:
            services.member_set_role(membership=membership, role=form.cleaned_data["role"])
        except (services.StateError, ValidationError) as exc:
            messages.error(request, _message(exc))
        else:
            messages.success(request, f"{membership.user.username} is now {membership.role}.")
    return _member_change_done(request, project_id)


@login_required
@require_POST
def member_remove(request: HttpRequest, project_id: int, user_id: int) -> HttpResponse:
    user = caller(request)
    membership = selectors.membership_for(
        user=user, project_id=project_id, user_id=user_id, permission=Permission.MANAGE
    )
    try:
        services.member_remove(membership=membership)
    except services.StateError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"{membership.user.username} removed from the project.")
    return _member_change_done(request, project_id)


def _message(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(exc.messages)
    return str(exc)


# --- task sets -----------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def task_set_create(request: HttpRequest, project_id: int) -> HttpResponse:
    """A new task set with a file as its first version: both, or, on any error, neither (the
    file's errors are listed by line and field on the form again)."""
    user = caller(request)
    project = selectors.project_for(user=user, project_id=project_id, permission=Permission.EDIT)
    bound = request.method == "POST"
    form = forms.TaskSetImportCreateForm(request.POST if bound else None, request.FILES if bound else None)
    context = page_access(user=user, project=project)
    if not (form.is_bound and form.is_valid()):
        return render(request, "runs/task_set_form.html", context | {"form": form})
    data = form.cleaned_data
    upload = data["file"]
    file_format, preset = resolve_format(data["format"], upload.name)
    try:
        task_set, report = services.task_set_create_with_import(
            project=project,
            by=user,
            name=data["name"],
            description=data["description"],
            open_stream=lambda: _rewound(upload),
            file_format=file_format,
            preset=preset,
            source_name=upload.name,
            split_seed=data["split_seed"],
            heldout_fraction=data["heldout_fraction"],
        )
    except ValidationError as exc:
        forms.add_service_errors(form, exc)
        return render(request, "runs/task_set_form.html", context | {"form": form})
    if not report.ok:
        return render(request, "runs/task_set_form.html", context | {"form": form, "report": report})
    version = report.version
    assert task_set is not None and version is not None  # both made: the report is ok
    messages.success(
        request, f"Task set {task_set.name} created with {version.item_count} items as version 1."
    )
    return redirect("version-detail", task_set_id=task_set.pk, number=version.number)


def _rewound(upload):
    upload.seek(0)
    return upload  # read line by line, twice: validated, then imported


@login_required
@require_GET
def task_set_detail(request: HttpRequest, task_set_id: int) -> HttpResponse:
    user = caller(request)
    task_set = selectors.task_set_for(user=user, task_set_id=task_set_id)
    context = page_access(user=user, project=task_set.project) | {
        "task_set": task_set,
        "versions": task_set.versions.select_related("created_by"),
    }
    return render(request, "runs/task_set_detail.html", context)


# --- import: upload and preview, then confirm ----------------------------------------------


def _staged_for(user: User, task_set: TaskSet, staged_id: int) -> StagedImport:
    staged = StagedImport.objects.filter(pk=staged_id, user=user, task_set=task_set).first()
    if staged is None:
        raise Http404("no such upload; it may have been imported or cancelled already")
    return staged


def _staged_discard(staged: StagedImport) -> None:
    services.staged_import_discard(staged=staged)


def _run_import(
    staged: StagedImport, *, by: User, options: dict[str, Any], dry_run: bool
) -> services.ImportReport:
    _, preset = resolve_format(options.get("format"), staged.original_name)
    with staged.file.open("rb") as stream:
        return services.task_set_import(
            task_set=staged.task_set,
            stream=stream,
            file_format=staged.file_format,
            preset=preset,
            by=by,
            source_name=staged.original_name,
            split_seed=options.get("split_seed"),
            heldout_fraction=options.get("heldout_fraction"),
            dry_run=dry_run,
        )


@login_required
@require_http_methods(["GET", "POST"])
def task_set_import(request: HttpRequest, task_set_id: int) -> HttpResponse:
    user = caller(request)
    task_set = selectors.task_set_for(user=user, task_set_id=task_set_id, permission=Permission.EDIT)
    context = page_access(user=user, project=task_set.project) | {"task_set": task_set}
    if request.method == "GET":
        return render(request, "runs/import_form.html", context | {"form": forms.ImportForm()})
    form = forms.ImportForm(request.POST, request.FILES)
    if not form.is_valid():
        return render(request, "runs/import_form.html", context | {"form": form})
    upload = form.cleaned_data["file"]
    file_format, _ = resolve_format(form.cleaned_data["format"], upload.name)
    staged = services.staged_import_create(task_set=task_set, by=user, upload=upload, file_format=file_format)
    options = {key: form.cleaned_data[key] for key in ("split_seed", "heldout_fraction", "format")}
    try:
        report = _run_import(staged, by=user, options=options, dry_run=True)
    except ValidationError as exc:
        _staged_discard(staged)
        forms.add_service_errors(form, exc)
        return render(request, "runs/import_form.html", context | {"form": form})
    if not report.ok:
        _staged_discard(staged)  # nothing to confirm
    context |= {
        "report": report,
        "staged": staged if report.ok else None,
        "options": options,
        "split_warnings": split_warnings(report.split_counts, report.item_count, options),
    }
    return render(request, "runs/import_preview.html", context)


def split_warnings(counts: dict[str, int], total: int, options: dict) -> list[str]:
    """What a run on this split would refuse at launch, said at the preview: a split with no items.

    >>> "0 of 5 items out (held-out fraction 0.4, seed 1)" in split_warnings({"train": 5}, 5, {
    ...     "heldout_fraction": 0.4, "split_seed": 1})[0]
    True
    >>> split_warnings({"train": 3, "heldout": 2}, 5, {})
    []
    """
    if not total:
        return []
    fraction = options.get("heldout_fraction")
    how = f"held-out fraction {fraction:g}" if fraction is not None else "the file's own split fields"
    if options.get("split_seed") is not None:
        how += f", seed {options['split_seed']}"
    warnings = []
    if not counts.get("heldout"):
        warnings.append(
            f"No held-out items: this split holds 0 of {total} items out ({how}). A run evaluates on "
            "held-out items and would refuse to launch: go back and raise the held-out fraction or "
            'change the seed, or mark items "split": "heldout" in the file.'
        )
    if not counts.get("train"):
        warnings.append(
            f"No training items: every one of the {total} items is held out ({how}). A run trains on "
            "train items and would refuse to launch: lower the held-out fraction."
        )
    return warnings


@login_required
@require_POST
def import_confirm(request: HttpRequest, task_set_id: int, staged_id: int) -> HttpResponse:
    user = caller(request)
    task_set = selectors.task_set_for(user=user, task_set_id=task_set_id, permission=Permission.EDIT)
    staged = _staged_for(user, task_set, staged_id)
    options_form = forms.ImportOptionsForm(request.POST)
    if not options_form.is_valid():
        messages.error(request, "The split settings changed in between; upload the file again.")
        return redirect("task-set-import", task_set_id=task_set.pk)
    options = options_form.cleaned_data
    report = _run_import(staged, by=user, options=options, dry_run=False)
    _staged_discard(staged)
    if not report.ok:
        context = page_access(user=user, project=task_set.project) | {
            "task_set": task_set,
            "report": report,
            "staged": None,
            "options": options,
        }
        return render(request, "runs/import_preview.html", context)
    version = report.version
    assert version is not None  # an import without errors has its version (new or the latest)
    if report.created:
        messages.success(request, f"Imported {version.item_count} items as version {version.number}.")
    else:
        messages.info(request, f"The file is identical to version {version.number}; no new version created.")
    return redirect("version-detail", task_set_id=task_set.pk, number=version.number)


@login_required
@require_POST
def import_cancel(request: HttpRequest, task_set_id: int, staged_id: int) -> HttpResponse:
    user = caller(request)
    task_set = selectors.task_set_for(user=user, task_set_id=task_set_id, permission=Permission.EDIT)
    _staged_discard(_staged_for(user, task_set, staged_id))
    messages.info(request, "Upload discarded; nothing was imported.")
    return redirect("task-set-detail", task_set_id=task_set.pk)


# --- versions ------------------------------------------------------------------------------


def _item_fields(item: TaskItem) -> list[tuple[str, str]]:
    """Each field of an item as (label, text), files one by one, for the expandable row."""
    fields: list[tuple[str, str]] = []
    for name, value in item.data.items():
        if name in FILE_FIELDS and isinstance(value, dict):
            fields += [(f"{name}: {path}", str(content)) for path, content in value.items()]
        elif isinstance(value, str):
            fields.append((name, value))
        else:
            fields.append((name, json.dumps(value, indent=2, ensure_ascii=False)))
    return fields


@login_required
@require_GET
def version_detail(request: HttpRequest, task_set_id: int, number: int) -> HttpResponse:
    user = caller(request)
    version = selectors.version_for(user=user, task_set_id=task_set_id, number=number)
    query = request.GET.get("q", "").strip()
    split = request.GET.get("split", "")
    split = split if split in TaskItem.Split.values else ""
    kind = request.GET.get("kind", "")
    kind = kind if kind in TaskItem.Kind.values else ""
    items = selectors.items_of(version=version, split=split or None, kind=kind or None, query=query or None)
    page = Paginator(items, ITEMS_PER_PAGE).get_page(request.GET.get("page"))
    context = page_access(user=user, project=version.task_set.project) | {
        "task_set": version.task_set,
        "version": version,
        "stub_check": stub_checks.stub_check_summary(version=version),
        "page": page,
        "rows": [(item, _item_fields(item)) for item in page],
        "query": query,
        "split": split,
        "kind": kind,
        "splits": TaskItem.Split.choices,
        "kinds": TaskItem.Kind.choices,
        "resplit_form": forms.ResplitForm(
            initial={"split_seed": version.split_seed, "heldout_fraction": version.heldout_fraction}
        ),
    }
    return render(request, "runs/version_detail.html", context)


@login_required
@require_POST
def version_verify(request: HttpRequest, task_set_id: int, number: int) -> HttpResponse:
    """Verify references: each code item's reference solution against its own tests, in the sandbox."""
    user = caller(request)
    version = selectors.version_for(user=user, task_set_id=task_set_id, number=number)
    selectors.require(user=user, project_id=version.task_set.project_id, permission=Permission.EDIT)
    report = stub_checks.version_verify(version=version)
    if report.broken:
        named = "; ".join(f"{check.item}: {check.reason}" for check in report.broken[:20])
        more = f" (and {len(report.broken) - 20} more)" if len(report.broken) > 20 else ""
        messages.error(
            request, f"{len(report.broken)} of {report.checked} references are broken: {named}{more}"
        )
    if report.errored:
        messages.warning(request, f"{report.errored} references could not be checked (the sandbox failed)")
    if report.stub_passes_every_test:
        named = ", ".join(report.stub_passes_every_test[:20])
        messages.warning(
            request,
            f"A stub of the solution passes every test of {len(report.stub_passes_every_test)} items, "
            f"which can only ever pay 0: {named}",
        )
    if not report.broken and not report.errored:
        messages.success(
            request, f"All {report.passed} references pass their tests ({report.skipped} items have none)."
        )
    return redirect("version-detail", task_set_id=task_set_id, number=number)


@login_required
@require_GET
def version_export(request: HttpRequest, task_set_id: int, number: int) -> StreamingHttpResponse:
    user = caller(request)
    version = selectors.version_for(user=user, task_set_id=task_set_id, number=number)
    lines = services.task_set_export_lines(version=version)
    response = StreamingHttpResponse(
        streamed(request, lines), content_type="application/x-ndjson; charset=utf-8"
    )
    filename = f"{slugify(version.task_set.name) or 'task-set'}-v{version.number}.jsonl"
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@login_required
@require_POST
def version_resplit(request: HttpRequest, task_set_id: int, number: int) -> HttpResponse:
    user = caller(request)
    version = selectors.version_for(user=user, task_set_id=task_set_id, number=number)
    selectors.require(user=user, project_id=version.task_set.project_id, permission=Permission.EDIT)
    form = forms.ResplitForm(request.POST)
    if not form.is_valid():
        problems = "; ".join(f"{name}: {' '.join(map(str, errors))}" for name, errors in form.errors.items())
        messages.error(request, f"Not re-split: {problems}")
        return redirect("version-detail", task_set_id=task_set_id, number=number)
    try:
        report = services.task_set_resplit(version=version, by=user, **form.cleaned_data)
    except ValidationError as exc:
        messages.error(request, f"Not re-split: {_message(exc)}")
        return redirect("version-detail", task_set_id=task_set_id, number=number)
    if not report.ok:
        messages.error(request, f"Not re-split: {report.errors[0]}")
        return redirect("version-detail", task_set_id=task_set_id, number=number)
    resplit = report.version
    assert resplit is not None  # a re-split without errors has its version (new or the latest)
    if report.created:
        messages.success(request, f"Re-split as version {resplit.number}: {report.split_counts}.")
    else:
        messages.info(request, f"The split is identical to version {resplit.number}; no new version created.")
    return redirect("version-detail", task_set_id=task_set_id, number=resplit.number)


# --- API tokens ----------------------------------------------------------------------------


@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def token_list(request: HttpRequest) -> HttpResponse:
    user = caller(request)
    form = forms.TokenForm(request.POST if request.method == "POST" else None, user=user)
    created = raw_token = None
    if form.is_bound and form.is_valid():
        try:
            created, raw_token = services.api_token_create(
                user=user,
                name=form.cleaned_data["name"],
                default_project=form.cleaned_data["default_project"],
            )
        except ValidationError as exc:
            forms.add_service_errors(form, exc)
        else:
            form = forms.TokenForm(user=user)
    context = {
        "tokens": selectors.tokens_of(user=user),
        "form": form,
        "created": created,
        "raw_token": raw_token,  # rendered in this one response only; only its digest is stored
    }
    return render(request, "runs/tokens.html", context)


@login_required
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    user = caller(request)
    token = selectors.tokens_of(user=user).filter(pk=token_id).first()
    if token is None:
        raise Http404("no such token")
    services.api_token_revoke(token=token)
    messages.success(request, f"Token {token.name} revoked; clients using it are refused from now on.")
    return redirect("token-list")

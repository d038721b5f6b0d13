"""Reward rule pages: list, create and edit (form editor + JSON view), versions, diff, dry-run,
backtest, import from OpenAI. Every object comes through rewards.selectors, so a non-member gets 404
and a role without the permission 403, exactly as over REST; every write goes through
rewards.services."""

from typing import Any

from django import forms as django_forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.callers import caller
from core.exceptions import StateError
from core.roles import Permission
from projects import selectors as project_selectors
from projects.selectors import page_access
from rewards import forms, selectors, services
from rewards.models import RewardRule, RewardRuleVersion


def _add_spec_errors(form: django_forms.Form, error: ValidationError, spec_field: str) -> list[dict]:
    """A service refusal on the page: spec problems on the spec field, each naming its place in the
    spec (and returned for the editor to show beside that place); other fields on their own."""
    problems = []
    for name, field_messages in error.message_dict.items():
        for message in field_messages:
            if name == spec_field or name.startswith(f"{spec_field}."):
                path = name[len(spec_field) + 1 :]
                problems.append({"path": path, "message": message})
                form.add_error(spec_field, f"{path}: {message}" if path else message)
            elif name in form.fields:
                form.add_error(name, message)
            else:
                form.add_error(None, message if name == "__all__" else f"{name}: {message}")
    return problems


def _editor_context(form: django_forms.Form, problems: list[dict] | None = None) -> dict[str, Any]:
    return {"form": form, "grader_types": forms.grader_types(), "problems": problems or []}


# --- rules ---------------------------------------------------------------------------------


@login_required
@require_GET
def reward_rule_list(request: HttpRequest, project_id: int) -> HttpResponse:
    user = caller(request)
    project = project_selectors.project_for(user=user, project_id=project_id)
    context = page_access(user=user, project=project) | {"rules": selectors.reward_rules_of(project=project)}
    return render(request, "rewards/rule_list.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def reward_rule_create(request: HttpRequest, project_id: int) -> HttpResponse:
    user = caller(request)
    project = project_selectors.project_for(user=user, project_id=project_id, permission=Permission.EDIT)
    initial = {"spec": services.spec_pretty_json(forms.STARTER_SPEC)}
    form = forms.RewardRuleForm(request.POST if request.method == "POST" else None, initial=initial)
    problems: list[dict] = []
    if form.is_bound and form.is_valid():
        try:
            rule = services.reward_rule_create(project=project, by=user, **form.cleaned_data)
        except ValidationError as exc:
            problems = _add_spec_errors(form, exc, "spec")
        else:
            messages.success(request, f"Reward rule {rule.name} created as version 1.")
            return redirect("reward-rule-detail", rule_id=rule.pk)
    context = page_access(user=user, project=project) | _editor_context(form, problems)
    return render(request, "rewards/rule_form.html", context)


@login_required
@require_GET
def reward_rule_detail(request: HttpRequest, rule_id: int) -> HttpResponse:
    user = caller(request)
    rule = selectors.reward_rule_for(user=user, rule_id=rule_id)
    versions = list(selectors.versions_of(rule=rule))
    latest = versions[0]
    context = page_access(user=user, project=rule.project) | {
        "rule": rule,
        "versions": versions,
        "latest": latest,
        "spec_json": services.spec_pretty_json(latest.spec),
        "any_used": any(version.is_used for version in versions),
    }
    return render(request, "rewards/rule_detail.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def reward_rule_edit(request: HttpRequest, rule_id: int) -> HttpResponse:
    user = caller(request)
    rule = selectors.reward_rule_for(user=user, rule_id=rule_id, permission=Permission.EDIT)
    latest = selectors.latest_version_of(rule=rule)
    initial = {
        "name": rule.name,
        "description": rule.description,
        "spec": services.spec_pretty_json(latest.spec),
    }
    form = forms.RewardRuleForm(request.POST if request.method == "POST" else None, initial=initial)
    problems: list[dict] = []
    if form.is_bound and form.is_valid():
        try:
            update = services.reward_rule_update(rule=rule, by=user, **form.cleaned_data)
        except ValidationError as exc:
            problems = _add_spec_errors(form, exc, "spec")
        else:
            if update.version_created:
                messages.success(request, f"Saved as version {update.version.number}.")
            else:
                messages.info(
                    request, f"The rule is identical to version {update.version.number}; no new version."
                )
            return redirect("reward-rule-detail", rule_id=rule.pk)
    context = (
        page_access(user=user, project=rule.project)
        | _editor_context(form, problems)
        | {"rule": rule, "latest": latest}
    )
    return render(request, "rewards/rule_form.html", context)


@login_required
@require_POST
def reward_rule_delete(request: HttpRequest, rule_id: int) -> HttpResponse:
    rule = selectors.reward_rule_for(user=caller(request), rule_id=rule_id, permission=Permission.EDIT)
    try:
        services.reward_rule_delete(rule=rule)
    except StateError as exc:
        messages.error(request, str(exc))
        return redirect("reward-rule-detail", rule_id=rule.pk)
    messages.success(request, f"Reward rule {rule.name} deleted.")
    return redirect("reward-rule-list", project_id=rule.project_id)


@login_required
@require_http_methods(["GET", "POST"])
def reward_rule_import(request: HttpRequest, project_id: int) -> HttpResponse:
    user = caller(request)
    project = project_selectors.project_for(user=user, project_id=project_id, permission=Permission.EDIT)
    form = forms.ImportOpenAIForm(request.POST if request.method == "POST" else None)
    problems: list[dict] = []
    if form.is_bound and form.is_valid():
        try:
            rule = services.reward_rule_import_openai(project=project, by=user, **form.cleaned_data)
        except ValidationError as exc:
            problems = _add_spec_errors(form, exc, "grader")
        else:
            messages.success(request, f"Imported {rule.name} from OpenAI grader JSON as version 1.")
            return redirect("reward-rule-detail", rule_id=rule.pk)
    context = page_access(user=user, project=project) | {"form": form, "problems": problems}
    return render(request, "rewards/import_form.html", context)


# --- versions and diffs --------------------------------------------------------------------


@login_required
@require_GET
def reward_rule_version(request: HttpRequest, rule_id: int, number: int) -> HttpResponse:
    user = caller(request)
    version = selectors.reward_rule_version_for(user=user, rule_id=rule_id, number=number)
    rule = version.rule
    context = page_access(user=user, project=rule.project) | {
        "rule": rule,
        "version": version,
        "spec_json": services.spec_pretty_json(version.spec),
        "latest_number": selectors.latest_version_of(rule=rule).number,
    }
    return render(request, "rewards/version_detail.html", context)


def _number(request: HttpRequest, name: str) -> int | None:
    value = request.GET.get(name, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


@login_required
@require_GET
def reward_rule_diff(request: HttpRequest, rule_id: int) -> HttpResponse:
    user = caller(request)
    rule = selectors.reward_rule_for(user=user, rule_id=rule_id)
    versions = list(selectors.versions_of(rule=rule))
    new = selectors.version_of(rule=rule, number=_number(request, "to") or versions[0].number)
    old = selectors.version_of(rule=rule, number=_number(request, "from") or max(new.number - 1, 1))
    lines = services.reward_rule_diff(old=old, new=new)
    context = page_access(user=user, project=rule.project) | {
        "rule": rule,
        "old": old,
        "new": new,
        "numbers": [version.number for version in versions],
        "lines": [(services.diff_line_kind(line), line) for line in lines],
    }
    return render(request, "rewards/diff.html", context)


# --- dry-run -------------------------------------------------------------------------------


def _dry_run_form(
    request: HttpRequest, rule: RewardRule, versions: list[RewardRuleVersion]
) -> forms.DryRunForm:
    task_set_versions = [
        (v.pk, f"{v.task_set.name} v{v.number} ({v.item_count} items)")
        for v in selectors.task_set_versions_of(project=rule.project)
    ]
    return forms.DryRunForm(
        request.POST if request.method == "POST" else None,
        initial={"version": versions[0].number},
        versions=[version.number for version in versions],
        task_set_versions=task_set_versions,
    )


def _dry_run_items(request: HttpRequest, data: dict[str, Any]) -> list[Any]:
    if data["source"] != "task_set":
        return services.pasted_items(data["items"])
    version = project_selectors.version_by_id_for(user=caller(request), version_id=data["task_set_version"])
    return services.task_items_for_dry_run(version=version, item_ids=data["item_ids"])


@login_required
@require_http_methods(["GET", "POST"])
def reward_rule_dry_run(request: HttpRequest, rule_id: int) -> HttpResponse:
    user = caller(request)
    rule = selectors.reward_rule_for(user=user, rule_id=rule_id, permission=Permission.EDIT)
    versions = list(selectors.versions_of(rule=rule))
    form = _dry_run_form(request, rule, versions)
    result = None
    if form.is_bound and form.is_valid():
        data = form.cleaned_data
        version = selectors.version_of(rule=rule, number=data["version"])
        try:
            items = _dry_run_items(request, data)
            result = services.reward_rule_dry_run(version=version, items=items, samples=data["samples"])
        except ValidationError as exc:
            for name, field_messages in exc.message_dict.items():
                for message in field_messages:
                    form.add_error(None, f"{name}: {message}")
    context = page_access(user=user, project=rule.project) | {
        "rule": rule,
        "form": form,
        "result": result,
        "rows": _result_rows(result) if result else [],
    }
    return render(request, "rewards/dry_run.html", context)


def _result_rows(result: services.DryRun) -> list[dict[str, Any]]:
    """One table row a sample: its sub-rewards in the result's column order."""
    return [
        {
            "item_id": pair.item_id,
            "output": pair.sample.get("output_text") or "",
            "total": pair.result["total"],
            "components": [pair.result["components"].get(name) for name in result.components],
            "errors": pair.result["errors"],
            "errored": pair.result["errored"],
            "flags": pair.result["flags"],
            # Each test (a failing one with what it expected and got: why a sample scored low).
            "tests": pair.result.get("tests") or [],
        }
        for pair in result.pairs
    ]

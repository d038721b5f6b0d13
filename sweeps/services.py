"""Writes for sweeps: create one (checked whole first), cancel one. The trials and their runs are
the driver's (sweeps/driver.py); it starts on commit of the sweep and on every change after."""

import re
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from core.exceptions import StateError
from inference.settings import SETTING_FIELDS, tier_snapshot
from projects.models import Project
from runs import lifecycle
from runs.models import Run
from sweeps import search, specs, tasks
from sweeps.models import Sweep
from tiers import services as tier_services
from tiers.models import Tier

DEFAULT_MAX_RUNS = 10


@transaction.atomic
def sweep_create(
    *,
    project: Project,
    by: User,
    name: str,
    template: dict[str, Any],
    parameters: list[dict[str, Any]],
    search_kind: str = Sweep.Search.TPE,
    max_runs: int | None = None,
    **settings: Any,
) -> Sweep:
    """A sweep, once its template, parameters and settings all pass; its first trials start on
    commit. A base_model parameter gets a tier per model (the template's settings, that model)."""
    values = {"name": name, "max_runs": max_runs, **settings}
    problems = specs.template_problems(project, template)
    # A template that is not an object is named once; the other checks read it as empty.
    fields = template if isinstance(template, dict) else {}
    problems |= specs.parameter_problems(project, fields, parameters, search_kind)
    problems |= specs.setting_problems(values, fields)
    if problems:
        raise ValidationError(problems)
    tiers = _base_model_tiers(project, by, template, parameters)
    if problems := specs.value_problems(project, template, parameters, tiers):
        raise ValidationError(problems)
    if max_runs is None:
        grid = search.grid_size(parameters) if search_kind == Sweep.Search.GRID else DEFAULT_MAX_RUNS
        max_runs = min(grid, DEFAULT_MAX_RUNS) if search_kind != Sweep.Search.GRID else grid
    if settings.get("max_money") is not None:
        settings["max_money"] = Decimal(str(settings["max_money"]))
    sweep = Sweep.objects.create(
        project=project,
        name=name.strip(),
        created_by=by,
        template=_json_template(template),
        parameters=parameters,
        base_model_tiers=tiers,
        search=search_kind,
        max_runs=max_runs,
        **settings,
    )
    transaction.on_commit(lambda: tasks.sweep_advance.delay(sweep.pk))
    return sweep


def _json_template(template: dict[str, Any]) -> dict[str, Any]:
    out = dict(template)
    if out.get("budget_money") is not None:
        out["budget_money"] = str(out["budget_money"])
    return out


def _base_model_tiers(
    project: Project, by: User, template: dict[str, Any], parameters: list[dict[str, Any]]
) -> dict[str, int]:
    """{base model: the tier its trials run under}: the template's tier settings with that base
    model, a tier of the project found by its name or made now. A model that cannot be a tier's
    base (no such folder, not on the hub) is refused by its parameter's path."""
    found = [(i, p) for i, p in enumerate(parameters) if p.get("name") == "base_model"]
    if not found:
        return {}
    index, parameter = found[0]
    base = Tier.objects.get(pk=template["tier"], project=project)
    tiers, problems = {}, []
    for model in search.values_of(parameter) or []:
        if model == base.base_model:
            tiers[model] = base.pk
            continue
        tier_name = _tier_name(base.name, model)
        tier = Tier.objects.filter(project=project, name=tier_name, base_model=model).first()
        if tier is None:
            settings = {key: value for key, value in tier_snapshot(base).items() if key in SETTING_FIELDS}
            try:
                with transaction.atomic():
                    tier = tier_services.tier_create(
                        project=project, by=by, **(settings | {"name": tier_name, "base_model": model})
                    )
            except ValidationError as refused:
                messages = "; ".join(f"{k} {' '.join(m)}" for k, m in refused.message_dict.items())
                problems.append(f"{model!r}: {messages}")
                continue
        tiers[model] = tier.pk
    if problems:
        key = "values" if "values" in parameter else "choices"
        raise ValidationError({f"parameters.{index}.{key}": "; ".join(problems)})
    return tiers


def _tier_name(base: str, model: str) -> str:
    """The tier of a base model in a sweep: the template tier's name and the model's short name.

    >>> _tier_name("cap", "/data/models/tiny-2")
    'cap @ tiny-2'
    """
    short = re.split(r"[/\\]", model.rstrip("/\\"))[-1] or model
    return f"{base} @ {short}"[:100]


@transaction.atomic
def sweep_cancel(*, sweep: Sweep) -> Sweep:
    """Stop the sweep: no new trial, and each active trial's run cancelled. A finished sweep is
    refused (409) and nothing changes."""
    changed = Sweep.objects.filter(pk=sweep.pk, status=Sweep.Status.RUNNING).update(
        status=Sweep.Status.CANCELLED, reason="cancelled", finished_at=timezone.now()
    )
    if not changed:
        current = Sweep.objects.filter(pk=sweep.pk).values_list("status", flat=True).first()
        raise StateError(f"sweep {sweep.pk} is {current}; only a running sweep can be cancelled")
    active = Run.objects.filter(sweep_trial__sweep=sweep, status__in=Run.ACTIVE)
    for run in active.select_for_update():
        try:
            lifecycle.run_cancel(run=run)
        except StateError:  # it ended meanwhile: nothing to cancel
            continue
    transaction.on_commit(lambda: tasks.sweep_advance.delay(sweep.pk))
    sweep.refresh_from_db()
    return sweep

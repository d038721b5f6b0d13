"""Tier pages: create, edit and delete a tier, its page with the evaluate form, and an evaluation's
chart and table.

Objects come through `tiers.selectors` (non-member 404, missing permission 403, as over REST);
writes go through `tiers.services`. A run's policy version to evaluate is resolved by runs, above
tiers (tiers/run_policies.py)."""

import math
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.callers import caller
from core.roles import Permission, role_allows
from inference.model_sources import local_models
from projects import selectors as project_selectors
from projects.forms import add_service_errors
from projects.selectors import page_access
from tiers import selectors, services
from tiers.forms import TierEvaluateForm, TierForm, stop_escape
from tiers.models import Tier
from tiers.run_policies import run_policy_for

METRICS = (
    ("pass_rate", "Pass rate"),
    ("tokens_per_second", "Tokens/s"),
    ("ttft_ms_p50", "TTFT p50 (ms)"),
    ("latency_ms_p50", "Latency p50 (ms)"),
    ("latency_ms_p95", "Latency p95 (ms)"),
    ("peak_memory_mb", "Peak memory (MB)"),
    ("acceptance_rate", "Acceptance rate"),
)


def evaluate_context(user: User, tier: Tier, form: TierEvaluateForm | None = None) -> dict[str, Any]:
    """What the tier page shows about evaluations: the form (for editors) and recent ones."""
    role = project_selectors.role_of(user=user, project_id=tier.project_id)
    return {
        "evaluate_form": (form or TierEvaluateForm(tier=tier))
        if role_allows(role, Permission.EDIT)
        else None,
        "evaluations": selectors.tier_evaluations_of(tier=tier, limit=20),
    }


@login_required
@require_POST
def tier_evaluate(request: HttpRequest, tier_id: int) -> HttpResponse:
    user = caller(request)
    tier = selectors.tier_for(user=user, tier_id=tier_id, permission=Permission.EDIT)
    form = TierEvaluateForm(request.POST, tier=tier)
    if form.is_valid():
        data = form.cleaned_data
        try:
            run = data["run"]
            policy = run_policy_for(
                user=user, tier=tier, run_id=None if run is None else run.pk, version=data["version"]
            )
            evaluation = services.tier_evaluation_request(
                tier=tier,
                by=user,
                task_set_version=data["task_set_version"],
                split=data["split"],
                compare=list(data["compare"]),
                checkpoint=data["checkpoint"],
                policy=policy,
                limit=data["limit"],
            )
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, "Evaluation queued; this page fills in as each tier finishes.")
            return redirect("tier-evaluation-detail", evaluation_id=evaluation.pk)

    context = (
        page_access(user=user, project=tier.project) | {"tier": tier} | evaluate_context(user, tier, form)
    )
    return render(request, "tiers/tier_detail.html", context, status=400)


def wilson_interval(passed: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a pass rate: honest on few items and near 0 or 1.

    >>> wilson_interval(5, 6)
    (0.436, 0.97)
    """
    if n == 0:
        return 0.0, 1.0
    rate = passed / n
    centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
    spread = z * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return round(max(0.0, centre - spread), 3), round(min(1.0, centre + spread), 3)


def pass_rate_text(result: dict) -> str | None:
    """'0.833 (5 of 6 items; 95% CI 0.436–0.97)', or the bare rate when the counts are missing."""
    rate, passed, scored = result.get("pass_rate"), result.get("passed"), result.get("scored")
    if rate is None:
        return None
    if not isinstance(passed, int) or not isinstance(scored, int) or scored <= 0:
        return f"{rate:.3g}"
    low, high = wilson_interval(passed, scored)
    item_word = "item" if scored == 1 else "items"
    return f"{rate:.3g} ({passed} of {scored} {item_word}; 95% CI {low:.3g}–{high:.3g})"


def chart_data(results: list[dict]) -> dict:
    """The capability/speed chart's points and its Pareto front (sorted by speed)."""
    points: list[dict[str, Any]] = [
        {
            "name": r.get("name"),
            "pass_rate": r.get("pass_rate"),
            "tokens_per_second": r.get("tokens_per_second"),
            "pareto": bool(r.get("pareto")),
        }
        for r in results
        if r.get("pass_rate") is not None and r.get("tokens_per_second") is not None
    ]
    front = sorted((p for p in points if p["pareto"]), key=lambda p: p["tokens_per_second"])
    return {"points": points, "front": front}


@login_required
@require_GET
def tier_evaluation_detail(request: HttpRequest, evaluation_id: int) -> HttpResponse:
    user = caller(request)
    evaluation = selectors.tier_evaluation_for(user=user, evaluation_id=evaluation_id)

    results = evaluation.results or []
    rows = [
        {"label": label, "key": key, "values": [result.get(key) for result in results]}
        for key, label in METRICS
    ]
    # A pass rate is shown with what it rests on: 0.83 of 6 items is not 0.83 of 600.
    rows[0]["values"] = [pass_rate_text(result) for result in results]
    rows.insert(1, {"label": "Items scored", "key": "scored", "values": [r.get("scored") for r in results]})
    settings_rows: list[dict[str, Any]] = []
    names = (
        "precision",
        "device",
        "speculation",
        "speculative_tokens",
        "draft_model",
        "batch_size",
        "temperature",
        "top_p",
        "top_k",
        "max_new_tokens",
    )
    for name in names:
        values = [(result.get("settings") or {}).get(name) for result in results]
        settings_rows.append({"label": name, "values": values, "differs": len({repr(v) for v in values}) > 1})
    context = page_access(user=user, project=evaluation.project) | {
        "evaluation": evaluation,
        "results": results,
        "rows": rows,
        "settings_rows": settings_rows,
        "chart": chart_data(results),
        "pending": [c.get("name") for c in evaluation.tier_configs[len(results) :]],
    }
    return render(request, "tiers/tier_evaluation.html", context)


# --- tiers ---------------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def tier_create(request: HttpRequest, project_id: int) -> HttpResponse:
    user = caller(request)
    project = project_selectors.project_for(user=user, project_id=project_id, permission=Permission.EDIT)
    models = local_models(settings.FLYWHEEL_HOME / "models")
    demo_model = str(settings.FLYWHEEL_HOME / "models" / "tiny-base")
    initial = {"base_model": demo_model if demo_model in models else (models[0] if models else "")}
    form = TierForm(request.POST if request.method == "POST" else None, initial=initial)
    if form.is_bound and form.is_valid():
        try:
            tier = services.tier_create(project=project, by=user, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Tier {tier.name} created.")
            return redirect("tier-detail", tier_id=tier.pk)
    context = page_access(user=user, project=project) | {"form": form, "local_models": models}
    return render(request, "tiers/tier_form.html", context)


@login_required
@require_GET
def tier_detail(request: HttpRequest, tier_id: int) -> HttpResponse:
    user = caller(request)
    tier = selectors.tier_for(user=user, tier_id=tier_id)
    stops = [stop_escape(stop) for stop in tier.stop or []]
    context = (
        page_access(user=user, project=tier.project)
        | {"tier": tier, "stops": stops}
        | evaluate_context(user, tier)
    )
    return render(request, "tiers/tier_detail.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def tier_edit(request: HttpRequest, tier_id: int) -> HttpResponse:
    user = caller(request)
    tier = selectors.tier_for(user=user, tier_id=tier_id, permission=Permission.EDIT)
    form = TierForm(request.POST if request.method == "POST" else None, instance=tier)
    if form.is_bound and form.is_valid():
        try:
            tier = services.tier_update(tier=tier, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Tier {tier.name} saved.")
            return redirect("tier-detail", tier_id=tier.pk)
    models = local_models(settings.FLYWHEEL_HOME / "models")
    context = page_access(user=user, project=tier.project) | {
        "form": form,
        "tier": tier,
        "local_models": models,
    }
    return render(request, "tiers/tier_form.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def tier_delete(request: HttpRequest, tier_id: int) -> HttpResponse:
    user = caller(request)
    tier = selectors.tier_for(user=user, tier_id=tier_id, permission=Permission.EDIT)
    if request.method == "POST":
        project_id, name = tier.project_id, tier.name
        services.tier_delete(tier=tier)
        messages.success(request, f"Tier {name} deleted.")
        return redirect("project-detail", project_id=project_id)
    return render(
        request,
        "tiers/tier_delete.html",
        page_access(user=user, project=tier.project) | {"tier": tier},
    )

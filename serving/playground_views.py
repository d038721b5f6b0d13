"""The playground: one prompt sent to several tiers or checkpoints side by side.

The page lists the models the caller may use (serving/served_models.py, through their role); its
script (static/playground.js) sends the prompt to each through the OpenAI-compatible endpoint
(/v1/), with the session and the page's CSRF token, and writes each stream into its pane as text.
"""

from itertools import groupby

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from core.callers import caller
from core.roles import Permission, role_allows
from projects import selectors as project_selectors
from runs import selectors
from runs.models import Run
from serving.served_models import served_models_for


@never_cache
@login_required
@require_GET
def playground(request: HttpRequest) -> HttpResponse:
    user = caller(request)
    models = served_models_for(user=user)
    wanted = request.GET.get("models", "").split(",") + [_run_default(user, request.GET.get("run", ""))]
    chosen = set(wanted) & {model.id for model in models}
    if not chosen:
        chosen = {model.id for model in models[:2]}
    by_project = sorted(models, key=lambda model: (model.project, model.kind != "tier"))
    groups = [(project, list(group)) for project, group in groupby(by_project, key=lambda m: m.project)]
    return render(request, "serving/playground.html", {"groups": groups, "chosen": chosen, "prompt": ""})


def _run_default(user: User, run_id: str) -> str:
    """`?run=<id>`: the model id of the run's default checkpoint (its best, else its newest);
    "" when there is none, or no such run the caller may view (then the page's own default)."""
    run = Run.objects.filter(pk=int(run_id)).first() if run_id.isdigit() and len(run_id) < 19 else None
    if run is None or not role_allows(
        project_selectors.role_of(user=user, project_id=run.project_id), Permission.VIEW
    ):
        return ""
    checkpoint = selectors.checkpoint_default(run)
    return "" if checkpoint is None else f"run-{run.pk}-step-{checkpoint.step}"

"""The playground: one prompt sent to several tiers or checkpoints side by side.

The page lists the models the caller may use (runs/served_models.py, through their role); its
script (static/playground.js) sends the prompt to each through the OpenAI-compatible endpoint
(/v1/), with the session and the page's CSRF token, and writes each stream into its pane as text.
"""

from itertools import groupby

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from runs.served_models import served_models_for


@never_cache
@login_required
@require_GET
def playground(request: HttpRequest) -> HttpResponse:
    models = served_models_for(user=request.user)
    chosen = set(request.GET.get("models", "").split(",")) & {model.id for model in models}
    if not chosen:
        chosen = {model.id for model in models[:2]}
    by_project = sorted(models, key=lambda model: (model.project, model.kind != "tier"))
    groups = [(project, list(group)) for project, group in groupby(by_project, key=lambda m: m.project)]
    return render(request, "runs/playground.html", {"groups": groups, "chosen": chosen, "prompt": ""})

"""The webhooks page of a project: list, add (the secret shown once), remove, send a test, and the
recent deliveries. Owners only, as over REST: non-members get 404, other members 403."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from core.callers import caller
from core.exceptions import StateError
from core.roles import Permission
from projects import selectors as project_selectors
from projects.forms import add_service_errors
from projects.selectors import page_access
from webhooks import selectors, services
from webhooks.forms import WebhookForm


@login_required
@require_http_methods(["GET", "POST"])
def webhook_list(request: HttpRequest, project_id: int) -> HttpResponse:
    project = project_selectors.project_for(
        user=caller(request), project_id=project_id, permission=Permission.MANAGE_WEBHOOKS
    )
    form = WebhookForm(request.POST if request.method == "POST" else None)
    created = None
    if form.is_bound and form.is_valid():
        try:
            created = services.webhook_create(project=project, by=caller(request), **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            form = WebhookForm()
    elif form.is_bound:
        # The form refused a field; the URL is still checked, so one submission names both.
        url = form.cleaned_data.get("url", request.POST.get("url", ""))
        problems = services.webhook_problems(url=url) if "url" not in form.errors else {}
        if problems:
            add_service_errors(form, ValidationError(problems))
    return _list_page(request, project, form, created=created)


def _list_page(request: HttpRequest, project, form: WebhookForm, **shown_once) -> HttpResponse:
    context = page_access(user=caller(request), project=project) | {
        "webhooks": selectors.webhooks_of(project=project),
        "deliveries": selectors.recent_deliveries_of(project=project),
        "form": form,
        **shown_once,  # a new secret, rendered in this one response only
    }
    return render(request, "webhooks/webhook_list.html", context)


@login_required
@require_POST
def webhook_rotate(request: HttpRequest, webhook_id: int) -> HttpResponse:
    """A new signing secret, shown in this response only (so no redirect)."""
    webhook = selectors.webhook_for(user=caller(request), webhook_id=webhook_id)
    secret = services.webhook_secret_rotate(webhook=webhook)
    return _list_page(request, webhook.project, WebhookForm(), rotated={"webhook": webhook, "secret": secret})


@login_required
@require_POST
def webhook_delete(request: HttpRequest, webhook_id: int) -> HttpResponse:
    webhook = selectors.webhook_for(user=caller(request), webhook_id=webhook_id)
    services.webhook_delete(webhook=webhook)
    messages.success(request, f"Webhook {webhook.url} removed; it gets no more events.")
    return redirect("webhook-list", project_id=webhook.project_id)


@login_required
@require_POST
def webhook_ping(request: HttpRequest, webhook_id: int) -> HttpResponse:
    webhook = selectors.webhook_for(user=caller(request), webhook_id=webhook_id)
    try:
        delivery = services.webhook_ping(webhook=webhook)
    except StateError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(
            request, f"Test event {delivery.pk} queued for {webhook.url}; refresh to see its answer."
        )
    return redirect("webhook-list", project_id=webhook.project_id)


@login_required
@require_POST
def delivery_redeliver(request: HttpRequest, webhook_id: int, delivery_id: int) -> HttpResponse:
    webhook = selectors.webhook_for(user=caller(request), webhook_id=webhook_id)
    delivery = selectors.delivery_for(webhook=webhook, delivery_id=delivery_id)
    try:
        services.delivery_redeliver(delivery=delivery)
    except StateError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Delivery {delivery.pk} queued again.")
    return redirect("webhook-list", project_id=webhook.project_id)

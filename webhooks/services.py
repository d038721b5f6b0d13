"""Writes for webhooks: manage them, record a delivery per matching webhook when a run changes
status (in the transition's own transaction: an outbox), and send deliveries with retries.

A delivery is sent at least once and, barring a worker dying mid-POST, exactly once: a worker
claims it with a conditional UPDATE that also pushes its due time past the POST's timeout, so a
duplicated task message finds nothing due, and a worker that died holding it frees it when the
claim runs out. Celery's countdown brings short retries; the scheduler's tick sends whatever is
overdue, so a lost message, a broker outage or a dead worker never loses a delivery.
"""

import json
import secrets
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.client import HTTPException
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F
from django.urls import reverse
from django.utils import timezone

from core.exceptions import StateError
from projects.models import Project
from runs.models import Run, RunEvent
from webhooks import egress, selectors, tasks
from webhooks.models import Webhook, WebhookDelivery
from webhooks.signing import signature_header

D = WebhookDelivery.Status
# Seconds to wait after the n-th failed attempt; the last repeats. 8 attempts span about 10 hours.
RETRY_DELAYS = (10, 30, 120, 600, 3600, 3 * 3600, 6 * 3600, 12 * 3600)
# Longer waits are left to the tick: Celery holds a countdown message in a worker's memory.
COUNTDOWN_MAX_SECONDS = 600
# How long deliveries stay signed with a rotated-out secret as well as the new one.
SECRET_OVERLAP = timedelta(hours=24)
# A claim outlives the POST's timeout by this much before another worker may take the delivery.
CLAIM_MARGIN_SECONDS = 60
USER_AGENT = "Flywheel-Webhooks/1"
EVENT_TYPES = ("run.status", "run.alert", "run.budget")
ERROR_MAX_CHARS = 500


# --- managing webhooks ---------------------------------------------------------------------


def url_problem(url: str) -> str | None:
    """Why `url` cannot receive webhooks, or None.

    >>> url_problem("ftp://example.com/hook")
    'must start with http:// or https://, not ftp://'
    >>> url_problem("https://hooks.example.com/flywheel") is None
    True
    """
    if not url or any(ch.isspace() for ch in url):
        return "must be an http:// or https:// URL without spaces"
    if len(url) > 2000:
        return "must be at most 2000 characters"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        scheme = f"{parts.scheme}://" if parts.scheme else "no scheme"
        return f"must start with http:// or https://, not {scheme}"
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        return "has an invalid port"
    if not parts.hostname:
        return "needs a host name"
    return egress.literal_address_problem(parts.hostname)


def _problems(
    *, url: str | None, statuses: list[str] | None, events: list[str] | None = None
) -> dict[str, str]:
    problems = {}
    unknown_events = sorted(set(events or ()) - set(EVENT_TYPES))
    if unknown_events:
        problems["events"] = f"unknown event {', '.join(unknown_events)}; use {', '.join(EVENT_TYPES)}"
    if url is not None and (problem := url_problem(url)):
        problems["url"] = problem
    unknown = sorted(set(statuses or ()) - set(Run.Status.values))
    if unknown:
        problems["statuses"] = f"unknown status {', '.join(unknown)}; use {', '.join(Run.Status.values)}"
    return problems


def webhook_problems(*, url: str, statuses: list[str] | None = None) -> dict[str, str]:
    """What webhook_create would refuse in these fields, without creating anything."""
    return _problems(url=url, statuses=statuses)


def secret_generate() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


def webhook_create(
    *,
    project: Project,
    by: User,
    url: str,
    description: str = "",
    statuses: list[str] | None = None,
    active: bool = True,
    events: list[str] | None = None,
) -> Webhook:
    """A new webhook with a fresh secret (in `.secret`: show it to its creator this once)."""
    if problems := _problems(url=url, statuses=statuses, events=events):
        raise ValidationError(problems)
    return Webhook.objects.create(
        project=project,
        url=url,
        description=description,
        statuses=sorted(set(statuses or ())),
        events=sorted(set(events or ())),
        active=active,
        secret=secret_generate(),
        created_by=by,
    )


def webhook_update(*, webhook: Webhook, **fields: Any) -> Webhook:
    editable = {"url", "description", "statuses", "active", "events"}
    if unknown := set(fields) - editable:
        raise ValidationError({name: "cannot be changed" for name in unknown})
    given = {name: fields.get(name) for name in ("url", "statuses", "events")}
    if problems := _problems(**given):
        raise ValidationError(problems)
    for name in ("statuses", "events"):
        if name in fields:
            fields[name] = sorted(set(fields[name]))
    Webhook.objects.filter(pk=webhook.pk).update(**fields)
    webhook.refresh_from_db()
    return webhook


def webhook_secret_rotate(*, webhook: Webhook, now: datetime | None = None) -> str:
    """A new signing secret, returned this once. For SECRET_OVERLAP more, deliveries carry a
    signature with the old one too, so receivers switch over without missing one."""
    now = now or timezone.now()
    new = secret_generate()
    Webhook.objects.filter(pk=webhook.pk).update(
        secret=new, previous_secret=webhook.secret, previous_secret_expires_at=now + SECRET_OVERLAP
    )
    webhook.refresh_from_db()
    return new


def webhook_delete(*, webhook: Webhook) -> None:
    webhook.delete()  # its deliveries go with it; a worker holding one finds it gone


# --- recording deliveries ------------------------------------------------------------------


def _timestamp(moment: datetime) -> str:
    # isoformat pads every year to four digits, where strftime's %Y does not on glibc
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _delivery_create(
    *, webhook: Webhook, kind: str, data: dict, created_at: datetime, **links: Any
) -> WebhookDelivery:
    delivery = WebhookDelivery.objects.create(
        webhook=webhook, type=kind, payload={}, next_attempt_at=timezone.now(), **links
    )
    # The body carries its own id (receivers dedupe on it), so it is written once the row has one.
    delivery.payload = {"id": delivery.pk, "type": kind, "created_at": _timestamp(created_at), "data": data}
    delivery.save(update_fields=["payload"])
    _enqueue(delivery.pk)
    return delivery


def run_payload(run: Run) -> dict[str, Any]:
    return {
        "id": run.pk,
        "name": run.name,
        "project": run.project_id,
        "status": run.status,
        "error": run.error,
        "url": reverse("api-run", kwargs={"id": run.pk}),
    }


@transaction.atomic
def deliveries_enqueue(*, run: Run, event: RunEvent, status: str) -> list[WebhookDelivery]:
    """One pending delivery per active webhook of the run's project that wants `status`, written
    in the caller's transaction (so a rolled-back transition sends nothing) and handed to the
    workers once it commits."""
    webhooks = [w for w in Webhook.objects.filter(project_id=run.project_id, active=True) if w.wants(status)]
    if not webhooks:
        return []
    data = {"run": run_payload(run), "status": status, "message": event.message}
    return [
        _delivery_create(
            webhook=webhook,
            kind=WebhookDelivery.Type.RUN_STATUS,
            data=data,
            created_at=event.created_at,
            run=run,
            event=event,
        )
        for webhook in webhooks
    ]


@transaction.atomic
def alert_deliveries_enqueue(
    *, run: Run, event: RunEvent, alert: dict[str, Any], done: str
) -> list[WebhookDelivery]:
    """A `run.alert` delivery per active webhook of the run's project that wants alerts: the
    alert, its evidence, and what the run did about it (`paused`, or `none`)."""
    data = {
        "run": run_payload(run),
        "alert": {
            key: alert.get(key) for key in ("monitor", "message", "value", "threshold", "step", "evidence")
        }
        | {"message": event.message, "event": event.pk},
        "action": alert.get("action", "alert"),
        "done": done,
    }
    return _event_deliveries(run=run, event=event, kind=WebhookDelivery.Type.RUN_ALERT, data=data)


@transaction.atomic
def budget_deliveries_enqueue(*, run: Run, event: RunEvent, budget: dict[str, Any]) -> list[WebhookDelivery]:
    """A `run.budget` delivery per active webhook of the run's project that wants it: the run
    reached its budget (what it is, what was spent, at which step) and is pausing."""
    data = {"run": run_payload(run), "budget": budget, "message": event.message, "event": event.pk}
    return _event_deliveries(run=run, event=event, kind=WebhookDelivery.Type.RUN_BUDGET, data=data)


def _event_deliveries(*, run: Run, event: RunEvent, kind: str, data: dict[str, Any]) -> list[WebhookDelivery]:
    """One delivery of `data` per active webhook of the run's project that wants events of `kind`."""
    webhooks = Webhook.objects.filter(project_id=run.project_id, active=True)
    return [
        _delivery_create(
            webhook=webhook, kind=kind, data=data, created_at=event.created_at, run=run, event=event
        )
        for webhook in webhooks
        if webhook.wants_event(kind)
    ]


@transaction.atomic
def webhook_ping(*, webhook: Webhook) -> WebhookDelivery:
    """A test delivery, signed and retried like any other."""
    if not webhook.active:
        raise StateError(f"webhook {webhook.pk} is inactive; activate it to send it events")
    data = {
        "webhook": webhook.pk,
        "project": webhook.project_id,
        "message": "a test event from Flywheel: this webhook is set up",
    }
    return _delivery_create(
        webhook=webhook, kind=WebhookDelivery.Type.PING, data=data, created_at=timezone.now()
    )


@transaction.atomic
def delivery_redeliver(*, delivery: WebhookDelivery) -> WebhookDelivery:
    """Send a delivered or failed delivery again, same id and body, with a fresh set of attempts."""
    if not Webhook.objects.filter(pk=delivery.webhook_id, active=True).exists():
        raise StateError(f"webhook {delivery.webhook_id} is inactive; activate it to send it events")
    changed = WebhookDelivery.objects.filter(pk=delivery.pk, status__in=(D.DELIVERED, D.FAILED)).update(
        status=D.PENDING, attempts=0, next_attempt_at=timezone.now(), delivered_at=None
    )
    if not changed:
        raise StateError(f"delivery {delivery.pk} is still pending; it is retried on its own")
    _enqueue(delivery.pk)
    delivery.refresh_from_db()
    return delivery


def _enqueue(delivery_id: int, countdown: int = 0) -> None:
    def send() -> None:
        tasks.webhook_deliver.apply_async((delivery_id,), countdown=countdown or None)

    # robust: the row is committed either way, and the tick sends it if the broker was down.
    transaction.on_commit(send, robust=True)


# --- sending -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    code: int | None  # the HTTP status, or None when no answer came
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.code is not None and 200 <= self.code < 300


def delivery_headers(delivery: WebhookDelivery, body: bytes, secrets: list[str]) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "Flywheel-Event": delivery.type,
        "Flywheel-Delivery": str(delivery.pk),
        "Flywheel-Signature": signature_header(secrets, body),
    }


def delivery_body(delivery: WebhookDelivery) -> bytes:
    return json.dumps(delivery.payload, separators=(",", ":")).encode()


def _short(text: str) -> str:
    return text if len(text) <= ERROR_MAX_CHARS else text[: ERROR_MAX_CHARS - 1] + "…"


def http_post(url: str, body: bytes, headers: dict[str, str]) -> Outcome:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with egress.opener.open(request, timeout=settings.FLYWHEEL_WEBHOOK_TIMEOUT_SECONDS) as response:
            return Outcome(response.status)
    except urllib.error.HTTPError as exc:
        try:
            answer = exc.read(200).decode(errors="replace").strip()
        finally:
            exc.close()
        return Outcome(exc.code, _short(f"HTTP {exc.code} {exc.reason}: {answer}".rstrip(": ")))
    except urllib.error.URLError as exc:
        return Outcome(None, _short(str(exc.reason)))
    except (OSError, HTTPException, ValueError) as exc:  # timeouts, resets, garbled answers
        return Outcome(None, _short(f"{type(exc).__name__}: {exc}"))


def delivery_claim(*, delivery_id: int, now: datetime) -> WebhookDelivery | None:
    """Take a due delivery for one attempt, or None when it is not due, done, or taken."""
    if not WebhookDelivery.objects.filter(pk=delivery_id, webhook__active=True).exists():
        return None  # an inactive webhook's deliveries wait until it is active again
    lease = timedelta(seconds=settings.FLYWHEEL_WEBHOOK_TIMEOUT_SECONDS + CLAIM_MARGIN_SECONDS)
    # Only columns of the row itself in the WHERE: PostgreSQL re-checks those after waiting on a
    # concurrent claim's lock (a join would become a subquery it does not re-check).
    claimed = WebhookDelivery.objects.filter(
        pk=delivery_id, status=D.PENDING, next_attempt_at__lte=now
    ).update(attempts=F("attempts") + 1, next_attempt_at=now + lease)
    if not claimed:
        return None
    return WebhookDelivery.objects.select_related("webhook").get(pk=delivery_id)


def retry_delay(attempts: int) -> int:
    """Seconds to wait after the `attempts`-th failed attempt.

    >>> [retry_delay(n) for n in (1, 2, 3, 4, 5, 20)]
    [10, 30, 120, 600, 3600, 43200]
    """
    return RETRY_DELAYS[min(attempts, len(RETRY_DELAYS)) - 1]


def delivery_attempt(*, delivery_id: int, now: datetime | None = None) -> WebhookDelivery | None:
    """POST a due delivery once and record the answer: delivered on a 2xx; otherwise due again
    after a backoff, or failed after FLYWHEEL_WEBHOOK_MAX_ATTEMPTS. None when nothing was due."""
    now = now or timezone.now()
    delivery = delivery_claim(delivery_id=delivery_id, now=now)
    if delivery is None:  # a duplicated message, not due yet, or already settled
        return None
    body = delivery_body(delivery)
    secrets_now = delivery.webhook.signing_secrets(now)
    outcome = http_post(delivery.webhook.url, body, delivery_headers(delivery, body, secrets_now))
    return _record(delivery, outcome, now)


def _record(delivery: WebhookDelivery, outcome: Outcome, now: datetime) -> WebhookDelivery:
    # Only while our claim holds: a redelivery meanwhile reset `attempts` and owns the row now.
    ours = WebhookDelivery.objects.filter(pk=delivery.pk, status=D.PENDING, attempts=delivery.attempts)
    answer = {"last_response_code": outcome.code, "last_error": outcome.error}
    if outcome.ok:
        ours.update(status=D.DELIVERED, delivered_at=now, next_attempt_at=None, **answer)
    elif delivery.attempts >= settings.FLYWHEEL_WEBHOOK_MAX_ATTEMPTS:
        ours.update(status=D.FAILED, next_attempt_at=None, **answer)
    else:
        delay = retry_delay(delivery.attempts)
        retrying = ours.update(next_attempt_at=now + timedelta(seconds=delay), **answer)
        if retrying and delay <= COUNTDOWN_MAX_SECONDS:
            _enqueue(delivery.pk, countdown=delay)
    delivery.refresh_from_db()
    return delivery


def deliveries_resend(*, now: datetime | None = None) -> list[int]:
    """The tick's part: hand every overdue delivery to the workers again. A delivery whose message
    is still on its way is sent once anyway: the claim turns the second message away."""
    due = selectors.deliveries_overdue(now=now or timezone.now())
    for delivery_id in due:
        tasks.webhook_deliver.delay(delivery_id)
    return due

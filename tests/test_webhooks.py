"""Webhooks on run status changes, against a real HTTP receiver on 127.0.0.1: one signed delivery
per matching webhook, retries with backoff driven by moving the clock (never by sleeping), failure
after the last attempt, duplicated task messages, the tick's resend, REST and the page."""

# The fixture imported from run_fixtures is a test parameter here, not a redefinition:
# ruff: noqa: F811
import json
import socket
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from unittest import mock

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from runs import lifecycle
from runs.models import Run
from tests.conftest import api_client_for
from tests.run_fixtures import lab, make_run  # noqa: F401
from webhooks import selectors, services, tasks
from webhooks.models import Webhook, WebhookDelivery
from webhooks.signing import signature_header, signature_verify
from workers.supervisor import runs_tick

S = Run.Status
D = WebhookDelivery.Status


class Receiver:
    """A real HTTP server that records every request and answers with the next code of
    `answers` (200 once they run out). It records before answering, so by the time a POST
    returns to the sender, the request is in `requests`: no waiting needed."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.answers: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append({"path": self.path, "headers": self.headers, "body": body})
                code = receiver.answers.pop(0) if receiver.answers else 200
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"no" if code >= 300 else b"ok")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


@pytest.fixture
def closed_port_url() -> str:
    """A URL nothing listens on: connections to it are refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


@pytest.fixture(autouse=True)
def private_receivers_allowed(settings):
    """The receivers here listen on 127.0.0.1; the guard against private addresses is tested last."""
    settings.FLYWHEEL_WEBHOOK_ALLOW_PRIVATE = True


def make_webhook(lab, url: str, **fields) -> Webhook:
    return services.webhook_create(project=lab["project"], by=lab["owner"], url=url, **fields)


def delivered_to(receiver: Receiver) -> list[int]:
    return [int(request["headers"]["Flywheel-Delivery"]) for request in receiver.requests]


def cancelled_run_delivery(lab, webhook: Webhook) -> WebhookDelivery:
    run = make_run(lab)
    lifecycle.run_cancel(run=run)
    return WebhookDelivery.objects.get(webhook=webhook, run=run, payload__data__status="cancelled")


# --- the outbox: deliveries written with the transition ------------------------------------


def test_a_status_change_sends_one_signed_delivery_per_matching_webhook(
    lab, receiver, django_capture_on_commit_callbacks
):
    every = make_webhook(lab, receiver.url)
    on_cancel = make_webhook(lab, receiver.url + "?only=cancelled", statuses=["cancelled"])
    make_webhook(lab, receiver.url, statuses=["succeeded"])
    make_webhook(lab, receiver.url, active=False)
    services.webhook_create(project=lab["other_project"], by=lab["outsider"], url=receiver.url)
    run = make_run(lab)

    with mock.patch.object(tasks.webhook_deliver, "apply_async") as send:
        with django_capture_on_commit_callbacks(execute=True):
            lifecycle.run_cancel(run=run)
            assert send.call_count == 0  # nothing leaves before the transition commits
    deliveries = list(WebhookDelivery.objects.filter(payload__data__status="cancelled").order_by("pk"))
    assert [(d.webhook_id, d.run_id, d.status, d.attempts) for d in deliveries] == [
        (every.pk, run.pk, D.PENDING, 0),
        (on_cancel.pk, run.pk, D.PENDING, 0),
    ]
    assert sorted(c.args[0] for c in send.call_args_list) == [(d.pk,) for d in deliveries]

    for delivery in deliveries:
        tasks.webhook_deliver(delivery.pk)  # the task's body, as a worker runs it
    assert delivered_to(receiver) == [d.pk for d in deliveries]
    event = run.events.get(kind="status", data__status="cancelled")
    for delivery, request, webhook in zip(deliveries, receiver.requests, (every, on_cancel), strict=True):
        headers = request["headers"]
        assert request["path"] == "/hook" + ("?only=cancelled" if webhook == on_cancel else "")
        assert headers["Content-Type"] == "application/json"
        assert headers["User-Agent"] == "Flywheel-Webhooks/1"
        assert headers["Flywheel-Event"] == "run.status"
        assert json.loads(request["body"]) == {
            "id": delivery.pk,
            "type": "run.status",
            "created_at": event.created_at.isoformat(timespec="microseconds").replace("+00:00", "Z"),
            "data": {
                "run": {
                    "id": run.pk,
                    "name": run.name,
                    "project": lab["project"].pk,
                    "status": "cancelled",
                    "error": None,
                    "url": f"/api/v1/runs/{run.pk}",
                },
                "status": "cancelled",
                "message": "cancelled",
            },
        }
        signature = headers["Flywheel-Signature"]
        assert signature_verify(webhook.secret, signature, request["body"])
        assert not signature_verify(
            webhook.secret, signature, request["body"].replace(b"cancelled", b"succeeded")
        )
        other = every if webhook == on_cancel else on_cancel
        assert not signature_verify(other.secret, signature, request["body"])
    assert [(d.status, d.attempts, d.last_response_code, d.last_error) for d in _fresh(deliveries)] == [
        (D.DELIVERED, 1, 200, ""),
        (D.DELIVERED, 1, 200, ""),
    ]


def _fresh(deliveries: list[WebhookDelivery]) -> list[WebhookDelivery]:
    return [WebhookDelivery.objects.get(pk=d.pk) for d in deliveries]


def test_a_new_run_announces_itself_as_queued(lab, receiver):
    webhook = make_webhook(lab, receiver.url, statuses=["queued"])
    run = make_run(lab)
    delivery = WebhookDelivery.objects.get()
    assert (delivery.webhook_id, delivery.run_id, delivery.event.data) == (
        webhook.pk,
        run.pk,
        {"status": "queued"},
    )
    assert delivery.payload["data"]["status"] == "queued" and delivery.payload["data"]["message"] == "queued"


def test_the_statuses_filter_picks_which_changes_are_sent(lab, receiver):
    endings = make_webhook(lab, receiver.url, statuses=["failed", "succeeded"])
    run = make_run(lab)
    lifecycle.run_pause(run=run)  # queued -> paused
    lifecycle.run_resume(run=run)  # paused -> queued
    assert WebhookDelivery.objects.count() == 0
    lifecycle.run_fail(run=run, message="out of memory", where="learner, step 3")
    delivery = WebhookDelivery.objects.get()
    assert (delivery.webhook_id, delivery.payload["data"]["status"]) == (endings.pk, "failed")
    assert delivery.payload["data"]["run"]["error"] == {
        "message": "out of memory",
        "where": "learner, step 3",
    }


def test_a_transition_rolled_back_leaves_no_delivery(lab, receiver):
    make_webhook(lab, receiver.url)
    run = make_run(lab)
    with pytest.raises(RuntimeError), transaction.atomic():
        lifecycle.run_cancel(run=run)
        raise RuntimeError("the caller's transaction fails after the transition")
    assert list(WebhookDelivery.objects.values_list("payload__data__status", flat=True)) == ["queued"]
    assert Run.objects.get(pk=run.pk).status == S.QUEUED


# --- retries -------------------------------------------------------------------------------


def test_a_receiver_failing_twice_then_answering_gets_it_on_the_third_attempt(lab, receiver):
    receiver.answers = [500, 500]
    delivery = cancelled_run_delivery(lab, make_webhook(lab, receiver.url))
    t0 = timezone.now()

    first = services.delivery_attempt(delivery_id=delivery.pk, now=t0)
    assert (first.status, first.attempts, first.last_response_code) == (D.PENDING, 1, 500)
    assert first.last_error.startswith("HTTP 500 Internal Server Error")
    assert first.next_attempt_at == t0 + timedelta(seconds=10)
    assert services.delivery_attempt(delivery_id=delivery.pk, now=t0 + timedelta(seconds=9)) is None

    second = services.delivery_attempt(delivery_id=delivery.pk, now=t0 + timedelta(seconds=10))
    assert (second.status, second.attempts, second.next_attempt_at) == (
        D.PENDING,
        2,
        t0 + timedelta(seconds=40),
    )
    third = services.delivery_attempt(delivery_id=delivery.pk, now=t0 + timedelta(seconds=40))
    assert (third.status, third.attempts, third.last_response_code, third.last_error) == (
        D.DELIVERED,
        3,
        200,
        "",
    )
    assert (third.delivered_at, third.next_attempt_at) == (t0 + timedelta(seconds=40), None)
    assert delivered_to(receiver) == [delivery.pk] * 3
    assert len({request["body"] for request in receiver.requests}) == 1  # the same body each time


def test_an_unreachable_receiver_ends_failed_after_the_last_attempt(lab, closed_port_url, settings):
    settings.FLYWHEEL_WEBHOOK_MAX_ATTEMPTS = 4
    delivery = cancelled_run_delivery(lab, make_webhook(lab, closed_port_url))
    now, waits = timezone.now(), []
    for _ in range(4):
        delivery = services.delivery_attempt(delivery_id=delivery.pk, now=now)
        if delivery.next_attempt_at is not None:
            waits.append((delivery.next_attempt_at - now).total_seconds())
            now = delivery.next_attempt_at
    assert waits == [10, 30, 120]
    assert (delivery.status, delivery.attempts, delivery.last_response_code, delivery.next_attempt_at) == (
        D.FAILED,
        4,
        None,
        None,
    )
    assert "refused" in delivery.last_error.lower()
    assert services.delivery_attempt(delivery_id=delivery.pk, now=now + timedelta(days=1)) is None


def test_a_redirect_is_an_answer_not_a_hop(lab, receiver):
    receiver.answers = [302]
    delivery = cancelled_run_delivery(lab, make_webhook(lab, receiver.url))
    delivery = services.delivery_attempt(delivery_id=delivery.pk)
    assert (delivery.status, delivery.last_response_code, len(receiver.requests)) == (D.PENDING, 302, 1)


# --- duplicates and lost messages ----------------------------------------------------------


def test_a_duplicated_task_message_does_not_send_twice(lab, receiver):
    webhook = make_webhook(lab, receiver.url)
    delivered = cancelled_run_delivery(lab, webhook)
    tasks.webhook_deliver(delivered.pk)
    tasks.webhook_deliver(delivered.pk)  # the broker delivered the message again
    assert delivered_to(receiver) == [delivered.pk]

    in_flight = cancelled_run_delivery(lab, webhook)
    assert services.delivery_claim(delivery_id=in_flight.pk, now=timezone.now()) is not None
    tasks.webhook_deliver(in_flight.pk)  # a second message while a worker is still POSTing
    assert delivered_to(receiver) == [delivered.pk]

    receiver.answers = [503]
    retrying = cancelled_run_delivery(lab, webhook)
    tasks.webhook_deliver(retrying.pk)
    tasks.webhook_deliver(retrying.pk)  # before its retry is due
    assert delivered_to(receiver) == [delivered.pk, retrying.pk]
    assert [(d.status, d.attempts) for d in _fresh([delivered, in_flight, retrying])] == [
        (D.DELIVERED, 1),
        (D.PENDING, 1),
        (D.PENDING, 1),
    ]


def test_the_tick_sends_again_a_delivery_whose_message_was_lost(lab, receiver):
    webhook = make_webhook(lab, receiver.url)
    lost = services.webhook_ping(webhook=webhook)  # its message never left (no commit in this test)
    fresh = services.webhook_ping(webhook=webhook)
    done = services.webhook_ping(webhook=webhook)
    WebhookDelivery.objects.filter(pk=done.pk).update(status=D.DELIVERED)
    an_hour_ago = timezone.now() - timedelta(hours=1)
    WebhookDelivery.objects.filter(pk__in=[lost.pk, done.pk]).update(next_attempt_at=an_hour_ago)

    with mock.patch.object(tasks.webhook_deliver, "delay", side_effect=tasks.webhook_deliver) as send:
        runs_tick()
    assert [c.args for c in send.call_args_list] == [(lost.pk,)]
    assert delivered_to(receiver) == [lost.pk]
    assert [d.status for d in _fresh([lost, fresh, done])] == [D.DELIVERED, D.PENDING, D.DELIVERED]


def test_a_delivery_held_by_a_dead_worker_is_sent_again_when_its_claim_runs_out(lab, receiver, settings):
    settings.FLYWHEEL_WEBHOOK_TIMEOUT_SECONDS = 5
    delivery = services.webhook_ping(webhook=make_webhook(lab, receiver.url))
    t0 = timezone.now()
    services.delivery_claim(delivery_id=delivery.pk, now=t0)  # and then the worker died
    assert selectors.deliveries_overdue(now=t0 + timedelta(seconds=65 + 59)) == []
    assert selectors.deliveries_overdue(now=t0 + timedelta(seconds=65 + 60)) == [delivery.pk]
    delivery = services.delivery_attempt(delivery_id=delivery.pk, now=t0 + timedelta(seconds=125))
    assert (delivery.status, delivery.attempts, delivered_to(receiver)) == (D.DELIVERED, 2, [delivery.pk])


def test_an_inactive_webhook_holds_its_deliveries_until_it_is_active_again(lab, receiver):
    webhook = make_webhook(lab, receiver.url)
    delivery = services.webhook_ping(webhook=webhook)
    services.webhook_update(webhook=webhook, active=False)
    assert services.delivery_attempt(delivery_id=delivery.pk) is None
    assert selectors.deliveries_overdue(now=timezone.now() + timedelta(hours=1)) == []
    services.webhook_update(webhook=webhook, active=True)
    assert services.delivery_attempt(delivery_id=delivery.pk).status == D.DELIVERED


# --- REST ----------------------------------------------------------------------------------


def create(client, lab, **body):
    return client.post("/api/v1/webhooks", {"project": lab["project"].pk, **body}, format="json")


def test_the_secret_is_shown_once_and_never_again(lab, receiver):
    owner = api_client_for(lab["owner"])
    created = owner.post(
        "/api/v1/webhooks",
        {"project": lab["project"].pk, "url": receiver.url, "statuses": ["succeeded", "failed"]},
        format="json",
        HTTP_IDEMPOTENCY_KEY="hook-1",
    )
    assert created.status_code == 201
    body = created.json()
    secret = body.pop("secret")
    webhook = Webhook.objects.get()
    assert secret.startswith("whsec_") and secret == webhook.secret
    assert body == {
        "id": webhook.pk,
        "project": lab["project"].pk,
        "url": receiver.url,
        "description": "",
        "statuses": ["failed", "succeeded"],
        "events": [],
        "active": True,
        "created_by": lab["owner"].pk,
        "created_at": webhook.created_at.isoformat().replace("+00:00", "Z"),
    }
    services.webhook_ping(webhook=webhook)
    answers = [
        owner.get("/api/v1/webhooks"),
        owner.get(f"/api/v1/webhooks?project={lab['project'].pk}"),
        owner.get(f"/api/v1/webhooks/{webhook.pk}"),
        owner.patch(f"/api/v1/webhooks/{webhook.pk}", {"description": "ci"}, format="json"),
        owner.get(f"/api/v1/webhooks/{webhook.pk}/deliveries"),
        owner.post(f"/api/v1/webhooks/{webhook.pk}/ping"),
    ]
    assert [a.status_code for a in answers] == [200, 200, 200, 200, 200, 202]
    for answer in answers:
        assert secret not in answer.content.decode() and "secret" not in answer.content.decode()
    replay = owner.post(
        "/api/v1/webhooks",
        {"project": lab["project"].pk, "url": receiver.url, "statuses": ["succeeded", "failed"]},
        format="json",
        HTTP_IDEMPOTENCY_KEY="hook-1",
    )
    assert (replay.status_code, replay["Idempotent-Replayed"], replay.json()["secret"]) == (201, "true", None)
    assert Webhook.objects.count() == 1


@pytest.mark.parametrize(
    "url",
    ["ftp://example.com/hook", "example.com/hook", "http://", "javascript:alert(1)", "https://a b/", ""],
)
def test_a_url_that_is_not_http_or_https_is_refused_naming_the_field(lab, url):
    owner = api_client_for(lab["owner"])
    response = create(owner, lab, url=url)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", "url")
    assert error["message"].startswith("url: ")
    assert Webhook.objects.count() == 0


def test_a_bad_change_is_refused_and_changes_nothing(lab, receiver):
    owner = api_client_for(lab["owner"])
    webhook = make_webhook(lab, receiver.url)
    bad_url = owner.patch(f"/api/v1/webhooks/{webhook.pk}", {"url": "file:///etc/passwd"}, format="json")
    bad_status = owner.patch(f"/api/v1/webhooks/{webhook.pk}", {"statuses": ["done"]}, format="json")
    assert (bad_url.status_code, bad_url.json()["error"]["param"]) == (400, "url")
    assert (bad_status.status_code, bad_status.json()["error"]["param"]) == (400, "statuses[0]")
    webhook.refresh_from_db()
    assert (webhook.url, webhook.statuses) == (receiver.url, [])


def test_redelivery_sends_the_same_delivery_again_and_a_pending_one_answers_409(lab, receiver):
    owner = api_client_for(lab["owner"])
    webhook = make_webhook(lab, receiver.url)
    delivery = cancelled_run_delivery(lab, webhook)
    url = f"/api/v1/webhooks/{webhook.pk}/deliveries/{delivery.pk}/redeliver"
    pending = owner.post(url)
    assert (pending.status_code, pending.json()["error"]["code"]) == (409, "conflict")
    tasks.webhook_deliver(delivery.pk)

    again = owner.post(url)
    assert again.status_code == 202
    assert (again.json()["status"], again.json()["attempts"]) == ("pending", 0)
    tasks.webhook_deliver(delivery.pk)
    assert delivered_to(receiver) == [delivery.pk, delivery.pk]
    assert receiver.requests[0]["body"] == receiver.requests[1]["body"]
    listed = owner.get(f"/api/v1/webhooks/{webhook.pk}/deliveries").json()["results"]
    assert [(d["id"], d["status"], d["attempts"], d["last_response_code"]) for d in listed] == [
        (delivery.pk, "delivered", 1, 200),
        (delivery.pk - 1, "pending", 0, None),  # the run's queued, never sent in this test
    ]
    other = make_webhook(lab, receiver.url)
    assert owner.post(f"/api/v1/webhooks/{other.pk}/deliveries/{delivery.pk}/redeliver").status_code == 404


def test_ping_sends_a_signed_test_event(lab, receiver):
    owner = api_client_for(lab["owner"])
    webhook = make_webhook(lab, receiver.url)
    response = owner.post(f"/api/v1/webhooks/{webhook.pk}/ping")
    assert (response.status_code, response.json()["type"], response.json()["run"]) == (202, "ping", None)
    tasks.webhook_deliver(response.json()["id"])
    [request] = receiver.requests
    assert request["headers"]["Flywheel-Event"] == "ping"
    assert json.loads(request["body"])["data"] == {
        "webhook": webhook.pk,
        "project": lab["project"].pk,
        "message": "a test event from Flywheel: this webhook is set up",
    }
    assert signature_verify(webhook.secret, request["headers"]["Flywheel-Signature"], request["body"])
    owner.patch(f"/api/v1/webhooks/{webhook.pk}", {"active": False}, format="json")
    assert owner.post(f"/api/v1/webhooks/{webhook.pk}/ping").status_code == 409
    assert WebhookDelivery.objects.count() == 1


def test_deliveries_list_newest_first_by_cursor(lab, receiver):
    owner = api_client_for(lab["owner"])
    webhook = make_webhook(lab, receiver.url)
    pings = [services.webhook_ping(webhook=webhook).pk for _ in range(3)]
    first = owner.get(f"/api/v1/webhooks/{webhook.pk}/deliveries?limit=2").json()
    second = owner.get(first["next"]).json()
    assert [d["id"] for d in first["results"] + second["results"]] == pings[::-1]
    assert owner.get(f"/api/v1/webhooks/{webhook.pk}/deliveries?status=failed").json()["results"] == []


def test_a_member_who_does_not_own_the_project_lists_no_webhooks(lab, receiver):
    make_webhook(lab, receiver.url)
    launcher = api_client_for(lab["launcher"])
    assert launcher.get("/api/v1/webhooks").json()["results"] == []
    assert launcher.get(f"/api/v1/webhooks?project={lab['project'].pk}").status_code == 403
    outsider = api_client_for(lab["outsider"])
    assert outsider.get(f"/api/v1/webhooks?project={lab['project'].pk}").status_code == 404


# --- the page ------------------------------------------------------------------------------


def test_owners_manage_webhooks_on_the_page(client, lab, receiver):
    client.force_login(lab["owner"])
    page = f"/projects/{lab['project'].pk}/webhooks/"
    assert f'href="{page}"' in client.get(f"/projects/{lab['project'].pk}/").content.decode()

    added = client.post(page, {"url": receiver.url, "description": "ci", "statuses": ["succeeded"]})
    webhook = Webhook.objects.get()
    assert (webhook.url, webhook.description, webhook.statuses) == (receiver.url, "ci", ["succeeded"])
    assert webhook.secret in added.content.decode()
    assert webhook.secret not in client.get(page).content.decode()

    client.post(f"/webhooks/{webhook.pk}/ping/")
    tasks.webhook_deliver(WebhookDelivery.objects.get().pk)
    listing = client.get(page).content.decode()
    assert 'id="delivery-table"' in listing and "delivered" in listing and ">200<" in listing

    refused = client.post(page, {"url": "gopher://old.example/"})
    assert "must start with http:// or https://" in refused.content.decode()
    client.post(f"/webhooks/{webhook.pk}/delete/")
    assert Webhook.objects.count() == 0 and WebhookDelivery.objects.count() == 0


def test_the_page_is_for_owners_only(client, lab):
    client.force_login(lab["launcher"])
    assert 'id="webhooks-link"' not in client.get(f"/projects/{lab['project'].pk}/").content.decode()
    assert client.get(f"/projects/{lab['project'].pk}/webhooks/").status_code == 403
    client.force_login(lab["outsider"])
    assert client.get(f"/projects/{lab['project'].pk}/webhooks/").status_code == 404


def test_the_readme_receiver_snippet_agrees_with_the_signer():
    readme = (Path(__file__).resolve().parent.parent / "docs" / "guides" / "automate.md").read_text()
    snippet = readme.split("## Webhooks", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(snippet, namespace)  # our own README's code
    verify = namespace["flywheel_signature_ok"]
    header = signature_header("whsec_readme", b'{"id":1}')
    assert verify("whsec_readme", header, b'{"id":1}')
    assert not verify("whsec_readme", header, b'{"id":2}')
    assert not verify("whsec_other", header, b'{"id":1}')
    assert not verify("whsec_readme", signature_header("whsec_readme", b"{}", timestamp=1), b"{}")


# --- only public addresses, unless allowed -------------------------------------------------


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("http://127.0.0.1:8000/hook", "127.0.0.1"),
        ("http://localhost/hook", "127.0.0.1"),
        ("http://[::1]/hook", "::1"),
        ("http://[::ffff:10.1.2.3]/hook", "::ffff:a01:203"),
        ("http://169.254.169.254/latest/meta-data", "169.254.169.254"),
        ("https://192.168.1.20/hook", "192.168.1.20"),
    ],
)
def test_a_private_address_is_refused_at_registration(lab, settings, url, address):
    settings.FLYWHEEL_WEBHOOK_ALLOW_PRIVATE = False
    with pytest.raises(ValidationError) as refused:
        make_webhook(lab, url)
    assert refused.value.message_dict == {
        "url": [f"points to {address}, a private address (FLYWHEEL_WEBHOOK_ALLOW_PRIVATE=true allows those)"]
    }
    assert not Webhook.objects.exists()
    assert make_webhook(lab, "https://hooks.example.com/flywheel").url == "https://hooks.example.com/flywheel"


def test_a_name_that_resolves_to_a_private_address_gets_nothing_sent(lab, receiver, settings):
    """Checked where the connection is made: the receiver, reachable, hears nothing."""
    settings.FLYWHEEL_WEBHOOK_ALLOW_PRIVATE = False
    by_name = receiver.url.replace("127.0.0.1", "localhost")
    webhook = Webhook.objects.create(project=lab["project"], url=by_name, secret="whsec_x")  # as if older
    delivery = services.webhook_ping(webhook=webhook)
    attempted = services.delivery_attempt(delivery_id=delivery.pk)
    assert receiver.requests == []
    assert (attempted.status, attempted.attempts, attempted.last_response_code) == (D.PENDING, 1, None)
    assert attempted.last_error.startswith("localhost resolves to ")
    assert "a private address; webhooks go to public ones" in attempted.last_error

    settings.FLYWHEEL_WEBHOOK_ALLOW_PRIVATE = True
    again = services.delivery_attempt(delivery_id=delivery.pk, now=timezone.now() + timedelta(hours=1))
    assert (again.status, delivered_to(receiver)) == (D.DELIVERED, [delivery.pk])


# --- rotating the signing secret -----------------------------------------------------------


def test_rotating_the_secret_signs_with_both_for_a_day_then_with_the_new_one(lab, receiver):
    webhook = make_webhook(lab, receiver.url)
    old = webhook.secret
    t0 = timezone.now()
    new = services.webhook_secret_rotate(webhook=webhook, now=t0)
    webhook.refresh_from_db()
    assert new.startswith("whsec_") and new != old and webhook.secret == new
    assert webhook.previous_secret_expires_at == t0 + timedelta(hours=24)

    ping = services.webhook_ping(webhook=webhook)
    during = services.delivery_attempt(delivery_id=ping.pk, now=t0 + timedelta(minutes=1))
    after = services.webhook_ping(webhook=webhook)
    services.delivery_attempt(delivery_id=after.pk, now=t0 + timedelta(hours=24, seconds=1))
    assert [d.status for d in (during, WebhookDelivery.objects.get(pk=after.pk))] == [D.DELIVERED] * 2
    (first, second) = receiver.requests
    for request, secrets in ((first, [new, old]), (second, [new])):
        header = request["headers"]["Flywheel-Signature"]
        assert header.count("v1=") == len(secrets)
        assert all(signature_verify(secret, header, request["body"]) for secret in secrets)
    assert not signature_verify(old, second["headers"]["Flywheel-Signature"], second["body"])


def test_the_new_secret_is_shown_once_over_rest_and_on_the_page(lab):
    webhook = make_webhook(lab, "https://hooks.example.com/a")
    owner = api_client_for(lab["owner"])
    answer = owner.post(f"/api/v1/webhooks/{webhook.pk}/rotate-secret", format="json")
    assert answer.status_code == 200
    webhook.refresh_from_db()
    assert answer.json()["secret"] == webhook.secret
    assert answer.json()["webhook"]["id"] == webhook.pk
    assert "secret" not in owner.get(f"/api/v1/webhooks/{webhook.pk}").json()

    from django.test import Client

    page = Client()
    page.force_login(lab["owner"])
    response = page.post(f"/webhooks/{webhook.pk}/rotate-secret/")
    webhook.refresh_from_db()
    assert response.status_code == 200
    assert webhook.secret in response.content.decode()
    assert webhook.secret not in page.get(f"/projects/{lab['project'].pk}/webhooks/").content.decode()

"""The front door: sign-in and token lockouts, security headers and cookie flags (with
FLYWHEEL_HTTPS on a real server), what /healthz and /metrics show to whom, file modes, webhook
secrets encrypted at rest, and websockets with a token but no Origin."""

import json
import logging
import os
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.db import connection
from rest_framework.test import APIClient

from core import lockout
from core.tokens import token_digest
from projects import services as project_services
from runs.consumers import CLOSE_UNAUTHENTICATED
from tests.conftest import make_project, make_user
from tests.run_harness import wait_until, worker_env
from tests.web_server import WebServer
from webapp.asgi import application
from webhooks import services as webhook_services
from webhooks.models import Webhook
from webhooks.signing import signature_verify as verify

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 10


@pytest.fixture
def addresses():
    """Addresses of this test alone; their counts and lockouts are cleared afterwards."""
    used: list[tuple[str, str | None]] = []

    def address(username: str | None = None) -> str:
        value = f"10.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250 + 1}"
        used.append((value, username))
        return value

    yield address
    for value, username in used:
        lockout.forget(value, username)


@pytest.fixture
def limits(settings):
    settings.FLYWHEEL_LOGIN_MAX_FAILURES = LIMIT
    settings.FLYWHEEL_LOGIN_LOCKOUT_SECONDS = 900


def sign_in(client, username: str, password: str, address: str):
    return client.post("/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


def signed_in(client) -> bool:
    return "_auth_user_id" in client.session


# --- lockouts ------------------------------------------------------------------------------


def test_fifty_wrong_passwords_lock_the_account_and_the_right_one_is_refused_then(
    client, db, limits, addresses, caplog
):
    user = make_user(f"ada-{uuid.uuid4().hex[:6]}", password="right-password")
    where = addresses(user.username)
    caplog.set_level(logging.INFO, logger="flywheel.security")
    for _ in range(50):
        assert sign_in(client, user.username, "wrong", where).status_code == 200
    response = sign_in(client, user.username, "right-password", where)
    assert not signed_in(client)
    assert "too many failed sign-ins; try again in 15 min" in response.content.decode()
    locked = [r.getMessage() for r in caplog.records if r.getMessage().startswith("locked out")]
    assert locked == [
        f"locked out address {where} for 900 s after {LIMIT} failed sign-ins",
        f"locked out account {user.username.lower()} for 900 s after {LIMIT} failed sign-ins",
    ]
    refused = [
        r
        for r in caplog.records
        if r.getMessage().startswith(f"refused sign-in of account '{user.username}'")
    ]
    assert len(refused) == 50 - LIMIT + 1  # every attempt during the lockout, the right one too


def test_the_account_is_locked_from_every_address_and_the_address_for_every_account(
    client, db, limits, addresses
):
    victim = make_user(f"bob-{uuid.uuid4().hex[:6]}", password="right-password")
    for _ in range(LIMIT):  # one guess from each of many addresses
        sign_in(client, victim.username, "wrong", addresses(victim.username))
    sign_in(client, victim.username, "right-password", addresses(victim.username))
    assert not signed_in(client)

    guesser = addresses()
    for index in range(LIMIT):  # one guess at each of many accounts, from one address
        sign_in(client, f"nobody-{index}", "wrong", guesser)
    other = make_user(f"cy-{uuid.uuid4().hex[:6]}", password="right-password")
    addresses(other.username)
    sign_in(client, other.username, "right-password", guesser)
    assert not signed_in(client)
    sign_in(client, other.username, "right-password", addresses(other.username))
    assert signed_in(client)  # the same account from another address


def test_the_lockout_ends_after_its_window(client, db, settings, addresses):
    settings.FLYWHEEL_LOGIN_MAX_FAILURES = 3
    settings.FLYWHEEL_LOGIN_LOCKOUT_SECONDS = 2
    user = make_user(f"dee-{uuid.uuid4().hex[:6]}", password="right-password")
    where = addresses(user.username)
    for _ in range(3):
        sign_in(client, user.username, "wrong", where)
    sign_in(client, user.username, "right-password", where)
    assert not signed_in(client)
    wait_until(
        lambda: sign_in(client, user.username, "right-password", where) and signed_in(client),
        "the lockout to end",
        timeout=10,
    )


def test_ten_bad_tokens_leave_valid_tokens_working_and_refuse_the_guessers_address(
    db, limits, addresses, caplog
):
    user = make_user(f"eve-{uuid.uuid4().hex[:6]}")
    _, token = project_services.api_token_create(user=user, name="t")
    guesser = addresses()
    client = APIClient()
    for index in range(LIMIT):
        response = client.get("/api/v1/me", HTTP_AUTHORIZATION=f"Bearer fw_guess{index}", REMOTE_ADDR=guesser)
        assert response.status_code == 401
    # The next guess from that address is refused before it is looked at...
    response = client.get("/api/v1/me", HTTP_AUTHORIZATION="Bearer fw_guess-more", REMOTE_ADDR=guesser)
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "rate_limited" and int(response["Retry-After"]) > 800
    assert "too many unknown or revoked API tokens" in response.json()["error"]["message"]
    # ...while a valid token from the same address (the same proxy or NAT) still works.
    response = client.get("/api/v1/me", HTTP_AUTHORIZATION=f"Bearer {token}", REMOTE_ADDR=guesser)
    assert response.status_code == 200 and response.json()["username"] == user.username
    assert (
        f"locked out unknown API tokens from address {guesser} for 900 s after {LIMIT} failures"
        in caplog.text
    )


def test_one_bad_token_repeated_from_many_addresses_is_locked_itself(db, limits, addresses):
    client = APIClient()
    for _ in range(LIMIT):
        client.get("/api/v1/me", HTTP_AUTHORIZATION="Bearer fw_revoked-one", REMOTE_ADDR=addresses())
    response = client.get("/api/v1/me", HTTP_AUTHORIZATION="Bearer fw_revoked-one", REMOTE_ADDR=addresses())
    assert response.status_code == 429
    response = client.get("/api/v1/me", HTTP_AUTHORIZATION="Bearer fw_other", REMOTE_ADDR=addresses())
    assert response.status_code == 401  # another address with another token: counted afresh
    lockout.token_forget("", token_digest("fw_revoked-one"))


def test_the_client_address_header_counts_only_from_a_trusted_proxy(db, limits, addresses, settings):
    settings.FLYWHEEL_TRUSTED_PROXIES = ["192.0.2.0/24"]
    proxy, spoofer, client_behind, other_behind = "192.0.2.7", addresses(), addresses(), addresses()
    client = APIClient()

    def guess(peer: str, forwarded: str) -> int:
        return client.get(
            "/api/v1/me",
            HTTP_AUTHORIZATION="Bearer fw_x" + uuid.uuid4().hex,
            REMOTE_ADDR=peer,
            HTTP_X_FORWARDED_FOR=forwarded,
        ).status_code

    # Through the proxy: the client it names is counted, the proxy itself is not.
    for _ in range(LIMIT):
        assert guess(proxy, f"203.0.113.9, {client_behind}") == 401
    assert guess(proxy, client_behind) == 429
    assert guess(proxy, other_behind) == 401
    # From anyone else the header is ignored: a guesser cannot pin its guesses on someone else.
    for _ in range(LIMIT):
        assert guess(spoofer, other_behind) == 401
    assert guess(spoofer, addresses()) == 429
    assert guess(proxy, other_behind) == 401
    lockout.forget(proxy)


@pytest.mark.django_db(transaction=True)
def test_a_valid_token_connects_its_websocket_from_an_address_locked_for_bad_tokens(team, limits, addresses):
    _, token = project_services.api_token_create(user=team["owner"], name="t")
    where = addresses()

    async def connect(raw: str) -> tuple[bool, int]:
        scope_headers = [(b"authorization", f"Bearer {raw}".encode())]
        communicator = WebsocketCommunicator(
            application, f"/ws/projects/{team['project'].pk}/", scope_headers
        )
        communicator.scope["client"] = (where, 5555)
        connected, code = await communicator.connect(timeout=5)
        await communicator.disconnect()
        return connected, code

    for index in range(LIMIT):
        assert async_to_sync(connect)(f"fw_guess{index}") == (False, CLOSE_UNAUTHENTICATED)
    assert lockout.token_locked_for(where, "") > 0
    assert async_to_sync(connect)(token)[0] is True


# --- websockets: a token needs no Origin, a browser session does -----------------------------


def ws_connect(path: str, headers) -> tuple[bool, int | None]:
    async def scenario():
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, code = await communicator.connect(timeout=5)
        if connected:
            await communicator.disconnect()
        return connected, code

    return async_to_sync(scenario)()


@pytest.mark.django_db(transaction=True)
def test_a_script_with_a_token_and_no_origin_connects_while_a_browser_session_needs_its_origin(team, client):
    path = f"/ws/projects/{team['project'].pk}/"
    _, token = project_services.api_token_create(user=team["owner"], name="script")
    assert ws_connect(path, [(b"authorization", f"Bearer {token}".encode())])[0] is True

    client.force_login(team["owner"])
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    assert ws_connect(path, [(b"cookie", cookie)])[0] is False  # no Origin
    assert ws_connect(path, [(b"cookie", cookie), (b"origin", b"https://evil.example")])[0] is False
    assert ws_connect(path, [(b"cookie", cookie), (b"origin", b"http://127.0.0.1")])[0] is True


# --- headers and cookies -------------------------------------------------------------------


def test_every_answer_carries_the_content_security_policy_and_no_hsts_over_plain_http(client, db):
    for path in ("/accounts/login/", "/api/v1/me", "/healthz"):
        response = client.get(path)
        policy = response["Content-Security-Policy"]
        assert (
            "default-src 'self'" in policy
            and "script-src 'self'" in policy
            and "'unsafe-inline'" not in policy
        )
        assert response["X-Frame-Options"] == "DENY" and response["X-Content-Type-Options"] == "nosniff"
        assert response["Referrer-Policy"] == "same-origin"
        assert "Strict-Transport-Security" not in response


@pytest.fixture(scope="module")
def https_server(tmp_path_factory, django_db_setup, django_db_blocker):
    env = worker_env(FLYWHEEL_HTTPS="true")
    with WebServer(env, tmp_path_factory.mktemp("https") / "web.log") as web:
        yield web


def test_with_flywheel_https_the_server_sends_hsts_and_secure_cookies_and_redirects_plain_http(
    https_server, transactional_db, settings
):
    from django.conf import global_settings

    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS  # the server checks with these
    make_user("ada", password="right-password")
    proxied = {"X-Forwarded-Proto": "https"}
    session = requests.Session()
    page = session.get(f"{https_server.url}/accounts/login/", headers=proxied, timeout=10)
    assert page.status_code == 200
    assert page.headers["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains"
    csrf = page.cookies["csrftoken"]
    assert "secure" in page.headers["Set-Cookie"].lower()
    signed = session.post(
        f"{https_server.url}/accounts/login/",
        data={"username": "ada", "password": "right-password", "csrfmiddlewaretoken": csrf},
        headers=proxied | {"Referer": f"https://127.0.0.1:{https_server.port}/accounts/login/"},
        cookies={"csrftoken": csrf},  # a Secure cookie: the client keeps it off plain http by itself
        allow_redirects=False,
        timeout=10,
    )
    assert signed.status_code == 302
    session_cookie = next(c for c in signed.raw.headers.getlist("Set-Cookie") if c.startswith("sessionid="))
    assert "Secure" in session_cookie and "HttpOnly" in session_cookie and "SameSite=Lax" in session_cookie
    plain = requests.get(f"{https_server.url}/accounts/login/", allow_redirects=False, timeout=10)
    assert (plain.status_code, plain.headers["Location"]) == (
        301,
        f"https://127.0.0.1:{https_server.port}/accounts/login/",
    )
    probe = requests.get(f"{https_server.url}/healthz", allow_redirects=False, timeout=10)
    assert probe.status_code in (200, 503)  # internal probes over plain HTTP are not redirected


# --- /healthz and /metrics -------------------------------------------------------------------


def test_anyone_gets_the_bare_health_status_and_only_operators_the_detail(client, db, settings):
    bare = client.get("/healthz")
    assert set(bare.json()) == {"status"}
    token = {"HTTP_AUTHORIZATION": f"Bearer {settings.FLYWHEEL_OPS_TOKEN}"}
    detail = client.get("/healthz", **token)
    assert detail.status_code == bare.status_code
    assert {"status", "database", "redis", "queues", "sandboxes"} <= set(detail.json())
    assert set(client.get("/healthz", HTTP_AUTHORIZATION="Bearer not-it").json()) == {"status"}
    settings.FLYWHEEL_OPS_ALLOW = ["127.0.0.0/8"]
    assert "database" in client.get("/healthz").json()
    assert set(client.get("/healthz", REMOTE_ADDR="10.1.2.3").json()) == {"status"}


def test_the_metrics_need_the_operations_token_or_an_allowed_address(client, db, settings):
    refused = client.get("/metrics")
    assert refused.status_code == 401 and refused["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert refused.json()["error"]["code"] == "unauthenticated"
    owner = make_user("m")
    make_project(owner)
    user_token = {
        "HTTP_AUTHORIZATION": "Bearer " + project_services.api_token_create(user=owner, name="t")[1]
    }
    assert client.get("/metrics", **user_token).status_code == 401  # a user's API token is not it
    ops = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {settings.FLYWHEEL_OPS_TOKEN}")
    assert ops.status_code == 200 and "flywheel_projects 1.0" in ops.content.decode()
    settings.FLYWHEEL_OPS_ALLOW = ["127.0.0.1/32"]
    assert client.get("/metrics").status_code == 200


# --- files on disk -----------------------------------------------------------------------------


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_embedded_default_keeps_its_home_database_and_secrets_private(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    (home / "secret_key").write_text("an-old-key-left-world-readable")
    (home / "secret_key").chmod(0o644)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "FLYWHEEL_SECRET_KEY")}
    env |= {"FLYWHEEL_HOME": str(home), "DJANGO_SETTINGS_MODULE": "webapp.settings"}
    # Modes read while the connection is open: SQLite removes its -wal and -shm files on closing.
    write = (
        "import django, json, os, stat; django.setup(); from django.db import connection; "
        "connection.cursor().execute('CREATE TABLE probe (x integer)'); "
        "home = os.environ['FLYWHEEL_HOME']; "
        "names = ['secret_key', 'ops_token', 'db.sqlite3', 'db.sqlite3-wal', 'db.sqlite3-shm']; "
        "print(json.dumps({n: oct(stat.S_IMODE(os.stat(os.path.join(home, n)).st_mode)) for n in names}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", write],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
    )
    modes = json.loads(done.stdout.strip().splitlines()[-1])
    assert modes == {name: oct(0o600) for name in modes} and len(modes) == 5
    assert mode(home) == 0o700
    assert (home / "secret_key").read_text() == "an-old-key-left-world-readable"


# --- webhook secrets at rest -------------------------------------------------------------------


def stored_secrets(webhook_id: int) -> tuple[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT secret, previous_secret FROM webhooks_webhook WHERE id = %s", [webhook_id])
        return cursor.fetchone()


@pytest.fixture
def webhook(team, settings):
    settings.FLYWHEEL_WEBHOOK_ALLOW_PRIVATE = True
    return webhook_services.webhook_create(
        project=team["project"], by=team["owner"], url="http://127.0.0.1:9/"
    )


def test_a_webhook_secret_is_encrypted_in_the_database_and_still_signs(webhook):
    shown = webhook.secret
    raw, _ = stored_secrets(webhook.pk)
    assert raw.startswith("enc:v1:") and shown not in raw
    fresh = Webhook.objects.get(pk=webhook.pk)
    assert fresh.secret == shown
    body = b'{"id": 1}'
    headers = webhook_services.delivery_headers(_delivery(fresh), body, fresh.signing_secrets(_now()))
    assert verify(shown, headers["Flywheel-Signature"], body)


def test_a_rotated_secret_is_encrypted_too_and_both_sign_during_the_overlap(webhook):
    old = webhook.secret
    new = webhook_services.webhook_secret_rotate(webhook=webhook)
    raw_new, raw_old = stored_secrets(webhook.pk)
    assert raw_new.startswith("enc:v1:") and raw_old.startswith("enc:v1:") and old not in raw_old
    fresh = Webhook.objects.get(pk=webhook.pk)
    assert fresh.signing_secrets(_now()) == [new, old]
    header = webhook_services.delivery_headers(_delivery(fresh), b"{}", fresh.signing_secrets(_now()))
    assert verify(new, header["Flywheel-Signature"], b"{}") and verify(
        old, header["Flywheel-Signature"], b"{}"
    )


def test_the_migration_encrypts_secrets_stored_in_plain_text(webhook):
    from importlib import import_module

    from django.apps import apps

    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE webhooks_webhook SET secret = %s, previous_secret = %s WHERE id = %s",
            ["whsec_plain", "whsec_older", webhook.pk],
        )
    assert Webhook.objects.get(pk=webhook.pk).secret == "whsec_plain"  # read as it was stored
    migration = import_module("webhooks.migrations.0003_secrets_encrypted")
    migration.encrypt_secrets(apps, None)
    raw, raw_previous = stored_secrets(webhook.pk)
    assert raw.startswith("enc:v1:") and raw_previous.startswith("enc:v1:") and "whsec_plain" not in raw
    fresh = Webhook.objects.get(pk=webhook.pk)
    assert (fresh.secret, fresh.previous_secret) == ("whsec_plain", "whsec_older")


def test_secrets_survive_a_secret_key_rotation_with_the_old_key_as_a_fallback(webhook, settings):
    shown = webhook.secret
    old_key = settings.SECRET_KEY
    settings.SECRET_KEY = "a-brand-new-key-" + "x" * 40
    with pytest.raises(ValueError, match="SECRET_KEY_FALLBACKS"):
        Webhook.objects.get(pk=webhook.pk)
    settings.SECRET_KEY_FALLBACKS = [old_key]
    assert Webhook.objects.get(pk=webhook.pk).secret == shown


def _now():
    from django.utils import timezone

    return timezone.now()


def _delivery(webhook):
    from webhooks.models import WebhookDelivery

    return WebhookDelivery(pk=1, webhook=webhook, type=WebhookDelivery.Type.PING, payload={})

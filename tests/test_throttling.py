"""The API's per-user rate: a burst of the rate's count, then one request per interval; refused
requests are not counted; users do not share a budget; Redis' absence lets requests through."""

import time
import uuid

import pytest
from django.core.cache import cache
from redis.exceptions import ConnectionError as RedisConnectionError
from rest_framework.test import APIClient

from core import outage
from core.throttling import RedisRateThrottle
from projects import services as project_services
from tests.conftest import make_user


@pytest.fixture
def rate(monkeypatch):
    """Set the rate; the budgets of the users made by `caller` are cleared afterwards."""
    keys: list[str] = []

    def caller(per: str) -> APIClient:
        monkeypatch.setattr(RedisRateThrottle, "THROTTLE_RATES", {"user": per})
        user = make_user(f"rate-{uuid.uuid4().hex[:8]}")
        keys.append(RedisRateThrottle.budget_key(user.pk, per))
        cache.delete(keys[-1])  # Redis outlives the test database and its reused ids
        client = APIClient()
        client.credentials(
            HTTP_AUTHORIZATION=f"Bearer {project_services.api_token_create(user=user, name='t')[1]}"
        )
        return client

    yield caller
    cache.delete_many(keys)


def statuses(client: APIClient, count: int) -> list[int]:
    return [client.get("/api/v1/me").status_code for _ in range(count)]


def test_a_burst_of_the_rate_passes_then_the_next_waits_one_interval(db, rate):
    client = rate("4/hour")
    assert statuses(client, 4) == [200] * 4
    refused = client.get("/api/v1/me")
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limited"
    assert 890 < int(refused["Retry-After"]) <= 900  # an hour over 4: one request per 15 min


def test_refused_requests_are_not_counted(db, rate):
    client = rate("2/hour")
    assert statuses(client, 2) == [200, 200]
    waits = [int(client.get("/api/v1/me")["Retry-After"]) for _ in range(5)]
    assert all(1790 < wait <= 1800 for wait in waits), waits  # had they counted, the wait would grow


def test_users_have_budgets_of_their_own(db, rate):
    first, second = rate("1/hour"), rate("1/hour")
    assert statuses(first, 2) == [200, 429]
    assert statuses(second, 2) == [200, 429]


def test_the_next_request_is_let_through_once_the_interval_has_passed(db, rate):
    client = rate("1/s")
    assert client.get("/api/v1/me").status_code == 200
    refused_at = time.monotonic()
    assert client.get("/api/v1/me").status_code == 429
    while (response := client.get("/api/v1/me")).status_code == 429:
        assert time.monotonic() - refused_at < 2, "still refused a second after the interval ended"
    assert response.status_code == 200  # refusals cost nothing: the interval alone decides


def test_an_unreachable_redis_lets_requests_through(db, rate, monkeypatch):
    client = rate("1/hour")
    assert statuses(client, 2) == [200, 429]

    def unreachable(*args, **kwargs):
        raise RedisConnectionError("Connection refused")

    monkeypatch.setattr(RedisRateThrottle, "script", classmethod(lambda cls: unreachable))
    try:
        assert statuses(client, 2) == [200, 200]
        assert outage.breaker.is_open()  # and the breaker spares the next requests the attempt
    finally:
        outage.breaker._down_until = 0.0


@pytest.mark.django_db(transaction=True)
def test_requests_served_over_asgi_reuse_the_processs_redis_connections(rate):
    """Django keeps a cache object per context and ASGI gives every request a new one: the
    lockout check and the throttle must not open a Redis connection per request."""
    from asgiref.sync import async_to_sync
    from channels.testing import HttpCommunicator

    from webapp.asgi import application

    client = rate("1000/min")
    token = client._credentials["HTTP_AUTHORIZATION"].encode()

    async def get_me() -> int:
        communicator = HttpCommunicator(
            application, "GET", "/api/v1/me", headers=[(b"authorization", token), (b"host", b"127.0.0.1")]
        )
        return (await communicator.get_response(timeout=30))["status"]

    def connections_received() -> int:
        return cache._cache.get_client().info("stats")["total_connections_received"]

    assert async_to_sync(get_me)() == 200  # the pools are made
    before = connections_received()
    assert [async_to_sync(get_me)() for _ in range(20)] == [200] * 20
    assert connections_received() - before <= 3  # 20 before the shared pool; room for a stray client


def test_a_budget_that_is_not_a_number_counts_as_none(db, rate):
    client = rate("2/hour")
    me = client.get("/api/v1/me").json()["id"]
    key = RedisRateThrottle.budget_key(me, "2/hour")
    cache.set(key, [time.time(), time.time()], 600)  # a pickled list (DRF's format), not a number
    assert statuses(client, 3) == [200, 200, 429]  # a fresh budget, not a script error
    assert not outage.breaker.is_open()  # which would have refused every write for a while


def test_a_looser_rate_starts_budgets_afresh(db, rate, monkeypatch):
    client = rate("1/hour")
    assert statuses(client, 2) == [200, 429]  # the budget now holds a time an hour ahead
    monkeypatch.setattr(RedisRateThrottle, "THROTTLE_RATES", {"user": "6000/min"})
    try:
        assert statuses(client, 3) == [200, 200, 200]
    finally:
        me = client.get("/api/v1/me").json()["id"]
        cache.delete(RedisRateThrottle.budget_key(me, "6000/min"))

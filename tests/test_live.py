"""The live run: its websocket (who may watch, what it carries, the same by REST), the run
monitors, and the scale the live view promises (a million metric points, a million tokens)."""

# The fixture imported from run_fixtures is a test parameter here, not a redefinition:
# ruff: noqa: F811
import random
import time

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.roles import Role
from runs import lifecycle, monitors, selectors
from runs.consumers import CLOSE_NOT_FOUND, CLOSE_UNAUTHENTICATED
from runs.models import MetricPoint, RunEvent, TrajectoryStep
from tests.conftest import api_client_for
from tests.run_fixtures import lab, make_run, make_trajectory  # noqa: F401
from tests.test_websockets import ORIGIN, connect, headers_for

pytestmark = pytest.mark.django_db(transaction=True)


def run_path(run) -> str:
    return f"/ws/runs/{run.pk}/"


# --- who may watch ---------------------------------------------------------------------------


@pytest.mark.parametrize("role", [Role.OWNER, Role.LAUNCHER, Role.REVIEWER, Role.VIEWER])
def test_every_member_role_may_watch_a_run(lab, role):
    run, headers = make_run(lab), headers_for(lab[role])

    async def scenario():
        communicator, connected, _ = await connect(run_path(run), headers)
        await communicator.disconnect()
        return connected

    assert async_to_sync(scenario)() is True


def test_an_outsider_and_a_missing_run_are_refused_as_not_found(lab):
    run, headers = make_run(lab), headers_for(lab["outsider"])

    async def scenario(path):
        return await connect(path, headers)

    assert async_to_sync(scenario)(run_path(run))[1:] == (False, CLOSE_NOT_FOUND)
    assert async_to_sync(scenario)("/ws/runs/999999/")[1:] == (False, CLOSE_NOT_FOUND)


def test_an_anonymous_client_is_refused_as_unauthenticated(lab):
    run = make_run(lab)

    async def scenario():
        return await connect(run_path(run), [ORIGIN])

    assert async_to_sync(scenario)()[1:] == (False, CLOSE_UNAUTHENTICATED)


# --- what it carries, and the same by REST ---------------------------------------------------


def write_metrics(run, step: int, values: dict[str, float]) -> None:
    """The learner's own write: one insert, then a notification on commit."""
    from runs.services import metrics_write

    metrics_write(run, step, values)


def test_metrics_events_and_status_arrive_live_and_match_what_rest_returns(lab):
    run, viewer = make_run(lab), lab["viewer"]
    headers = headers_for(viewer)
    since = run.events.order_by("-pk").values_list("pk", flat=True).first()

    async def scenario():
        communicator, connected, _ = await connect(run_path(run), headers)
        assert connected
        await database_sync_to_async(write_metrics)(
            run, 1, {"reward/mean": 0.25, "episodes/errored_rate": 0.0}
        )
        metrics = await communicator.receive_json_from(timeout=5)
        await database_sync_to_async(
            lambda: lifecycle.run_event(
                run, "alert", "<b>errored</b>", level="warning", data={"monitor": "x"}
            )
        )()
        event = await communicator.receive_json_from(timeout=5)
        await database_sync_to_async(lambda: lifecycle.run_pause(run=run))()
        paused = [await communicator.receive_json_from(timeout=5) for _ in range(2)]
        await communicator.disconnect()
        return metrics, event, paused

    metrics, event, paused = async_to_sync(scenario)()
    assert metrics == {
        "event": "metrics",
        "payload": {"step": 1, "values": {"reward/mean": 0.25, "episodes/errored_rate": 0.0}},
    }
    client = api_client_for(viewer)
    series = client.get(f"/api/v1/runs/{run.pk}/metrics", {"max_points": 2000}).json()["metrics"]
    assert {s["name"]: s["points"] for s in series} == {
        "episodes/errored_rate": [{"step": 1, "value": 0.0}],
        "reward/mean": [{"step": 1, "value": 0.25}],
    }
    written = MetricPoint.objects.get(run=run, name="reward/mean").created_at  # the wall-time axis
    assert written.tzinfo is not None and abs((timezone.now() - written).total_seconds()) < 120
    missed = client.get(f"/api/v1/runs/{run.pk}/events", {"since": since}).json()["results"]
    alert = next(row for row in missed if row["kind"] == "alert")
    assert event["event"] == "event"
    assert {key: event["payload"][key] for key in ("id", "kind", "level", "message", "data")} == {
        key: alert[key] for key in ("id", "kind", "level", "message", "data")
    }
    assert [m["event"] for m in paused] == ["event", "status"]
    assert paused[1]["payload"] == {"status": client.get(f"/api/v1/runs/{run.pk}").json()["status"]}
    assert [row["id"] for row in missed] == sorted(row["id"] for row in missed)  # oldest first


def test_a_viewer_of_another_run_hears_nothing_of_this_one(lab):
    run, other = make_run(lab), make_run(lab, name="second")
    headers = headers_for(lab["viewer"])

    async def scenario():
        communicator, connected, _ = await connect(run_path(other), headers)
        assert connected
        await database_sync_to_async(write_metrics)(run, 1, {"reward/mean": 1.0})
        nothing = await communicator.receive_nothing(timeout=0.3)
        await communicator.disconnect()
        return nothing

    assert async_to_sync(scenario)() is True


# --- monitors -------------------------------------------------------------------------------


def steps(values) -> list[tuple[int, float]]:
    return [(index + 1, float(value)) for index, value in enumerate(values)]


HEALTHY = {
    "episodes/errored_rate": steps([0.0, 0.05, 0.02, 0.0, 0.1, 0.05, 0.0, 0.0, 0.05, 0.1]),
    "reward/mean": steps([0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55]),
    "heldout/pass_rate": [(2, 0.1), (6, 0.2), (10, 0.3)],
    "episodes/response_tokens": steps([40, 42, 41, 39, 40, 43, 41, 40, 42, 41]),
    "learner/entropy": steps([2.0, 1.9, 1.95, 1.9, 1.85, 1.8, 1.8, 1.75, 1.7, 1.7]),
    "dropped/zero_variance": steps([2, 3, 2, 2, 3, 2, 1, 2, 2, 1]),
    "episodes/learned": steps([30] * 10),
}
CRAFTED = {
    "errored_rate": {"episodes/errored_rate": steps([0.0, 0.05, 0.4])},
    "reward_without_heldout": {
        "reward/mean": steps([0.1, 0.1, 0.2, 0.4, 0.6, 0.7, 0.8]),
        "heldout/pass_rate": [(2, 0.30), (7, 0.305)],
    },
    "response_length_drift": {"episodes/response_tokens": steps([40, 41, 39, 40, 40, 90, 95, 100, 110, 120])},
    "entropy_collapse": {"learner/entropy": steps([2.0, 2.0, 1.9, 2.0, 1.9, 0.5, 0.3, 0.2, 0.1, 0.05])},
    "zero_variance_groups": {
        "dropped/zero_variance": steps([2, 2, 3, 2, 2, 20, 24, 26, 28, 30]),
        "episodes/learned": steps([30, 30, 29, 30, 30, 12, 8, 6, 4, 2]),
    },
}


def test_a_healthy_run_raises_no_alert():
    assert monitors.alerts_for(HEALTHY, monitors.DEFAULTS) == []


@pytest.mark.parametrize("monitor", sorted(CRAFTED))
def test_each_monitor_fires_on_its_crafted_series_and_only_it(monitor):
    fired = monitors.alerts_for(HEALTHY | CRAFTED[monitor], monitors.DEFAULTS)
    assert [alert.monitor for alert in fired] == [monitor]


def test_reward_hacking_fires_on_a_group_of_new_flags_only():
    group = monitors.FlaggedWindow(trajectories=[3, 2, 1], steps=[4, 4, 3], episodes=40)
    assert [a.monitor for a in monitors.alerts_for(HEALTHY, monitors.DEFAULTS, flagged=group)] == [
        "reward_hacking"
    ]
    two = monitors.FlaggedWindow(trajectories=[3, 2], steps=[4, 4], episodes=40)
    assert monitors.alerts_for(HEALTHY, monitors.DEFAULTS, flagged=two) == []
    assert monitors.alerts_for(HEALTHY, monitors.DEFAULTS) == []


def test_a_run_threshold_overrides_the_default():
    series = {"episodes/errored_rate": steps([0.3])}
    assert [a.monitor for a in monitors.alerts_for(series, monitors.DEFAULTS)] == ["errored_rate"]
    assert monitors.alerts_for(series, monitors.DEFAULTS | {"errored_rate_max": 0.5}) == []


def test_the_service_records_an_alert_once_per_cooldown_and_on_new_flags(lab):
    run = make_run(lab)
    write_metrics(run, 1, {"episodes/errored_rate": 0.5})
    first = monitors.run_monitor(run_id=run.pk, step=1)
    assert [(e.kind, e.level, e.data["monitor"], e.data["step"]) for e in first] == [
        ("alert", "warning", "errored_rate", 1)
    ]
    write_metrics(run, 2, {"episodes/errored_rate": 0.6})
    assert monitors.run_monitor(run_id=run.pk, step=2) == []  # still firing: no repeat
    for index in range(3):
        make_trajectory(run, index=index, flags=[{"detector": "early_exit", "evidence": "sys.exit(0)"}])
    hacking = monitors.run_monitor(run_id=run.pk, step=3)
    assert [e.data["monitor"] for e in hacking] == ["reward_hacking"]
    assert monitors.run_monitor(run_id=run.pk, step=4) == []  # the same flag is not news
    assert RunEvent.objects.filter(run=run, kind="alert").count() == 2


def test_thresholds_are_set_by_rest_and_refused_by_name(lab):
    run = make_run(lab)
    client = api_client_for(lab["launcher"])
    response = client.patch(
        f"/api/v1/runs/{run.pk}/monitors", {"thresholds": {"errored_rate_max": 0.4}}, format="json"
    )
    assert response.status_code == 200
    rows = {row["name"]: row["value"] for row in response.json()["thresholds"]}
    assert (rows["errored_rate_max"], rows["window"]) == (0.4, 5)
    bad = client.patch(f"/api/v1/runs/{run.pk}/monitors", {"thresholds": {"nope": 1}}, format="json")
    assert bad.status_code == 400 and bad.json()["error"]["details"][0]["param"] == "nope"
    run.refresh_from_db()
    assert run.monitors == {"errored_rate_max": 0.4}
    client.patch(f"/api/v1/runs/{run.pk}/monitors", {"thresholds": {"errored_rate_max": None}}, format="json")
    run.refresh_from_db()
    assert run.monitors == {}


# --- scale ----------------------------------------------------------------------------------

MILLION = 1_000_000


def test_downsampling_a_million_points_keeps_every_buckets_min_and_max_exactly_and_fast():
    rng = random.Random(7)
    points = [(step, rng.gauss(0.0, 1.0)) for step in range(MILLION)]
    points[123_457] = (123_457, 50.0)  # a spike
    points[876_543] = (876_543, -50.0)
    started = time.perf_counter()
    kept = selectors.downsample(points, 2000)
    elapsed = time.perf_counter() - started
    assert len(kept) <= 2000 and kept == sorted(kept)
    assert (123_457, 50.0) in kept and (876_543, -50.0) in kept
    size = -(-MILLION // 1000)
    for start in range(0, MILLION, size):
        bucket = [value for _, value in points[start : start + size]]
        inside = [value for step, value in kept if start <= step < start + size]
        assert (min(inside), max(inside)) == (min(bucket), max(bucket))
    assert elapsed < 1.0, elapsed


def test_the_metrics_endpoint_serves_a_million_point_series_downsampled(lab):
    run = make_run(lab)
    rng = random.Random(3)
    values = [rng.random() for _ in range(MILLION)]
    values[500_000] = 9.0
    # Raw inserts in one transaction (a million model instances would take the test's time); on
    # PostgreSQL by COPY, which takes a second where row-by-row inserts take a minute.
    table, now = MetricPoint._meta.db_table, timezone.now()
    rows = [(run.pk, "reward/mean", step, value, now) for step, value in enumerate(values)]
    columns = "(run_id, name, step, value, created_at)"
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            with cursor.cursor.copy(f"COPY {table} {columns} FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            cursor.executemany(f"INSERT INTO {table} {columns} VALUES (%s, %s, %s, %s, %s)", rows)
    client = api_client_for(lab["viewer"])
    started = time.perf_counter()
    body = client.get(f"/api/v1/runs/{run.pk}/metrics", {"max_points": 2000}).json()
    elapsed = time.perf_counter() - started
    series = body["metrics"][0]
    assert (series["count"], series["downsampled"]) == (MILLION, True)
    assert len(series["points"]) <= 2000
    kept = [point["value"] for point in series["points"]]
    assert (min(kept), max(kept)) == (min(values), 9.0)
    assert elapsed < 10.0, elapsed  # a million rows read and bucketed: seconds, not minutes


def test_step_k_of_a_million_token_trajectory_opens_in_under_100_ms(lab):
    trajectory = make_trajectory(make_run(lab))
    steps_count, tokens_per_step = 100, 10_000  # one million tokens
    rng = random.Random(5)
    rows = []
    for index in range(steps_count):
        data = {
            "observation": f"observation {index}",
            "action": f"command {index}",
            "token_ids": [rng.randrange(50_000) for _ in range(tokens_per_step)],
            "logprobs": [round(-rng.random() * 5, 4) for _ in range(tokens_per_step)],
        }
        payload, size = TrajectoryStep.pack(data)
        rows.append(
            TrajectoryStep(trajectory=trajectory, index=index, kind="command", payload=payload, raw_size=size)
        )
    TrajectoryStep.objects.bulk_create(rows, batch_size=10)
    client = api_client_for(lab["viewer"])
    url = f"/api/v1/trajectories/{trajectory.pk}/steps"
    client.get(url, {"index": 0})  # warm: the first request pays for imports and connections
    timings = []
    for k in (1, 37, 73, 99):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            response = client.get(url, {"index": k})
            timings.append(time.perf_counter() - started)
        # Only step k is read: what the time depends on is the step's size, not the trajectory's.
        payload_reads = [q["sql"] for q in queries if "payload" in q["sql"] and "trajectorystep" in q["sql"]]
        assert len(payload_reads) == 1 and f'"index" = {k})' in payload_reads[0], payload_reads
        step = response.json()["results"][0]
        assert (step["index"], len(step["data"]["token_ids"]), step["data"]["action"]) == (
            k,
            tokens_per_step,
            f"command {k}",
        )
    # The fastest of the four: what opening a step costs when nothing else holds the cores (CI runs
    # two suites side by side, and a median of 0.103 s failed there once while the best was 0.070).
    # That only step k is read, whatever the trajectory's size, is asserted above, exactly.
    assert min(timings) < 0.1, timings


def test_a_runs_messages_reach_its_viewers_in_order_without_the_database(lab, monkeypatch):
    """Forwarded group messages skip Channels' per-message database clean-up (a thread hop per
    message per viewer); they arrive, in order, through the direct publish path."""
    from channels import consumer as channels_consumer

    from core import events

    run, headers = make_run(lab), headers_for(lab[Role.VIEWER])
    cleanups = []
    original = channels_consumer.aclose_old_connections

    async def counted():
        cleanups.append(1)
        await original()

    monkeypatch.setattr(channels_consumer, "aclose_old_connections", counted)

    async def scenario():
        communicator, connected, _ = await connect(run_path(run), headers)
        assert connected
        joined = len(cleanups)
        for step in (1, 2, 3):
            message = {"type": "run.message", "event": "metrics", "payload": {"step": step}}
            await database_sync_to_async(events._send)(events.run_group(run.pk), message)
        received = [await communicator.receive_json_from(timeout=5) for _ in range(3)]
        forwarded = len(cleanups)
        await communicator.disconnect()
        return joined, forwarded, received

    joined, forwarded, received = async_to_sync(scenario)()
    assert [message["payload"]["step"] for message in received] == [1, 2, 3]
    assert {message["event"] for message in received} == {"metrics"}
    assert joined >= 1 and forwarded == joined  # connect had it; none of the forwarded three did

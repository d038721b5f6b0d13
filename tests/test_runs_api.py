"""Runs over REST: launch, refusals, actions and their 409s, clone and fork with a config diff,
events after reconnect, metrics with downsampling, trajectories, steps, checkpoints, roles."""

# The fixture imported from run_fixtures is a test parameter here, not a redefinition:
# ruff: noqa: F811
import pytest

from runs import lifecycle
from runs.models import Checkpoint, MetricPoint, Run, RunEvent, Trajectory, TrajectoryStep
from tests.conftest import api_client_for
from tests.run_fixtures import lab, make_run, make_trajectory, set_status  # noqa: F401
from tests.test_api_schema import assert_matches_schema, schema  # noqa: F401
from tiers import services as tier_services

S = Run.Status


def error_of(response) -> dict:
    return response.json()["error"]


def params_of(response) -> list[str | None]:
    return [detail["param"] for detail in error_of(response)["details"]]


# --- launch --------------------------------------------------------------------------------


def test_a_launcher_launches_a_run_and_sees_its_resolved_configuration(lab):
    response = api_client_for(lab["launcher"]).post("/api/v1/runs", lab["launch"], format="json")
    assert response.status_code == 201
    body = response.json()
    run = Run.objects.get()
    assert body["id"] == run.pk
    assert (body["status"], body["queue_position"], body["error"]) == ("queued", 1, None)
    assert (body["method"], body["train_split"], body["eval_split"]) == ("grpo", "train", "heldout")
    assert body["hyperparameters"] == {"group_size": 4, "learning_rate": "auto"}
    assert body["resolved"]["group_size"] == 4 and body["resolved"]["learning_rate"] == 0.0003
    assert body["resolved"]["staleness"] == 1
    assert body["tier_config"]["base_model"] == lab["tier"].base_model
    assert body["progress"] == {
        "learner_step": 0,
        "max_steps": 5,
        "policy_version": 0,
        "restarts": 0,
        "sandbox_cpu_seconds": 0.0,
        "started_at": None,
        "finished_at": None,
        "heartbeat_at": None,
    }
    assert (body["parent"], body["parent_checkpoint"], body["config_diff"]) == (None, None, None)
    assert run.created_by == lab["launcher"]


def test_a_run_that_would_fail_is_refused_naming_every_field_and_nothing_is_created(lab, tmp_path):
    lab["tier"].base_model = str(tmp_path / "missing")
    lab["tier"].save()
    body = lab["launch"] | {"hyperparameters": {}, "max_steps": 0, "max_wall_seconds": 0}
    response = api_client_for(lab["owner"]).post("/api/v1/runs", body, format="json")
    assert response.status_code == 400
    assert sorted(params_of(response)) == ["max_steps", "max_wall_seconds", "tier.base_model"]
    assert Run.objects.count() == 0
    assert lab["rule"].versions.get().used_at is None


def test_bad_hyperparameters_are_refused_by_name(lab):
    body = lab["launch"] | {"hyperparameters": {"group_size": 1, "typo": 3}}
    response = api_client_for(lab["owner"]).post("/api/v1/runs", body, format="json")
    assert response.status_code == 400
    assert sorted(params_of(response)) == ["hyperparameters.group_size", "hyperparameters.typo"]
    assert Run.objects.count() == 0


def test_versions_and_tiers_of_another_project_are_refused_by_field(lab):
    other = lab["other_project"]
    foreign_tier = tier_services.tier_create(project=other, by=lab["outsider"], name="x", base_model="org/m")
    body = lab["launch"] | {"tier": foreign_tier.pk, "task_set_version": 999999}
    response = api_client_for(lab["owner"]).post("/api/v1/runs", body, format="json")
    assert response.status_code == 400
    assert params_of(response) == ["task_set_version", "tier"]
    assert error_of(response)["details"][1]["message"] == f"no tier {foreign_tier.pk} in project alpha"
    assert Run.objects.count() == 0


def test_a_viewer_may_not_launch_and_an_outsider_is_told_nothing_exists(lab):
    assert api_client_for(lab["viewer"]).post("/api/v1/runs", lab["launch"], format="json").status_code == 403
    assert (
        api_client_for(lab["outsider"]).post("/api/v1/runs", lab["launch"], format="json").status_code == 404
    )
    assert Run.objects.count() == 0


def test_the_same_idempotency_key_launches_once(lab):
    client = api_client_for(lab["owner"])
    first = client.post("/api/v1/runs", lab["launch"], format="json", HTTP_IDEMPOTENCY_KEY="k1")
    again = client.post("/api/v1/runs", lab["launch"], format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert (first.status_code, again.status_code, again["Idempotent-Replayed"]) == (201, 201, "true")
    assert again.json()["id"] == first.json()["id"] and Run.objects.count() == 1


def test_runs_are_listed_newest_first_with_queue_positions_and_filtered(lab):
    low = make_run(lab, name="low")
    high = make_run(lab, name="high", priority=5)
    done = set_status(make_run(lab, name="done"), S.SUCCEEDED)
    client = api_client_for(lab["viewer"])
    listed = client.get(f"/api/v1/runs?project={lab['project'].pk}").json()["results"]
    assert [(r["name"], r["queue_position"]) for r in listed] == [("done", None), ("high", 1), ("low", 2)]
    assert [r["id"] for r in client.get("/api/v1/runs?status=succeeded").json()["results"]] == [done.pk]
    assert api_client_for(lab["outsider"]).get("/api/v1/runs").json()["results"] == []
    assert client.get(f"/api/v1/runs/{high.pk}").json()["queue_position"] == 1
    assert client.get(f"/api/v1/runs/{low.pk}").json()["queue_position"] == 2


def test_a_page_of_runs_costs_the_same_queries_however_many_and_reads_no_configuration(lab):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = api_client_for(lab["viewer"])

    def listed() -> list[str]:
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/api/v1/runs?limit=20").status_code == 200
        return [query["sql"] for query in queries.captured_queries]

    make_run(lab, name="one")
    listed()  # the token's first use is recorded (an UPDATE), once
    one = listed()
    for n in range(5):
        make_run(lab, name=f"more {n}")
    assert len(listed()) == len(one)  # no query per run
    page_query = next(sql for sql in one if 'FROM "runs_run"' in sql and "ORDER BY" in sql)
    assert '"resolved"' not in page_query and '"hyperparameters"' not in page_query


def test_a_failed_run_says_why_and_where(lab):
    run = lifecycle.run_fail(run=make_run(lab), message="CUDA out of memory", where="learner step 3")
    body = api_client_for(lab["viewer"]).get(f"/api/v1/runs/{run.pk}").json()
    assert (body["status"], body["error"]) == (
        "failed",
        {"message": "CUDA out of memory", "where": "learner step 3"},
    )


# --- actions -------------------------------------------------------------------------------


def test_pause_resume_cancel_and_retry_move_the_run_and_record_events(lab):
    run = make_run(lab)
    client = api_client_for(lab["launcher"])
    statuses = [
        client.post(f"/api/v1/runs/{run.pk}/{action}").json()["status"] for action in ("pause", "resume")
    ]
    set_status(run, S.RUNNING)
    statuses += [client.post(f"/api/v1/runs/{run.pk}/{a}").json()["status"] for a in ("cancel",)]
    set_status(run, S.FAILED, error={"message": "boom", "where": "rollout"})
    retried = client.post(f"/api/v1/runs/{run.pk}/retry").json()
    assert statuses == ["paused", "queued", "cancelling"]
    assert (retried["status"], retried["error"]) == ("queued", None)
    assert [e.data["status"] for e in RunEvent.objects.filter(run=run).order_by("pk")] == [
        "queued",
        "paused",
        "queued",
        "cancelling",
        "queued",
    ]


@pytest.mark.parametrize(
    ("status", "action"),
    [(S.QUEUED, "resume"), (S.SUCCEEDED, "pause"), (S.SUCCEEDED, "cancel"), (S.RUNNING, "retry")],
)
def test_an_action_the_status_does_not_allow_answers_409_and_changes_nothing(lab, status, action):
    run = set_status(make_run(lab), status)
    events = RunEvent.objects.filter(run=run).count()
    response = api_client_for(lab["owner"]).post(f"/api/v1/runs/{run.pk}/{action}")
    assert response.status_code == 409
    assert error_of(response)["code"] == "conflict"
    assert error_of(response)["message"].startswith(f"run {run.pk} is {status}")
    assert Run.objects.get(pk=run.pk).status == status
    assert RunEvent.objects.filter(run=run).count() == events


def test_a_viewer_may_not_cancel_and_an_outsider_gets_404(lab):
    run = make_run(lab)
    assert api_client_for(lab["viewer"]).post(f"/api/v1/runs/{run.pk}/cancel").status_code == 403
    assert api_client_for(lab["outsider"]).post(f"/api/v1/runs/{run.pk}/cancel").status_code == 404
    assert api_client_for(lab["outsider"]).get(f"/api/v1/runs/{run.pk}").status_code == 404
    assert Run.objects.get(pk=run.pk).status == S.QUEUED


# --- clone and fork ------------------------------------------------------------------------


def test_a_clone_merges_hyperparameters_over_the_parents_and_shows_its_diff(lab):
    parent = make_run(lab, priority=2)
    body = {"hyperparameters": {"learning_rate": 0.01}, "max_steps": 7}
    response = api_client_for(lab["launcher"]).post(f"/api/v1/runs/{parent.pk}/clone", body, format="json")
    assert response.status_code == 201
    clone = response.json()
    assert (clone["name"], clone["parent"], clone["parent_checkpoint"]) == ("first (copy)", parent.pk, None)
    assert clone["hyperparameters"] == {"group_size": 4, "learning_rate": 0.01}
    assert clone["config_diff"] == [
        {"field": "max_steps", "parent": 5, "run": 7},
        {"field": "resolved.learning_rate", "parent": 0.0003, "run": 0.01},
    ]
    assert clone["priority"] == 2


def test_a_clone_that_would_fail_is_refused_and_creates_nothing(lab):
    parent = make_run(lab)
    response = api_client_for(lab["owner"]).post(
        f"/api/v1/runs/{parent.pk}/clone", {"hyperparameters": {"group_size": 0}, "tier": 999}, format="json"
    )
    assert (response.status_code, params_of(response)) == (400, ["tier"])
    response = api_client_for(lab["owner"]).post(
        f"/api/v1/runs/{parent.pk}/clone", {"hyperparameters": {"group_size": 0}}, format="json"
    )
    assert (response.status_code, params_of(response)) == (400, ["hyperparameters.group_size"])
    assert Run.objects.count() == 1


def test_a_fork_starts_from_a_checkpoint(lab):
    parent = make_run(lab)
    checkpoint = Checkpoint.objects.create(run=parent, step=3, policy_version=3, path="/tmp/ck-3")
    response = api_client_for(lab["owner"]).post(
        f"/api/v1/checkpoints/{checkpoint.pk}/fork", {"hyperparameters": {"group_size": 8}}, format="json"
    )
    assert response.status_code == 201
    fork = response.json()
    assert (fork["name"], fork["parent"], fork["parent_checkpoint"]) == (
        "first (fork @ 3)",
        parent.pk,
        checkpoint.pk,
    )
    assert fork["config_diff"] == [{"field": "resolved.group_size", "parent": 4, "run": 8}]


def test_forking_a_run_whose_tier_was_deleted_asks_for_a_tier(lab):
    parent = make_run(lab)
    checkpoint = Checkpoint.objects.create(run=parent, step=1, policy_version=1, path="/tmp/ck-1")
    tier_services.tier_delete(tier=lab["tier"])
    response = api_client_for(lab["owner"]).post(
        f"/api/v1/checkpoints/{checkpoint.pk}/fork", {}, format="json"
    )
    assert (response.status_code, params_of(response)) == (400, ["tier"])
    assert Run.objects.count() == 1


def test_a_viewer_may_not_clone_or_fork(lab):
    parent = make_run(lab)
    checkpoint = Checkpoint.objects.create(run=parent, step=1, policy_version=1, path="/tmp/ck-1")
    viewer = api_client_for(lab["viewer"])
    assert viewer.post(f"/api/v1/runs/{parent.pk}/clone", {}, format="json").status_code == 403
    assert viewer.post(f"/api/v1/checkpoints/{checkpoint.pk}/fork", {}, format="json").status_code == 403
    assert (
        api_client_for(lab["outsider"]).post(f"/api/v1/checkpoints/{checkpoint.pk}/fork").status_code == 404
    )
    assert Run.objects.count() == 1


# --- events and metrics --------------------------------------------------------------------


def test_events_are_newest_first_and_since_returns_what_a_client_missed_oldest_first(lab):
    run = make_run(lab)
    lifecycle.run_pause(run=run)
    lifecycle.run_resume(run=run)
    lifecycle.run_event(run, "alert", "reward is flat", level="warning")
    client = api_client_for(lab["viewer"])
    events = client.get(f"/api/v1/runs/{run.pk}/events").json()["results"]
    assert [e["message"] for e in events] == [
        "reward is flat",
        "resumed; queued",
        "paused before it started",
        "queued",
    ]
    since = events[2]["id"]  # the client last saw the pause
    missed = client.get(f"/api/v1/runs/{run.pk}/events?since={since}").json()["results"]
    assert [(e["level"], e["message"]) for e in missed] == [
        ("info", "resumed; queued"),
        ("warning", "reward is flat"),
    ]
    warnings = client.get(f"/api/v1/runs/{run.pk}/events?level=warning").json()["results"]
    assert [e["kind"] for e in warnings] == ["alert"]


def test_events_page_with_a_cursor(lab):
    run = make_run(lab)
    for index in range(4):
        lifecycle.run_event(run, "note", f"n{index}")
    client = api_client_for(lab["viewer"])
    first = client.get(f"/api/v1/runs/{run.pk}/events?since=0&limit=3").json()
    second = client.get(first["next"]).json()
    assert [e["message"] for e in first["results"] + second["results"]] == ["queued", "n0", "n1", "n2", "n3"]
    assert second["next"] is None


def write_metric(run: Run, name: str, values: list[float], first_step: int = 0) -> None:
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, name=name, step=first_step + i, value=v) for i, v in enumerate(values)
    )


def test_metrics_are_grouped_by_name_and_filtered(lab):
    run = make_run(lab)
    write_metric(run, "reward_mean", [0.1, 0.2, 0.3])
    write_metric(run, "kl", [0.01, 0.02, 0.03])
    client = api_client_for(lab["viewer"])
    body = client.get(f"/api/v1/runs/{run.pk}/metrics").json()
    assert body["run"] == run.pk
    assert [(m["name"], m["count"], m["downsampled"]) for m in body["metrics"]] == [
        ("kl", 3, False),
        ("reward_mean", 3, False),
    ]
    body = client.get(f"/api/v1/runs/{run.pk}/metrics?name=reward_mean&since_step=1").json()
    assert body["metrics"] == [
        {
            "name": "reward_mean",
            "count": 2,
            "downsampled": False,
            "points": [{"step": 1, "value": 0.2}, {"step": 2, "value": 0.3}],
        }
    ]
    both = client.get(f"/api/v1/runs/{run.pk}/metrics?name=kl&name=reward_mean&since_step=2").json()
    assert [(m["name"], m["points"]) for m in both["metrics"]] == [
        ("kl", [{"step": 2, "value": 0.03}]),
        ("reward_mean", [{"step": 2, "value": 0.3}]),
    ]


def test_downsampling_keeps_each_buckets_min_and_max_so_spikes_survive(lab):
    run = make_run(lab)
    values = [0.5] * 100
    values[37], values[81] = 9.0, -4.0  # a spike and a dip
    write_metric(run, "loss", values)
    body = api_client_for(lab["viewer"]).get(f"/api/v1/runs/{run.pk}/metrics?max_points=10").json()
    series = body["metrics"][0]
    points = [(p["step"], p["value"]) for p in series["points"]]
    assert (series["count"], series["downsampled"]) == (100, True)
    # 5 buckets of 20 steps: a flat bucket keeps one point, one with a spike or a dip keeps both.
    assert points == [(0, 0.5), (20, 0.5), (37, 9.0), (40, 0.5), (60, 0.5), (80, 0.5), (81, -4.0)]


def test_downsampling_with_room_for_every_point_returns_them_all(lab):
    run = make_run(lab)
    write_metric(run, "loss", [3.0, 1.0, 2.0])
    series = (
        api_client_for(lab["viewer"]).get(f"/api/v1/runs/{run.pk}/metrics?max_points=3").json()["metrics"][0]
    )
    assert (series["downsampled"], [p["value"] for p in series["points"]]) == (False, [3.0, 1.0, 2.0])


# --- trajectories, steps, checkpoints ------------------------------------------------------


def test_trajectories_are_filtered_by_run_outcome_policy_version_and_reward(lab):
    run, other_run = make_run(lab), make_run(lab, name="second")
    low = make_trajectory(run, index=0, reward=0.0, policy_version=1)
    high = make_trajectory(run, index=1, reward=1.0, policy_version=2)
    errored = make_trajectory(run, index=2, reward=None, outcome="errored", policy_version=2)
    make_trajectory(other_run, index=0, reward=1.0)
    client = api_client_for(lab["viewer"])

    def ids(query: str) -> list[int]:
        return [t["id"] for t in client.get(f"/api/v1/trajectories?{query}").json()["results"]]

    assert ids(f"run={run.pk}") == [errored.pk, high.pk, low.pk]
    assert ids(f"run={run.pk}&outcome=errored") == [errored.pk]
    assert ids(f"run={run.pk}&policy_version=2") == [errored.pk, high.pk]
    assert ids(f"run={run.pk}&min_reward=0.5") == [high.pk]
    assert ids(f"run={run.pk}&max_reward=0.5") == [low.pk]
    assert api_client_for(lab["outsider"]).get(f"/api/v1/trajectories?run={run.pk}").json()["results"] == []


def test_a_trajectory_shows_its_completion_and_item(lab):
    trajectory = make_trajectory(
        make_run(lab), index=3, completion_text="<script>alert(1)</script>6", learned_in_step=2
    )
    body = api_client_for(lab["viewer"]).get(f"/api/v1/trajectories/{trajectory.pk}").json()
    assert (body["completion_text"], body["item_external_id"], body["learned_in_step"]) == (
        "<script>alert(1)</script>6",
        "q3",
        2,
    )
    assert api_client_for(lab["outsider"]).get(f"/api/v1/trajectories/{trajectory.pk}").status_code == 404


def add_steps(trajectory: Trajectory, payloads: list[dict]) -> None:
    for index, data in enumerate(payloads):
        payload, size = TrajectoryStep.pack(data)
        TrajectoryStep.objects.create(
            trajectory=trajectory, index=index, kind="tool_call", payload=payload, raw_size=size
        )


def test_steps_round_trip_through_compression_in_order_and_one_by_index(lab):
    trajectory = make_trajectory(make_run(lab))
    payloads = [
        {"observation": "$ ls", "action": "ls -la", "tokens": [1, 2, 3]},
        {"observation": "é ☃ " + "x" * 5000, "tool_result": {"exit_code": 0}},
        {"action": "done", "reward_components": {"exact": 1.0}},
    ]
    add_steps(trajectory, payloads)
    client = api_client_for(lab["viewer"])
    steps = client.get(f"/api/v1/trajectories/{trajectory.pk}/steps").json()["results"]
    assert [s["data"] for s in steps] == payloads
    assert [s["index"] for s in steps] == [0, 1, 2]
    stored = TrajectoryStep.objects.get(trajectory=trajectory, index=1)
    assert len(bytes(stored.payload)) < stored.raw_size  # compressed
    one = client.get(f"/api/v1/trajectories/{trajectory.pk}/steps?index=1").json()["results"]
    assert [(s["index"], s["data"], s["raw_size"]) for s in one] == [(1, payloads[1], stored.raw_size)]


def test_checkpoints_are_listed_by_run(lab):
    run, other_run = make_run(lab), make_run(lab, name="second")
    first = Checkpoint.objects.create(run=run, step=1, policy_version=1, path="/tmp/a", metrics={"pass": 0.2})
    second = Checkpoint.objects.create(run=run, step=2, policy_version=2, path="/tmp/b")
    Checkpoint.objects.create(run=other_run, step=1, policy_version=1, path="/tmp/c")
    client = api_client_for(lab["viewer"])
    listed = client.get(f"/api/v1/checkpoints?run={run.pk}").json()["results"]
    assert [(c["id"], c["step"]) for c in listed] == [(second.pk, 2), (first.pk, 1)]
    assert client.get(f"/api/v1/checkpoints/{first.pk}").json()["metrics"] == {"pass": 0.2}
    assert api_client_for(lab["outsider"]).get(f"/api/v1/checkpoints/{first.pk}").status_code == 404


# --- the contract --------------------------------------------------------------------------


def test_every_run_answer_matches_the_schema(lab, schema):
    owner, viewer = api_client_for(lab["owner"]), api_client_for(lab["viewer"])
    created = owner.post("/api/v1/runs", lab["launch"], format="json")
    run = Run.objects.get(pk=created.json()["id"])
    checkpoint = Checkpoint.objects.create(
        run=run, step=1, policy_version=1, path="/tmp/ck", metrics={"a": 1}
    )
    trajectory = make_trajectory(run, errors=[{"kind": "timeout"}], flags=["long"], components={"exact": 1.0})
    add_steps(trajectory, [{"action": "ls"}])
    write_metric(run, "loss", [1.0, 5.0, 2.0, 0.5])
    fork = owner.post(f"/api/v1/checkpoints/{checkpoint.pk}/fork", {"max_steps": 9}, format="json")
    failed = lifecycle.run_fail(run=Run.objects.get(pk=fork.json()["id"]), message="boom", where="learner")
    r, t, c = run.pk, trajectory.pk, checkpoint.pk
    answers = [
        ("post", "/api/v1/runs", created),
        ("post", "/api/v1/runs", owner.post("/api/v1/runs", lab["launch"] | {"max_steps": 0}, format="json")),
        ("post", "/api/v1/runs", viewer.post("/api/v1/runs", lab["launch"], format="json")),
        ("get", "/api/v1/runs", viewer.get("/api/v1/runs?limit=1")),
        ("get", "/api/v1/runs/{id}", viewer.get(f"/api/v1/runs/{failed.pk}")),
        ("get", "/api/v1/runs/{id}", api_client_for(lab["outsider"]).get(f"/api/v1/runs/{r}")),
        ("post", "/api/v1/runs/{id}/pause", owner.post(f"/api/v1/runs/{r}/pause")),
        ("post", "/api/v1/runs/{id}/pause", owner.post(f"/api/v1/runs/{r}/pause")),
        ("post", "/api/v1/runs/{id}/resume", owner.post(f"/api/v1/runs/{r}/resume")),
        ("post", "/api/v1/runs/{id}/cancel", owner.post(f"/api/v1/runs/{r}/cancel")),
        ("post", "/api/v1/runs/{id}/retry", owner.post(f"/api/v1/runs/{r}/retry")),
        ("post", "/api/v1/runs/{id}/clone", owner.post(f"/api/v1/runs/{r}/clone", {}, format="json")),
        ("post", "/api/v1/checkpoints/{id}/fork", fork),
        ("get", "/api/v1/runs/{id}/events", viewer.get(f"/api/v1/runs/{r}/events?since=0")),
        ("get", "/api/v1/runs/{id}/metrics", viewer.get(f"/api/v1/runs/{r}/metrics?max_points=2")),
        ("get", "/api/v1/runs/{id}/metrics", viewer.get(f"/api/v1/runs/{r}/metrics?max_points=1")),
        ("get", "/api/v1/trajectories", viewer.get(f"/api/v1/trajectories?run={r}")),
        ("get", "/api/v1/trajectories/{id}", viewer.get(f"/api/v1/trajectories/{t}")),
        ("get", "/api/v1/trajectories/{id}/steps", viewer.get(f"/api/v1/trajectories/{t}/steps")),
        ("get", "/api/v1/checkpoints", viewer.get(f"/api/v1/checkpoints?run={r}")),
        ("get", "/api/v1/checkpoints/{id}", viewer.get(f"/api/v1/checkpoints/{c}")),
    ]
    statuses = [response.status_code for _, _, response in answers]
    assert (
        statuses
        == [201, 400, 403, 200, 200, 404, 200, 409, 200, 200, 200, 201, 201] + [200, 200, 400] + [200] * 5
    )
    for method, path, response in answers:
        assert_matches_schema(schema, response, method, path)

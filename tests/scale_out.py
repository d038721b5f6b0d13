"""Many hosts, simulated with network namespaces on this machine (`make test-hosts`, root only; not
part of `make test`): a web + scheduler host, a learner host and a rollout + eval host, each with
its own FLYWHEEL_HOME, reaching PostgreSQL and Redis only over the network (relays on the bridge's
address) and sharing artifacts only through the artifact storage (a folder standing for a shared
mount). A GRPO run succeeds across them; then a rollout host is killed with kill -9 mid-batch and a
fresh one joins, and the run finishes with every episode generated and learned exactly once. The
same run on one host gives the wall-time baseline."""

import json
import os
import signal
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import docker
import httpx
import pytest
import requests
from django.conf import settings
from django.db import connection

from projects import services as project_services
from runs.models import MetricPoint, RolloutBatch, Run, Trajectory
from sandboxes.backend_docker import LABEL
from tests.conftest import api_client_for
from tests.netns import (
    DockerEngine,
    NamespaceHost,
    Network,
    docker_client_over,
    hosts_requirements,
    url_through,
)
from tests.run_harness import (
    Host,
    database_url,
    demo_project,
    hosts_killed,
    run_body,
    tiny_model,
    wait_for_terminal,
    wait_until,
    worker_env,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(900)]
__all__ = ["tiny_model"]
STEPS, BATCH, GROUP = 3, 4, 4
WEB_PORT = 8000
DATABASE_RELAY, REDIS_RELAY = 15432, 16379  # ports on the bridge's address
# The same run on one host and on three: seconds from the launch request until the run is seen
# finished, and from its learner's start to its end (the run's own started_at and finished_at).
WALL_SECONDS: dict[str, tuple[float, float]] = {}
# What the learner did with each episode of a step: learned it, or dropped it with the reason.
CONSUMED_METRICS = ("episodes/learned", "dropped/errored", "dropped/zero_variance", "dropped/stale")


@pytest.fixture
def network():
    reason = hosts_requirements()
    if reason is not None:
        pytest.fail(f"make test-hosts: {reason}")
    network = Network()
    try:
        yield network
    finally:
        network.down()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def relayed_env(network: Network, shared_mount: Path) -> dict[str, str]:
    """What every simulated host shares: the database and Redis through the bridge's address, the
    artifact storage on the shared mount, the secret key."""
    env = worker_env(FLYWHEEL_ARTIFACTS_DIR=str(shared_mount), FLYWHEEL_SECRET_KEY=settings.SECRET_KEY)
    if connection.vendor == "postgresql":
        db = connection.settings_dict
        target = f"{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
        env["DATABASE_URL"] = url_through(database_url(), network.relay(DATABASE_RELAY, target))
    # (On the embedded default the database is a SQLite file, which every host opens.)
    redis = urlsplit(settings.REDIS_URL)
    relayed = network.relay(REDIS_RELAY, f"{redis.hostname}:{redis.port}")
    env["REDIS_URL"] = url_through(settings.REDIS_URL, relayed)
    return env


def shared_services() -> list[tuple[str, int]]:
    """Where PostgreSQL (when it is the database) and Redis listen for the root namespace."""
    redis = urlsplit(settings.REDIS_URL)
    services = [(redis.hostname, redis.port or 6379)]
    if connection.vendor == "postgresql":
        db = connection.settings_dict
        services.append((db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)))
    return services


def submit(url: str, setup: dict) -> tuple[Run, float]:
    """Launch the run over HTTP on the web host; returns it and when it was sent."""
    _, token = project_services.api_token_create(user=setup["owner"], name="hosts")
    body = run_body(setup, steps=STEPS, checkpoint_every=1, eval_every=STEPS)
    sent = time.monotonic()
    response = httpx.post(
        f"{url}/api/v1/runs", json=body, headers={"Authorization": f"Bearer {token}"}, trust_env=False
    )
    assert response.status_code == 201, response.text
    return Run.objects.get(pk=response.json()["id"]), sent


def finished(run: Run, sent: float) -> tuple[Run, tuple[float, float]]:
    run = wait_for_terminal(run.pk)
    launched = time.monotonic() - sent
    return run, (round(launched, 2), round((run.finished_at - run.started_at).total_seconds(), 2))


def assert_learned_exactly_once(run: Run) -> None:
    """Every step has its own episodes, BATCH × GROUP of them, none stored twice, each learned in
    that step only (or dropped by the learner with a stated reason); no batch left running; one
    metric point per step."""
    assert run.status == Run.Status.SUCCEEDED, run.error
    live = Trajectory.objects.filter(run=run).exclude(outcome=Trajectory.Outcome.CANCELLED)
    for step in range(STEPS):
        episodes = live.filter(batch__step=step)
        keys = list(episodes.values_list("item_id", "sample_index"))
        assert len(keys) == len(set(keys)) == BATCH * GROUP, f"step {step}: {sorted(keys)}"
        learned_in = set(episodes.exclude(learned_in_step=None).values_list("learned_in_step", flat=True))
        assert learned_in <= {step}, f"step {step}'s episodes learned in {learned_in}"
    cancelled = Trajectory.objects.filter(run=run, outcome=Trajectory.Outcome.CANCELLED)
    assert not cancelled.exclude(learned_in_step=None).exists()
    assert not RolloutBatch.objects.filter(run=run, status=RolloutBatch.Status.RUNNING).exists()
    for step in range(1, STEPS + 1):
        counted = MetricPoint.objects.filter(run=run, step=step, name__in=CONSUMED_METRICS)
        assert sum(counted.values_list("value", flat=True)) == BATCH * GROUP, f"step {step}"


def frozen_holding_a_batch(host: Host, run: Run) -> bool:
    """Freeze the host, then look: a batch it holds cannot finish between the look and the kill.
    Thaws it again when it holds none."""
    host.send(signal.SIGSTOP)
    if RolloutBatch.objects.filter(run=run, step__gte=1, status=RolloutBatch.Status.RUNNING).exists():
        return True
    host.send(signal.SIGCONT)
    return False


def report(capsys) -> None:
    """One line of JSON once both runs are timed (whichever test ran second prints it)."""
    one, three = WALL_SECONDS.get("one host"), WALL_SECONDS.get("three hosts")
    if not (one and three):
        return
    line = {"steps": STEPS, "one_host_seconds": one, "three_hosts_seconds": three}  # (launch→end, run)
    line["three_over_one"] = [round(many / single, 2) for many, single in zip(three, one, strict=True)]
    line["load_average"] = round(os.getloadavg()[0], 2)
    with capsys.disabled():
        print(f"\ntest-hosts: {json.dumps(line)}")


def test_the_run_on_one_host(tiny_model, tmp_path, capsys):
    """The baseline: the same processes on one host (the root namespace, 127.0.0.1, one
    FLYWHEEL_HOME)."""
    host = Host(worker_env())
    port = free_port()
    with hosts_killed(host):
        host.worker("learner,control")
        host.worker("rollout,eval")
        host.beat(tmp_path)
        host.web(tmp_path, bind="127.0.0.1", port=port)
        run, sent = submit(f"http://127.0.0.1:{port}", demo_project(tiny_model))
        run, WALL_SECONDS["one host"] = finished(run, sent)
    report(capsys)
    assert_learned_exactly_once(run)


def test_a_run_across_three_hosts_survives_a_rollout_host_killed_and_replaced(
    tiny_model, tmp_path, network, capsys
):
    shared_mount = tmp_path / "shared-mount"
    env = relayed_env(network, shared_mount)
    web_ns, learner_ns, rollout_ns = (network.namespace(role) for role in ("web", "learner", "rollout"))
    web_host = NamespaceHost(env | {"FLYWHEEL_ALLOWED_HOSTS": web_ns.address}, web_ns, tmp_path / "web-host")
    learner_host = NamespaceHost(env, learner_ns, tmp_path / "learner-host")
    rollout_host = NamespaceHost(env, rollout_ns, tmp_path / "rollout-host")
    url = f"http://{web_ns.address}:{WEB_PORT}"
    with hosts_killed(web_host, learner_host, rollout_host):
        learner_host.worker("learner,control")
        rollout_host.worker("rollout,eval")
        web_host.beat(web_host.home)
        # Healthy once it sees the database, Redis and every queue's worker, over the network.
        web_host.web(web_host.home, bind=web_ns.address, port=WEB_PORT)
        assert rollout_ns.connects(network.gateway, REDIS_RELAY)  # the relay, yes; but not where
        for service in shared_services():  # the services listen in the root namespace
            assert not rollout_ns.connects(*service) and not learner_ns.connects(*service)

        run, sent = submit(url, demo_project(tiny_model))
        run, WALL_SECONDS["three hosts"] = finished(run, sent)
        report(capsys)
        assert_learned_exactly_once(run)

        run, _ = submit(url, demo_project(tiny_model))
        wait_until(lambda: frozen_holding_a_batch(rollout_host, run), "a batch of step 1+ in progress")
        orphans = list(RolloutBatch.objects.filter(run=run, status=RolloutBatch.Status.RUNNING))
        rollout_host.kill()
        assert rollout_ns.pids() == set()
        fresh_ns = network.namespace("rollout2")
        fresh_host = NamespaceHost(env, fresh_ns, tmp_path / "fresh-rollout-host")
        with hosts_killed(fresh_host):
            fresh_pid = fresh_host.worker("rollout,eval").pid
            run = wait_for_terminal(run.pk)
    assert_learned_exactly_once(run)
    assert run.restarts == 0
    for orphan in orphans:
        again = RolloutBatch.objects.get(pk=orphan.pk)
        assert (again.attempts, again.status) == (orphan.attempts + 1, RolloutBatch.Status.DONE)
        assert again.worker.endswith(f":{fresh_pid}")  # the fresh host finished what the dead one held
    # Each host kept to its own FLYWHEEL_HOME: the rollout hosts only cached what they fetched.
    name = f"{run.pk}-{run.key}"
    assert (shared_mount / "runs" / name / "policies").is_dir()
    for home in (tmp_path / "rollout-host", tmp_path / "fresh-rollout-host"):
        assert not (home / "runs").exists()
    assert (tmp_path / "fresh-rollout-host" / "cache" / "artifacts" / "runs" / name / "policies").is_dir()


def test_a_rollout_worker_grades_in_sandboxes_on_a_remote_docker_engine_over_tls(
    tiny_model, tmp_path, network
):
    """A second dockerd in a namespace of its own, reached only over TCP with TLS client
    certificates (a point-to-point link from the rollout host); the image loaded into it with
    `docker save | docker load`. A rollout host's worker grades every episode through it."""
    env = relayed_env(network, tmp_path / "shared-mount")
    rollout_ns, engine_ns = network.namespace("rollout"), network.namespace("engine")
    _, engine_address = network.link(rollout_ns, engine_ns)
    engine = DockerEngine(engine_ns, [engine_address, engine_ns.address], tmp_path / "engine")
    try:
        wait_until(lambda: engine.answers(engine_ns.address), "the second Docker engine", timeout=120)
        engine.image_load(settings.FLYWHEEL_SANDBOX_IMAGE, engine_ns.address)
        anonymous = docker.tls.TLSConfig(ca_cert=str(engine.client_tls / "ca.pem"), verify=True)
        with pytest.raises(requests.exceptions.SSLError, match="(?i)certificate"):
            docker_client_over(engine.url(engine_ns.address), anonymous)  # no client certificate
        log = tmp_path / "engine" / "dockerd.log"
        refused = "client didn't provide a certificate"
        wait_until(lambda: refused in log.read_text(), "the engine logging why it refused", timeout=30)
        remote = {
            "FLYWHEEL_SANDBOX_BACKEND": "docker",
            "FLYWHEEL_SANDBOX_DOCKER_HOST": engine.url(engine_address),
            "FLYWHEEL_SANDBOX_DOCKER_CERT_PATH": str(engine.client_tls),
        }
        learner_host = Host(env)
        rollout_host = NamespaceHost(env | remote, rollout_ns, tmp_path / "rollout-host")
        with hosts_killed(learner_host, rollout_host):
            learner_host.worker("learner,control")
            rollout_host.worker("rollout,eval")
            setup = demo_project(tiny_model)
            since = time.time()
            body = run_body(setup, steps=1, eval_every=100)
            response = api_client_for(setup["owner"]).post("/api/v1/runs", body, format="json")
            assert response.status_code == 201, response.json()
            run = wait_for_terminal(response.json()["id"])
        until = time.time()
        created = engine.client(engine_ns.address).events(
            since=int(since),
            until=int(until) + 1,
            decode=True,
            filters={"type": "container", "event": "create", "label": LABEL},
        )
        sandboxes = [event["id"] for event in created]
    finally:
        engine.stop()
    assert run.status == Run.Status.SUCCEEDED, run.error
    trajectories = Trajectory.objects.filter(run=run)
    assert trajectories.count() == BATCH * GROUP
    assert sorted(set(trajectories.values_list("outcome", flat=True))) == ["scored"]
    assert sandboxes, "no sandbox container was created on the remote engine"

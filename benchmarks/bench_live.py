"""Benchmark: the live view's two promises (make bench-live).

1. Ingest: metric points/s written by a learner, through its own call (`metrics_write`: the
   step's points in one executemany, then the websocket notification) on a fresh database
   (SQLite in WAL with synchronous=NORMAL under a temporary FLYWHEEL_HOME, unless DATABASE_URL is
   set), INGEST_REPEATS rounds (default 3) against the peer, order alternated, median of the
   per-round ratios. A learner on another host makes the same call over its database connection.
   Baselines in the same run, MLflow from its own virtualenv (MLFLOW_PYTHON, default
   /tmp/mlflow-venv/bin/python;
   `make bench-live` creates it), never the project's:
   - like for like: an in-process `MlflowClient` on SQLite with the same pragmas as Flywheel's
     (WAL, synchronous=NORMAL), the same points as one `log_batch` a step: the headline ratio;
   - labelled `mlflow_server`: MLflow's tracking server (`mlflow server`, stock SQLite settings)
     over HTTP, as MLflow's users deploy it.
2. Delivery: 200 websocket viewers of one run on the web server `make up` runs (uvicorn with
   FLYWHEEL_WEB_WORKERS processes, the configured channel layer), on 127.0.0.1; an emitter in its
   own process sends real 20-metric step messages (20 a second for DELIVERY_SECONDS, default
   30 s), stamped with the send time; each viewer records when it got them. p50 and p99 over every
   (message, viewer) pair, per repeat (DELIVERY_REPEATS, default 5); the headline is the median
   repeat's, with the range beside it (two quiet runs of one repeat each once gave 133 and 262 ms).

Targets: ingest at least 5x the like-for-like MLflow's; p99 delivery under 250 ms. Prints one line
of JSON last.
"""

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS = 2000
METRICS_PER_STEP = 20  # about what record_metrics writes for a GRPO step
VIEWERS = 200
MESSAGE_INTERVAL = 0.05  # seconds between emits: 20 metric messages a second
DELIVERY_SECONDS = float(os.environ.get("DELIVERY_SECONDS", "30"))
DELIVERY_REPEATS = int(os.environ.get("DELIVERY_REPEATS", "5"))
INGEST_REPEATS = int(os.environ.get("INGEST_REPEATS", "3"))
MESSAGES = int(DELIVERY_SECONDS / MESSAGE_INTERVAL)
MLFLOW_PYTHON = os.environ.get("MLFLOW_PYTHON", "/tmp/mlflow-venv/bin/python")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


def metric_names() -> list[str]:
    return [f"bench/metric_{index:02d}" for index in range(METRICS_PER_STEP)]


# --- Flywheel ------------------------------------------------------------------------------


def django_setup():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from webapp.embedded_redis import redis_start

    call_command("migrate", verbosity=0)
    if settings.EMBEDDED_REDIS:
        redis_start(home=settings.FLYWHEEL_HOME, port=settings.FLYWHEEL_REDIS_PORT)


def make_run():
    """A run row with what its foreign keys need, made through the ORM (the bench's own data)."""
    from projects import services as project_services
    from rewards import services as reward_services
    from runs import services
    from runs.models import Run

    tag = time.time_ns()
    user = services.User.objects.create_user(username=f"bench-{tag}")
    project = project_services.project_create(name=f"bench-{tag}", by=user)
    task_set = project_services.task_set_create(project=project, name="bench", by=user)
    line = json.dumps({"id": "q", "prompt": "1+1?", "reference": "2"}).encode() + b"\n"
    version = project_services.task_set_import(
        task_set=task_set, stream=[line], file_format="jsonl", by=user
    ).version
    rule = reward_services.reward_rule_create(
        project=project,
        name="exact",
        by=user,
        spec={
            "type": "string_check",
            "name": "exact",
            "input": "{{sample.output_text}}",
            "reference": "{{item.reference}}",
            "operation": "eq",
        },
    )
    run = Run.objects.create(
        project=project,
        name="bench",
        task_set_version=version,
        reward_rule_version=rule.versions.get(),
        tier_config={},
        max_steps=STEPS,
    )
    return user, run


def flywheel_ingest(run) -> dict:
    """The learner's own metrics_write, step after step: points/s including the notification."""
    from django.db import transaction

    from runs.models import MetricPoint
    from runs.services import metrics_write

    names = metric_names()
    started = time.perf_counter()
    for step in range(1, STEPS + 1):
        values = {name: step * 0.001 + index for index, name in enumerate(names)}
        with transaction.atomic():  # the learner writes a step's points in its step's transaction
            metrics_write(run, step, values)
    elapsed = time.perf_counter() - started
    stored = MetricPoint.objects.filter(run=run).count()
    assert stored == STEPS * METRICS_PER_STEP, stored
    return {"points": stored, "seconds": round(elapsed, 3), "points_per_s": round(stored / elapsed)}


def ingest_summary(rounds: list[tuple[dict, dict]]) -> tuple[dict, dict, list[float]]:
    """The median round of each side, and the per-round ratios (none without MLflow)."""
    ratios = [
        ours["points_per_s"] / theirs["points_per_s"] for ours, theirs in rounds if "points_per_s" in theirs
    ]
    ours = sorted((r[0] for r in rounds), key=lambda r: r["points_per_s"])[len(rounds) // 2]
    measured = [r[1] for r in rounds if "points_per_s" in r[1]]
    theirs = (
        sorted(measured, key=lambda r: r["points_per_s"])[len(measured) // 2] if measured else rounds[0][1]
    )
    return ours, theirs, ratios


# --- MLflow --------------------------------------------------------------------------------

MLFLOW_CLIENT = textwrap.dedent(
    """
    import json, sys, time
    if sys.argv[1].startswith("sqlite:"):  # in process: Flywheel's own SQLite pragmas
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        @event.listens_for(Engine, "connect")
        def pragmas(connection, record):
            cursor = connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient
    uri, steps, per_step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment(f"bench-{time.time_ns()}")
    run_id = client.create_run(experiment).info.run_id
    names = [f"bench/metric_{i:02d}" for i in range(per_step)]
    started = time.perf_counter()
    for step in range(1, steps + 1):
        now = int(time.time() * 1000)
        metrics = [Metric(n, step * 0.001 + i, now, step) for i, n in enumerate(names)]
        client.log_batch(run_id, metrics=metrics)
    elapsed = time.perf_counter() - started
    stored = sum(len(client.get_metric_history(run_id, n)) for n in names)
    rate = round(stored / elapsed)
    print(json.dumps({"points": stored, "seconds": round(elapsed, 3), "points_per_s": rate}))
    """
)


def mlflow_version() -> str:
    return subprocess.run(
        [MLFLOW_PYTHON, "-c", "import mlflow; print(mlflow.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def mlflow_client(uri: str) -> dict:
    out = subprocess.run(
        [MLFLOW_PYTHON, "-c", MLFLOW_CLIENT, uri, str(STEPS), str(METRICS_PER_STEP)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1]) | {"version": mlflow_version()}


def mlflow_local_ingest(workdir: Path, repeat: int) -> dict:
    """Like for like: MlflowClient in its process on SQLite with Flywheel's pragmas (a fresh
    database each repeat, as Flywheel's side gets a fresh run)."""
    if not Path(MLFLOW_PYTHON).exists():
        return {"error": f"no MLflow interpreter at {MLFLOW_PYTHON} (set MLFLOW_PYTHON)"}
    store = workdir / f"mlflow-local-{repeat}"
    store.mkdir()
    return mlflow_client(f"sqlite:///{store / 'mlflow.db'}")


def mlflow_ingest(workdir: Path) -> dict:
    """MLflow's tracking server over HTTP, stock settings."""
    if not Path(MLFLOW_PYTHON).exists():
        return {"error": f"no MLflow interpreter at {MLFLOW_PYTHON} (set MLFLOW_PYTHON)"}
    port = free_port()
    store = workdir / "mlflow"
    store.mkdir()
    env = os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = subprocess.Popen(
        [
            MLFLOW_PYTHON,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{store / 'mlflow.db'}",
            "--default-artifact-root",
            str(store / "artifacts"),
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        wait_for_port(port, timeout=120)
        return mlflow_client(f"http://127.0.0.1:{port}")
    finally:
        server.terminate()
        server.wait(timeout=30)


# --- delivery latency -----------------------------------------------------------------------


async def viewers_receive(port: int, run_id: int, token: str, ready: threading.Event) -> list[float]:
    import websockets

    url = f"ws://127.0.0.1:{port}/ws/runs/{run_id}/"
    headers = {"Authorization": f"Bearer {token}"}
    latencies: list[float] = []

    async def viewer(socket) -> None:
        got = 0
        while got < MESSAGES:
            message = json.loads(await socket.recv())
            if message.get("event") != "metrics":
                continue
            latencies.append(time.time() - message["payload"]["sent_at"])
            got += 1

    sockets = []
    for _ in range(VIEWERS):
        sockets.append(
            await websockets.connect(
                url, additional_headers=headers, origin="http://127.0.0.1", open_timeout=30, max_queue=None
            )
        )
    ready.set()
    await asyncio.wait_for(
        asyncio.gather(*(viewer(socket) for socket in sockets)), timeout=DELIVERY_SECONDS * 4 + 60
    )
    await asyncio.gather(*(socket.close() for socket in sockets))
    return latencies


EMITTER = textwrap.dedent(
    """
    import django, json, sys, time
    django.setup()
    from django.db import transaction
    from core import events
    run_id, messages, interval = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    names = [f"bench/metric_{i:02d}" for i in range(20)]
    sys.stdin.readline()  # the viewers have joined
    for step in range(1, messages + 1):
        with transaction.atomic():
            values = {name: step * 0.001 + index for index, name in enumerate(names)}
            events.run_event(run_id, "metrics", {"step": step, "values": values, "sent_at": time.time()})
        time.sleep(interval)
    """
)


def emitter(run_id: int, ready: threading.Event) -> None:
    """A learner-like process of its own: 20-metric step messages through core.events after commit."""
    process = subprocess.Popen(
        [sys.executable, "-c", EMITTER, str(run_id), str(MESSAGES), str(MESSAGE_INTERVAL)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    ready.wait(timeout=120)
    time.sleep(1.0)  # every viewer has joined the group
    process.stdin.write("go\n")
    process.stdin.close()
    process.wait(timeout=DELIVERY_SECONDS * 4 + 60)


def web_server_start(port: int, workdir: Path) -> subprocess.Popen:
    """The web server as `make up` starts it (its argv, its worker count), on 127.0.0.1."""
    from django.conf import settings

    from webapp.web_server import web_argv

    argv = web_argv(python=sys.executable, bind="127.0.0.1", port=port, workers=settings.FLYWHEEL_WEB_WORKERS)
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=open(workdir / "web.log", "a"),  # noqa: SIM115 - closed with the process
        env=os.environ.copy(),
        start_new_session=True,  # its worker processes are stopped with it
    )


def latency_summary(latencies: list[float]) -> dict:
    latencies = sorted(latencies)
    expected = VIEWERS * MESSAGES
    assert len(latencies) == expected, (len(latencies), expected)
    return {
        "p50_ms": round(1000 * statistics.median(latencies), 1),
        "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 1),
        "max_ms": round(1000 * latencies[-1], 1),
    }


def delivery(user, run, workdir: Path) -> dict:
    """DELIVERY_REPEATS rounds of 200 viewers against one server; the median round's figures."""
    import signal

    import uvloop
    from django.conf import settings

    from projects import services as project_services

    _, token = project_services.api_token_create(user=user, name="bench")
    port = free_port()
    server = web_server_start(port, workdir)
    rounds = []
    try:
        wait_for_port(port)
        for _ in range(DELIVERY_REPEATS):
            ready = threading.Event()
            thread = threading.Thread(target=emitter, args=(run.pk, ready), daemon=True)
            thread.start()
            # uvloop: the viewers stand in for browsers elsewhere; their CPU here is the harness's.
            latencies = uvloop.run(viewers_receive(port, run.pk, token, ready))
            thread.join(timeout=DELIVERY_SECONDS * 4 + 60)
            rounds.append(latency_summary(latencies))
            print(f"delivery round {len(rounds)}: {rounds[-1]}", file=sys.stderr)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    p99s = [r["p99_ms"] for r in rounds]
    median = sorted(rounds, key=lambda r: r["p99_ms"])[len(rounds) // 2]
    return {
        "viewers": VIEWERS,
        "messages": MESSAGES,
        "repeats": len(rounds),
        "web_server": f"uvicorn, {settings.FLYWHEEL_WEB_WORKERS} workers",
        "channel_layer": settings.CHANNEL_LAYERS["default"]["BACKEND"].rsplit(".", 1)[-1],
        **median,
        "p99_ms_range": [min(p99s), max(p99s)],
        "per_repeat": rounds,
    }


def main() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="flywheel-bench-live-"))
    if "DATABASE_URL" not in os.environ:
        os.environ["FLYWHEEL_HOME"] = str(workdir / "home")
        os.environ.setdefault("FLYWHEEL_REDIS_PORT", str(free_port()))
    django_setup()
    try:
        user, run = make_run()
        rounds = []  # (flywheel, like-for-like MLflow), order alternated
        for repeat in range(INGEST_REPEATS):
            target = run if repeat == 0 else make_run()[1]  # a fresh run each round
            if repeat % 2 == 0:
                ingest = flywheel_ingest(target)
                baseline = mlflow_local_ingest(workdir, repeat)
            else:
                baseline = mlflow_local_ingest(workdir, repeat)
                ingest = flywheel_ingest(target)
            rounds.append((ingest, baseline))
            print(
                f"ingest round {repeat + 1}: flywheel {ingest}; mlflow in process {baseline}", file=sys.stderr
            )
        ingest, baseline, ratios = ingest_summary(rounds)
        server = mlflow_ingest(workdir)
        print(f"mlflow log_batch through its tracking server: {server}", file=sys.stderr)
        latency = delivery(user, run, workdir)
        print(f"delivery: {latency}", file=sys.stderr)
    finally:
        from webapp.stack import process_stop

        process_stop("redis")  # the embedded Redis django_setup started (a daemon: it would outlive us)
    ratio = statistics.median(ratios) if ratios else None
    result = {
        "benchmark": "live",
        "steps": STEPS,
        "metrics_per_step": METRICS_PER_STEP,
        "flywheel_ingest_points_per_s": ingest["points_per_s"],
        "mlflow_log_batch_points_per_s": baseline.get("points_per_s"),
        "mlflow_server_log_batch_points_per_s": server.get("points_per_s"),
        "mlflow_version": baseline.get("version"),
        "ingest_repeats": INGEST_REPEATS,
        "ingest_ratio": round(ratio, 1) if ratio else None,
        "ingest_ratio_range": [round(min(ratios), 1), round(max(ratios), 1)] if ratios else None,
        "ingest_ratio_vs_server": round(ingest["points_per_s"] / server["points_per_s"], 1)
        if "points_per_s" in server
        else None,
        "ingest_target_met": bool(ratio and ratio >= 5),
        "delivery_viewers": latency["viewers"],
        "delivery_messages": latency["messages"],
        "delivery_seconds": DELIVERY_SECONDS,
        "delivery_repeats": latency["repeats"],
        "delivery_web_server": latency["web_server"],
        "delivery_channel_layer": latency["channel_layer"],
        "delivery_p50_ms": latency["p50_ms"],
        "delivery_p99_ms": latency["p99_ms"],
        "delivery_p99_ms_range": latency["p99_ms_range"],
        "delivery_max_ms": latency["max_ms"],
        "delivery_target_met": latency["p99_ms"] < 250,
        "database": "postgresql" if "DATABASE_URL" in os.environ else "sqlite",
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""Benchmark: trace ingestion over REST (make bench-traces).

Flywheel's way: `POST /api/v1/traces` with batches of 100 traces (what the client's `log_trace`
sends from its background batcher), from the server `make up` starts (uvicorn with
FLYWHEEL_WEB_WORKERS processes) on a fresh database (SQLite under a temporary FLYWHEEL_HOME unless
DATABASE_URL is set).

The peer, in the same run: MLflow's tracking server (MLFLOW_PYTHON, its own virtualenv as for
bench-live; `mlflow server`, as many workers, its SQLite store), which ingests traces the
OpenTelemetry way, a batch of spans per request (`POST /v1/traces`, OTLP/HTTP JSON), and writes
the batch before it answers, as Flywheel does. The same traces (one span each: the chat request as
the span's inputs, the answer as its outputs, model, score, outcome, latency, metadata and any
feedback as attributes), the same batch size, the same keep-alive HTTP client on one thread, every
body encoded before the clock starts; after each round the peer's database is counted, as
Flywheel's answers are, so both sides are held to having stored every trace.

Also, labelled for what it is: `unbatched`, Flywheel's own endpoint sent one trace per request.
It is not a peer (Langfuse's ingestion, like MLflow's and Flywheel's, takes batches); it shows
what batching saves a client that would report each trace alone.

Each round every side sends the same number of new traces; the order reverses every other
round. Reported: median traces/s of each side and the medians of the per-round ratios, with their
range. Prints one line of JSON last.
"""

import json
import logging
import os
import secrets
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = int(os.environ.get("BENCH_TRACES_ROUNDS", "5"))
TRACES_PER_ROUND = int(os.environ.get("BENCH_TRACES_PER_ROUND", "600"))
BATCH = 100
MLFLOW_PYTHON = os.environ.get("MLFLOW_PYTHON", "/tmp/mlflow-venv/bin/python")
MLFLOW_EXPERIMENT = "0"  # the store's Default experiment
SIDES = ("flywheel", "mlflow", "unbatched")


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


def django_setup() -> None:
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


def project_and_token() -> tuple[int, str]:
    from projects import services as project_services
    from runs import services

    user = services.User.objects.create_user(username=f"bench-{uuid.uuid4().hex[:8]}")
    project = project_services.project_create(name=f"bench-traces-{uuid.uuid4().hex[:8]}", by=user)
    _, token = project_services.api_token_create(user=user, name="bench")
    return project.pk, token


def make_trace(index: int, tag: str) -> dict:
    """One production trace of typical size: a chat request, an answer, outcome and metadata."""
    trace = {
        "id": f"{tag}-{index}",
        "messages": [
            {"role": "system", "content": "You are a support assistant for an online shop. Answer briefly."},
            {
                "role": "user",
                "content": f"Order {index} has not arrived after {index % 9 + 3} days. What can I do?",
            },
        ],
        "completion": "I am sorry about the delay. Orders usually arrive within a week; I have opened a "
        f"ticket for order {index} and you will get an update by email within 24 hours.",
        "model": "support-v3",
        "score": (index % 10) / 10,
        "success": index % 4 != 0,
        "latency_ms": 200.0 + index % 300,
        "metadata": {"customer": f"c{index % 50}", "region": "eu", "session": f"s{index // 3}"},
    }
    if index % 7 == 0:
        trace["feedback"] = {"thumbs": "down", "correction": "Refund the order and apologise."}
    return trace


def flywheel_bodies(project: int, traces: list[dict], per_request: int) -> list[bytes]:
    return [
        json.dumps({"project": project, "traces": traces[start : start + per_request]}).encode()
        for start in range(0, len(traces), per_request)
    ]


def otlp_value(value) -> dict:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    return {"stringValue": json.dumps(value)}


def otlp_span(trace: dict) -> dict:
    """One trace as one OpenTelemetry span in MLflow's terms: inputs, outputs and the rest as
    attributes; a fresh trace id, so each is a new trace."""
    end = time.time_ns()
    attributes = {
        "mlflow.spanType": json.dumps("CHAT_MODEL"),
        "mlflow.spanInputs": json.dumps({"messages": trace["messages"]}),
        "mlflow.spanOutputs": json.dumps(trace["completion"]),
        "client_id": trace["id"],
        "model": trace["model"],
        "score": trace["score"],
        "success": trace["success"],
        "latency_ms": trace["latency_ms"],
        "metadata": trace["metadata"],
    }
    if "feedback" in trace:
        attributes["feedback"] = trace["feedback"]
    return {
        "traceId": secrets.token_hex(16),
        "spanId": secrets.token_hex(8),
        "name": "chat",
        "kind": 1,
        "startTimeUnixNano": str(end - int(trace["latency_ms"] * 1e6)),
        "endTimeUnixNano": str(end),
        "attributes": [{"key": key, "value": otlp_value(value)} for key, value in attributes.items()],
        "status": {"code": 1},
    }


def otlp_bodies(traces: list[dict], per_request: int) -> list[bytes]:
    """OTLP/HTTP JSON export requests, `per_request` traces each."""
    bodies = []
    for start in range(0, len(traces), per_request):
        spans = [otlp_span(trace) for trace in traces[start : start + per_request]]
        resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "support-bot"}}]}
        request = {
            "resourceSpans": [
                {"resource": resource, "scopeSpans": [{"scope": {"name": "bench"}, "spans": spans}]}
            ]
        }
        bodies.append(json.dumps(request).encode())
    return bodies


def post_flywheel(client: httpx.Client, bodies: list[bytes]) -> float:
    """Seconds to post `bodies`; every answer must say all its traces were created."""
    started = time.perf_counter()
    for body in bodies:
        response = client.post("/api/v1/traces", content=body, headers={"Content-Type": "application/json"})
        response.raise_for_status()
        assert response.json()["created"] == len(json.loads(body)["traces"]), response.text
    return time.perf_counter() - started


def post_mlflow(client: httpx.Client, bodies: list[bytes]) -> float:
    headers = {"Content-Type": "application/json", "x-mlflow-experiment-id": MLFLOW_EXPERIMENT}
    started = time.perf_counter()
    for body in bodies:
        client.post("/v1/traces", content=body, headers=headers).raise_for_status()
    return time.perf_counter() - started


def mlflow_traces(database: Path) -> int:
    with sqlite3.connect(database) as connection:
        return connection.execute("SELECT COUNT(*) FROM trace_info").fetchone()[0]


def mlflow_start(workdir: Path, workers: int) -> tuple[subprocess.Popen, int, Path]:
    """MLflow's tracking server on its own SQLite store, `workers` processes, stock settings."""
    port, store = free_port(), workdir / "mlflow"
    store.mkdir()
    argv = [MLFLOW_PYTHON, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}", "--workers", str(workers)]
    argv += ["--default-artifact-root", str(store / "artifacts"), "--uvicorn-opts", "--no-access-log"]
    # No background jobs and no usage reports: the server does only the ingestion here.
    env = os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    log = open(workdir / "mlflow.log", "w")  # noqa: SIM115 - closed with the process
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    wait_for_port(port, timeout=180)
    return server, port, store / "mlflow.db"


def mlflow_version() -> str:
    done = subprocess.run(
        [MLFLOW_PYTHON, "-c", "import mlflow; print(mlflow.__version__)"], capture_output=True, text=True
    )
    return done.stdout.strip()


def ratios_of(rates: dict[str, list[float]], side: str, over: str) -> dict:
    ratios = [a / b for a, b in zip(rates[side], rates[over], strict=True)]
    return {
        "median": round(statistics.median(ratios), 2),
        "range": [round(min(ratios), 2), round(max(ratios), 2)],
    }


def main() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="flywheel-bench-traces-"))
    if "DATABASE_URL" not in os.environ:
        os.environ["FLYWHEEL_HOME"] = str(workdir / "home")
        os.environ.setdefault("FLYWHEEL_REDIS_PORT", str(free_port()))
    os.environ["FLYWHEEL_API_RATE"] = "1000000/min"  # the bench measures ingestion, not throttling
    django_setup()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request would time the terminal
    project, token = project_and_token()
    from django.conf import settings

    from webapp.web_server import web_argv

    sides = SIDES if Path(MLFLOW_PYTHON).exists() else tuple(side for side in SIDES if side != "mlflow")
    port = free_port()
    workers = settings.FLYWHEEL_WEB_WORKERS
    server = subprocess.Popen(
        web_argv(python=sys.executable, bind="127.0.0.1", port=port, workers=workers),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=open(workdir / "web.log", "w"),  # noqa: SIM115 - closed with the process
        env=os.environ.copy(),
    )
    mlflow = None
    rates: dict[str, list[float]] = {side: [] for side in sides}
    try:
        wait_for_port(port)
        headers = {"Authorization": f"Bearer {token}"}
        flywheel = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60)
        clients = {"flywheel": flywheel, "unbatched": flywheel}
        warm = [make_trace(i, "warm") for i in range(BATCH)]
        post_flywheel(flywheel, flywheel_bodies(project, warm, BATCH))  # warm both paths
        warm_single = [make_trace(i, "warm-single") for i in range(20)]  # new ids: created, not unchanged
        post_flywheel(flywheel, flywheel_bodies(project, warm_single, 1))
        if "mlflow" in sides:
            mlflow, mlflow_port, mlflow_db = mlflow_start(workdir, workers)
            clients["mlflow"] = httpx.Client(base_url=f"http://127.0.0.1:{mlflow_port}", timeout=60)
            post_mlflow(clients["mlflow"], otlp_bodies(warm, BATCH))
        for round_ in tqdm(range(ROUNDS), desc="rounds", file=sys.stderr):
            for side in sides if round_ % 2 == 0 else reversed(sides):
                traces = [make_trace(i, f"{side}-{round_}") for i in range(TRACES_PER_ROUND)]
                if side == "mlflow":
                    stored = mlflow_traces(mlflow_db)
                    seconds = post_mlflow(clients[side], otlp_bodies(traces, BATCH))
                    stored = mlflow_traces(mlflow_db) - stored
                    assert stored == TRACES_PER_ROUND, f"MLflow stored {stored} of {TRACES_PER_ROUND} traces"
                else:
                    per_request = BATCH if side == "flywheel" else 1
                    seconds = post_flywheel(clients[side], flywheel_bodies(project, traces, per_request))
                rates[side].append(TRACES_PER_ROUND / seconds)
            line = ", ".join(f"{side} {rates[side][-1]:.0f}/s" for side in sides)
            print(f"round {round_}: {line}", file=sys.stderr)
    finally:
        for process in (server, mlflow):
            if process is not None:
                process.terminate()
                process.wait(timeout=30)
    result = {
        "benchmark": "traces",
        "rounds": ROUNDS,
        "traces_per_round_per_side": TRACES_PER_ROUND,
        "batch_size": BATCH,
        "flywheel_traces_per_s": round(statistics.median(rates["flywheel"]), 1),
    }
    if "mlflow" in sides:
        result["mlflow_traces_per_s"] = round(statistics.median(rates["mlflow"]), 1)
        result["ratio_vs_mlflow"] = ratios_of(rates, "flywheel", "mlflow")
        result["mlflow"] = f"{mlflow_version()}, OTLP/HTTP JSON, {workers} workers, sqlite"
    else:
        result["mlflow"] = f"not run: no MLflow interpreter at {MLFLOW_PYTHON} (set MLFLOW_PYTHON)"
    result["unbatched_traces_per_s"] = round(statistics.median(rates["unbatched"]), 1)
    result["batching_gain"] = ratios_of(rates, "flywheel", "unbatched")
    result["server"] = f"uvicorn, {workers} workers"
    result["database"] = "postgresql" if "DATABASE_URL" in os.environ else "sqlite"
    result["load_average"] = round(os.getloadavg()[0], 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

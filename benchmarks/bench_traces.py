"""Benchmark: trace ingestion over REST (make bench-traces).

Flywheel's way: `POST /api/v1/traces` with batches of 100 traces (what the client's `log_trace`
sends from its background batcher). Baseline in the same run: Langfuse-style single-event
ingestion, one trace per request, to the same endpoint of the same server, through the same
keep-alive HTTP client on one thread. Both sides send the same number of new traces (the same
generated content) in each round; rounds alternate which side goes first. The server is the one
`make up` starts (uvicorn with FLYWHEEL_WEB_WORKERS processes) on a fresh database (SQLite under a
temporary FLYWHEEL_HOME unless DATABASE_URL is set). Reported: median traces/s of each side over
the rounds and the median of the per-round ratios, with their range. Prints one line of JSON last.
"""

import json
import logging
import os
import socket
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
    from runs import services

    user = services.User.objects.create_user(username=f"bench-{uuid.uuid4().hex[:8]}")
    project = services.project_create(name=f"bench-traces-{uuid.uuid4().hex[:8]}", by=user)
    _, token = services.api_token_create(user=user, name="bench")
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


def send(client: httpx.Client, project: int, traces: list[dict], per_request: int) -> float:
    """Seconds to post `traces`, `per_request` a request; every answer must say all were created."""
    started = time.perf_counter()
    for start in range(0, len(traces), per_request):
        chunk = traces[start : start + per_request]
        response = client.post("/api/v1/traces", json={"project": project, "traces": chunk})
        response.raise_for_status()
        assert response.json()["created"] == len(chunk), response.text
    return time.perf_counter() - started


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

    port = free_port()
    workers = settings.FLYWHEEL_WEB_WORKERS
    server = subprocess.Popen(
        web_argv(python=sys.executable, bind="127.0.0.1", port=port, workers=workers),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=open(workdir / "web.log", "w"),  # noqa: SIM115 - closed with the process
        env=os.environ.copy(),
    )
    rates: dict[str, list[float]] = {"batched": [], "single": []}
    ratios = []
    try:
        wait_for_port(port)
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60) as client:
            send(client, project, [make_trace(i, "warm") for i in range(BATCH)], BATCH)  # warm both paths
            send(client, project, [make_trace(i, "warm1") for i in range(20)], 1)
            for round_ in tqdm(range(ROUNDS), desc="rounds", file=sys.stderr):
                order = ["batched", "single"] if round_ % 2 == 0 else ["single", "batched"]
                for side in order:
                    traces = [make_trace(i, f"{side}-{round_}") for i in range(TRACES_PER_ROUND)]
                    seconds = send(client, project, traces, BATCH if side == "batched" else 1)
                    rates[side].append(TRACES_PER_ROUND / seconds)
                ratios.append(rates["batched"][-1] / rates["single"][-1])
                batched, single = rates["batched"][-1], rates["single"][-1]
                print(f"round {round_}: batched {batched:.0f}/s, single {single:.0f}/s", file=sys.stderr)
    finally:
        server.terminate()
        server.wait(timeout=30)
    result = {
        "benchmark": "traces",
        "rounds": ROUNDS,
        "traces_per_round_per_side": TRACES_PER_ROUND,
        "batch_size": BATCH,
        "batched_traces_per_s": round(statistics.median(rates["batched"]), 1),
        "single_event_traces_per_s": round(statistics.median(rates["single"]), 1),
        "ratio_median": round(statistics.median(ratios), 2),
        "ratio_min": round(min(ratios), 2),
        "ratio_max": round(max(ratios), 2),
        "server": f"uvicorn, {workers} workers",
        "database": "postgresql" if "DATABASE_URL" in os.environ else "sqlite",
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

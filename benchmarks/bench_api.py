"""Benchmark: the API under 50 concurrent clients (make bench-api).

The same Django views, on the embedded default (SQLite in WAL mode and a private Redis, under a
temporary FLYWHEEL_HOME), served two ways with the same number of server processes:

- daphne: Channels' own server, as `make up` served HTTP before. Daphne has no workers option;
  several Daphne processes share one listening socket the parent opened (`--fd`), as Channels'
  deployment docs run them under a process manager. Access log off, as on the other side.
- uvicorn: the web server `make up` starts now (`webapp.stack.web_argv`), with as many workers.

Both at 1 process and at FLYWHEEL_WEB_WORKERS processes (the stack's default: two per core), each
with Prometheus' multiprocess folder as the stack sets it. For each of a list endpoint
(`GET /api/v1/runs`, bearer token, 50 runs in the project) and the metrics endpoint
(`GET /metrics`), 50 clients on keep-alive connections (one asyncio client process, the same for
every server) send requests back to back for DURATION seconds after a warm-up; requests/s, p50 and
p99 are measured on the client. Every (processes, server) pair runs once per round over REPEATS
rounds, in the opposite order in odd rounds; medians are reported, the ratio of the medians at the
same process count (the headline is at FLYWHEEL_WEB_WORKERS on both sides), and requests/s per
server process. Ends with one line of JSON.

The CPU the server processes and the client used over the timed span is measured too (psutil),
with the server's CPU milliseconds per request: the views are CPU-bound, so on a machine with
fewer cores than processes the processes share the cores, and a server gains only by spending
less CPU per request.
"""

import asyncio
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from webapp.embedded_redis import redis_binary  # noqa: E402  (no Django needed)
from webapp.web_server import default_web_workers  # noqa: E402

CLIENTS = int(os.environ.get("BENCH_API_CLIENTS", "50"))
DURATION = float(os.environ.get("BENCH_API_SECONDS", "8"))
WARMUP = 3.0
REPEATS = int(os.environ.get("BENCH_API_REPEATS", "3"))
RUNS = 50
FIGURES = ("rps", "p50_ms", "p99_ms", "server_cores", "client_cores", "server_cpu_ms_per_request")
SERVERS = ("daphne", "uvicorn")
IDLE_CORES = 0.1  # a server tree using less than this has finished loading Django in every process
ENDPOINTS = {"list": "/api/v1/runs?limit=20", "metrics": "/metrics"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- the record ----------------------------------------------------------------------------


def seed(env: dict[str, str]) -> str:
    """Migrate a fresh database, make a project with RUNS runs; return a bearer token."""
    code = f"""
import django, json
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from rewards import services as rewards
from runs import services
from runs.models import Run
from projects import services as project_services
user = services.User.objects.create_user(username="bench")
project = project_services.project_create(name="bench", by=user)
task_set = project_services.task_set_create(project=project, name="bench", by=user)
lines = [json.dumps({{"id": f"q{{n}}", "prompt": f"{{n}} + 1?", "reference": str(n + 1)}}).encode() + b"\\n"
         for n in range(40)]
report = project_services.task_set_import(task_set=task_set, stream=lines, file_format="jsonl", by=user)
version = report.version
spec = {{"type": "string_check", "name": "exact", "operation": "eq",
        "input": "{{{{sample.output_text}}}}", "reference": "{{{{item.reference}}}}"}}
rule = rewards.reward_rule_create(project=project, name="exact", by=user, spec=spec)
Run.objects.bulk_create([
    Run(project=project, name=f"run {{n}}", task_set_version=version, reward_rule_version=rule.versions.get(),
        tier_config={{}}, max_steps=10, status="succeeded", created_by=user)
    for n in range({RUNS})
])
print(project_services.api_token_create(user=user, name="bench")[1])
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip().splitlines()[-1]


# --- the servers ---------------------------------------------------------------------------


def uvicorn_argv(port: int, processes: int, env: dict[str, str]) -> list[str]:
    code = "import django; django.setup(); from webapp.stack import web_argv; print(json.dumps(web_argv()))"
    # web_argv reads PORT and FLYWHEEL_WEB_WORKERS from the settings
    done = subprocess.run(
        [sys.executable, "-c", f"import json; {code}"],
        cwd=ROOT,
        env=env | {"PORT": str(port), "FLYWHEEL_WEB_WORKERS": str(processes)},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def listening_socket() -> socket.socket:
    """The socket Daphne's processes share: the kernel hands each new connection to one of them."""
    shared = socket.socket()
    shared.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    shared.bind(("127.0.0.1", 0))
    shared.listen(1024)
    shared.set_inheritable(True)
    return shared


def start(name: str, processes: int, env: dict[str, str], log: Path) -> tuple[list[subprocess.Popen], int]:
    """The server's processes (Daphne's, or uvicorn's supervisor) and the port they answer on."""
    with log.open("ab") as output:
        if name == "uvicorn":
            port = free_port()
            argv = uvicorn_argv(port, processes, env)
            return [subprocess.Popen(argv, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT)], port
        shared = listening_socket()
        argv = [
            sys.executable,
            "-m",
            "daphne",
            "-v",
            "0",
            "--fd",
            str(shared.fileno()),
            "webapp.asgi:application",
        ]
        servers = [
            subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT, pass_fds=[shared.fileno()]
            )
            for _ in range(processes)
        ]
        port = shared.getsockname()[1]
        shared.close()  # the children hold it
        return servers, port


def wait_ready(servers: list[subprocess.Popen], port: int, log: Path) -> None:
    """An HTTP answer, then every process idle: all have loaded Django, not only the first."""
    deadline = time.monotonic() + 120
    while True:
        if time.monotonic() > deadline or any(server.poll() is not None for server in servers):
            raise RuntimeError(f"the server did not answer on {port}; see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5):
                break
        except urllib.error.HTTPError:  # 503: no Celery workers here, but it answers
            break
        except OSError:
            time.sleep(0.2)
    tree = [process for server in servers for process in server_tree(server.pid)]
    while time.monotonic() < deadline:
        before = cpu_seconds(tree)
        time.sleep(0.5)
        if (cpu_seconds(tree) - before) / 0.5 < IDLE_CORES:
            return
    raise RuntimeError(f"the server on {port} stayed busy before any load; see {log}")


def stop(servers: list[subprocess.Popen]) -> None:
    for server in servers:
        server.terminate()
    for server in servers:
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


# --- the clients ---------------------------------------------------------------------------


async def client(port: int, request: bytes, until: float, record_from: float, latencies: list[float]) -> int:
    """Requests back to back on one keep-alive connection (reconnecting when the server closes
    it); returns how many failed."""
    failures = 0
    reader = writer = None
    while time.monotonic() < until:
        if writer is None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = time.monotonic()
        try:
            writer.write(request)
            status, keep = await read_response(reader)
        except (ConnectionError, asyncio.IncompleteReadError):
            writer.close()
            reader = writer = None
            continue
        if status != 200:
            failures += 1
        if started >= record_from:
            latencies.append(time.monotonic() - started)
        if not keep:
            writer.close()
            reader = writer = None
    if writer is not None:
        writer.close()
    return failures


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)
    }
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    else:  # chunked
        while True:
            size = int((await reader.readline()).strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    return status, headers.get("connection", "").lower() != "close"


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def server_tree(pid: int) -> list[psutil.Process]:
    server = psutil.Process(pid)
    return [server, *server.children(recursive=True)]


async def load(port: int, path: str, token: str, server_pids: list[int]) -> dict:
    """Requests/s and latencies over the timed span, with the CPU the server and this client
    used in it: a server that already keeps a core busy can gain at most the spare cores."""
    request = (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
        "Accept: application/json\r\n\r\n"
    ).encode()
    latencies: list[float] = []
    now = time.monotonic()
    record_from, until = now + WARMUP, now + WARMUP + DURATION
    servers = [process for pid in server_pids for process in server_tree(pid)]
    me = psutil.Process()
    cpu: dict[str, float] = {}

    async def account() -> None:
        await asyncio.sleep(record_from - time.monotonic())
        cpu["server"], cpu["client"] = cpu_seconds(servers), cpu_seconds([me])
        await asyncio.sleep(until - time.monotonic())
        cpu["server"] = cpu_seconds(servers) - cpu["server"]
        cpu["client"] = cpu_seconds([me]) - cpu["client"]

    accounting = asyncio.create_task(account())
    failures = await asyncio.gather(
        *(client(port, request, until, record_from, latencies) for _ in range(CLIENTS))
    )
    await accounting
    latencies.sort()
    return {
        "rps": len(latencies) / DURATION,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
        "failures": sum(failures),
        "server_cores": cpu["server"] / DURATION,
        "client_cores": cpu["client"] / DURATION,
        "server_cpu_ms_per_request": 1000 * cpu["server"] / max(len(latencies), 1),
    }


def measure(name: str, processes: int, env: dict[str, str], token: str, folder: Path) -> dict:
    metrics_dir = folder / f"prometheus-{name}-{processes}-{secrets.token_hex(4)}"
    metrics_dir.mkdir()  # fresh for each start, as the stack empties it
    env = env | {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    log = folder / f"{name}-{processes}.log"
    servers, port = start(name, processes, env, log)
    try:
        wait_ready(servers, port, log)
        # /metrics is for operators: it takes the operations token, the list a user's token.
        tokens = {"list": token, "metrics": env["FLYWHEEL_OPS_TOKEN"]}
        pids = [server.pid for server in servers]
        return {
            endpoint: asyncio.run(load(port, path, tokens[endpoint], pids))
            for endpoint, path in ENDPOINTS.items()
        }
    finally:
        stop(servers)


def median_of(rounds: list[dict], endpoint: str, figure: str) -> float:
    return round(statistics.median(r[endpoint][figure] for r in rounds), 2)


def summarise(rounds: dict[tuple[int, str], list[dict]], counts: list[int]) -> dict:
    """Medians of each (processes, server), requests/s per process, and uvicorn's over Daphne's
    at the same process count; the headline ratio is at the most processes."""
    summary: dict = {}
    for endpoint in ENDPOINTS:
        for processes in counts:
            for name in SERVERS:
                key = f"{endpoint}_{processes}p_{name}"
                for figure in FIGURES:
                    summary[f"{key}_{figure}"] = median_of(rounds[(processes, name)], endpoint, figure)
                summary[f"{key}_rps_per_process"] = round(summary[f"{key}_rps"] / processes, 2)
            ratio = (
                summary[f"{endpoint}_{processes}p_uvicorn_rps"]
                / summary[f"{endpoint}_{processes}p_daphne_rps"]
            )
            summary[f"{endpoint}_{processes}p_rps_ratio"] = round(ratio, 2)
        summary[f"{endpoint}_rps_ratio"] = summary[f"{endpoint}_{max(counts)}p_rps_ratio"]
    return summary


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="bench-api-"))
    redis_port = free_port()
    env = os.environ | {
        "DJANGO_SETTINGS_MODULE": "webapp.settings",
        "FLYWHEEL_HOME": str(folder),
        "FLYWHEEL_REDIS_PORT": str(redis_port),
        "FLYWHEEL_OPS_TOKEN": secrets.token_urlsafe(32),
        # Capacity, not the per-user budget: one token sends every request. The throttle still
        # runs its Redis round trip on each request, on both sides.
        # (A rate whose interval rounds to 0 µs would make Redis refuse the throttle's expiry.)
        "FLYWHEEL_API_RATE": "1000000/min",
    }
    for name in ("DATABASE_URL", "REDIS_URL", "PROMETHEUS_MULTIPROC_DIR"):
        env.pop(name, None)
    processes = int(env.get("FLYWHEEL_WEB_WORKERS") or default_web_workers())
    counts = sorted({1, processes})
    pairs = [(count, name) for count in counts for name in SERVERS]
    loads = [os.getloadavg()[0]]
    redis = subprocess.Popen(
        [redis_binary(), "--bind", "127.0.0.1", "--port", str(redis_port), "--save", ""],
        stdout=subprocess.DEVNULL,
    )
    try:
        token = seed(env)
        rounds: dict[tuple[int, str], list[dict]] = {pair: [] for pair in pairs}
        for repeat in range(REPEATS):
            for count, name in pairs if repeat % 2 == 0 else reversed(pairs):
                result = measure(name, count, env, token, folder)
                rounds[(count, name)].append(result)
                loads.append(os.getloadavg()[0])
                print(count, name, json.dumps(result), file=sys.stderr, flush=True)
    finally:
        redis.terminate()
        redis.wait()
    summary: dict = {"bench": "api", "clients": CLIENTS, "seconds": DURATION, "repeats": REPEATS}
    summary["processes"] = counts
    summary |= summarise(rounds, counts)
    summary["cores"] = os.cpu_count()
    summary["load_average"] = [round(min(loads), 1), round(max(loads), 1)]
    summary["failures"] = sum(r[e]["failures"] for rs in rounds.values() for r in rs for e in ENDPOINTS)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

"""Sandbox throughput and reset latency, against plain `python3` subprocesses as the baseline.

The work is a check of a small unit-tested function, a different item each time (ITEMS distinct
functions and tests, taken in turn), so a warm sandbox installs new files for most checks, as it
does when it grades a real batch. Three ways to run it, each at the same number of threads in
concurrent mode:

- `python3`: a fresh `python3 -I` per check (isolated mode, like the sandboxes' interpreter), the
  baseline: what a naive grader does;
- `fork server`: a warm, unisolated interpreter that forks a child per check: what a warm
  interpreter alone gives, so that the difference to the sandboxes is what isolation costs;
- each sandbox backend (bubblewrap, Docker) through the warm pool.

They are measured in short windows, one after the other, round after round; each ratio is taken
within its round and the median reported (with its range), so a noisy neighbour that slows one
round slows both sides of its ratios alike.

Run: .venv/bin/python benchmarks/bench_sandbox.py [--rounds 7 --seconds 1]. Prints a table, then
one line of JSON.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sandboxes.config import sandbox_settings  # noqa: E402
from sandboxes.interface import Limits, SandboxSpec  # noqa: E402
from sandboxes.pool import SandboxPool  # noqa: E402

CORES = os.cpu_count() or 1
THREADS = 2 * CORES  # every side's concurrent mode: what the pool runs at once
ITEMS = 64


def item_files(index: int) -> dict[str, str]:
    """Item `index`: its own function and three asserts about it."""
    solution = f"def shift_{index}(a, b):\n    return a + b + {index}\n"
    tests = (
        f"from solution import shift_{index}\n\n"
        f"assert shift_{index}(1, 2) == {3 + index}\n"
        f"assert shift_{index}(-1, 1) == {index}\n"
        f"assert shift_{index}(2, 2) == {4 + index}\n"
    )
    return {"solution.py": solution, "test_solution.py": tests}


class Items:
    """The items in turn, one cursor per thread (each thread starts elsewhere in the list)."""

    def __init__(self, start: int = 0) -> None:
        self.next = start

    def take(self) -> int:
        index, self.next = self.next % ITEMS, self.next + 1
        return index


def timed_loop(seconds: float, work) -> int:
    count, deadline = 0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        work()
        count += 1
    return count


def concurrent_rate(seconds: float, works: list) -> float:
    """Checks per second over all threads, one thread per work."""
    counts = [0] * len(works)

    def run(index: int) -> None:
        counts[index] = timed_loop(seconds, works[index])

    workers = [threading.Thread(target=run, args=(index,)) for index in range(len(works))]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(counts) / (time.perf_counter() - started)


def item_folders() -> list[str]:
    folders = []
    for index in range(ITEMS):
        folder = tempfile.mkdtemp(prefix=f"bench-sandbox-{index}-")
        for name, content in item_files(index).items():
            Path(folder, name).write_text(content)
        folders.append(folder)
    return folders


def baseline_check(folders: list[str], items: Items):
    """A fresh, unisolated-from-the-host `python3 -I` per check (what a naive grader does).

    The interpreter is the one the sandboxes run (/usr/bin/python3), not a wrapper such as a pyenv shim.
    """
    python = sandbox_settings().python

    def check() -> None:
        folder = folders[items.take()]
        subprocess.run([python, "-I", "-c", RUN_TESTS], cwd=folder, check=True, capture_output=True)

    return check


# Isolated mode leaves the script's folder off sys.path, so the tests put it back (as the sandboxes'
# harness does) to import the solution.
RUN_TESTS = (
    "import runpy, sys; sys.path.insert(0, '.'); runpy.run_path('test_solution.py', run_name='__main__')"
)
FORK_SERVER = """
import os, runpy, sys
sys.path.insert(0, ".")
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        os.chdir(line.strip())
        try:
            runpy.run_path("test_solution.py", run_name="__main__")
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    sys.stdout.write(f"{status}\\n")
    sys.stdout.flush()
"""


def fork_server_check(folders: list[str], items: Items, servers: list[subprocess.Popen]):
    """A warm interpreter that forks a child per check, with no isolation at all."""
    python = sandbox_settings().python
    server = subprocess.Popen(
        [python, "-I", "-c", FORK_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    servers.append(server)

    def check() -> None:
        server.stdin.write(folders[items.take()] + "\n")
        server.stdin.flush()
        status = server.stdout.readline().strip()
        assert status == "0", f"the check failed in the fork server: {status!r}"

    return check


class Backend:
    """A warm pool of one backend, the check through it, and its cold start and reset latency."""

    def __init__(self, backend: str) -> None:
        self.specs = [
            SandboxSpec(backend=backend, files=item_files(i), limits=Limits()) for i in range(ITEMS)
        ]
        self.spec = self.specs[0]
        self.pool = SandboxPool(max_sandboxes=THREADS, warm=THREADS)
        started = time.perf_counter()
        with self.pool.acquire(self.spec):
            pass
        self.cold_start = time.perf_counter() - started
        self.pool.prewarm(self.spec, THREADS)

    def check_of(self, items: Items):
        def check() -> None:
            with self.pool.acquire(self.specs[items.take()]) as sandbox:
                run = sandbox.run_tests("test_solution.py")
                assert run.all_passed, run

        return check

    def resets(self, count: int = 300) -> list[float]:
        timings = []
        with self.pool.acquire(self.spec) as sandbox:
            for _ in range(count):
                sandbox.write_file("scratch.txt", "x" * 100)
                started = time.perf_counter()
                sandbox.reset()
                timings.append(time.perf_counter() - started)
        return sorted(timings)


def spread(threads: int) -> list["Items"]:
    return [Items(start=index * ITEMS // threads) for index in range(threads)]


def ratios_of(mine: list[float], base: list[float]) -> dict:
    ratios = [m / b for m, b in zip(mine, base, strict=True)]
    return {
        "ratio": round(statistics.median(ratios), 2),
        "range": [round(min(ratios), 2), round(max(ratios), 2)],
    }


def measure(rounds: int, seconds: float, backends: list[str]) -> dict:
    """Rounds of short windows, every side one after the other in every round, so that a noisy
    neighbour slows them alike; ratios are taken within a round, then the median."""
    folders = item_folders()
    servers: list[subprocess.Popen] = []
    sides = {
        "python3": lambda items: baseline_check(folders, items),
        "fork_server": lambda items: fork_server_check(folders, items, servers),
    }
    pools = {name: Backend(name) for name in backends}
    sides |= {name: backend.check_of for name, backend in pools.items()}
    serial = {name: make(Items()) for name, make in sides.items()}
    concurrent = {name: [make(items) for items in spread(THREADS)] for name, make in sides.items()}
    rates: dict[str, dict[str, list[float]]] = {name: {"serial": [], "concurrent": []} for name in sides}
    try:
        for _ in range(rounds):
            for name in sides:
                rates[name]["serial"].append(timed_loop(seconds, serial[name]) / seconds)
                rates[name]["concurrent"].append(concurrent_rate(seconds, concurrent[name]))
        report: dict = {}
        for name in sides:
            figures = {
                f"{mode}_per_s": round(statistics.median(rates[name][mode]), 1)
                for mode in ("serial", "concurrent")
            }
            if name != "python3":
                for mode in ("serial", "concurrent"):
                    against = ratios_of(rates[name][mode], rates["python3"][mode])
                    figures[f"ratio_{mode}"], figures[f"ratio_{mode}_range"] = (
                        against["ratio"],
                        against["range"],
                    )
            if name in pools:
                for mode in ("serial", "concurrent"):
                    # below 1: what isolation costs against the same warm interpreter unisolated
                    against = ratios_of(rates[name][mode], rates["fork_server"][mode])
                    figures[f"vs_fork_server_{mode}"] = against["ratio"]
                resets = pools[name].resets()
                figures |= {
                    "reset_p50_ms": round(statistics.median(resets) * 1000, 3),
                    "reset_p99_ms": round(resets[int(len(resets) * 0.99) - 1] * 1000, 3),
                    "cold_start_ms": round(pools[name].cold_start * 1000, 1),
                }
            report[name] = figures
        return report
    finally:
        for backend in pools.values():
            backend.pool.close()
        for server in servers:
            server.stdin.close()
            server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds; figures are medians")
    parser.add_argument("--seconds", type=float, default=1.0, help="measuring window per figure and round")
    parser.add_argument("--backends", default="bubblewrap,docker")
    args = parser.parse_args()
    backends = args.backends.split(",")
    report = {
        "bench": "sandbox",
        "cores": CORES,
        "threads": THREADS,
        "python": sandbox_settings().python,
        "check": f"3 asserts against a 2-line function, {ITEMS} distinct items in turn",
        "rounds": args.rounds,
    } | measure(args.rounds, args.seconds, backends)
    print(f"{'':12} {'serial/s':>10} {'concurrent/s':>13} {'ratio':>7} {'vs fork':>8}")
    for name in ["python3", "fork_server", *backends]:
        f = report[name]
        ratio = f"{f['ratio_concurrent']}x" if "ratio_concurrent" in f else ""
        isolation = f"{f['vs_fork_server_concurrent']}x" if "vs_fork_server_concurrent" in f else ""
        print(f"{name:12} {f['serial_per_s']:>10} {f['concurrent_per_s']:>13} {ratio:>7} {isolation:>8}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()

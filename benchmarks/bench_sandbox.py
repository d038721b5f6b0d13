"""Sandbox throughput and reset latency, against plain `python3` subprocesses as the baseline.

The baseline and each backend are measured in short windows, one after the other, round after
round; each ratio is taken within its round and the median reported (with its range), so a noisy
neighbour that slows one round slows both sides of its ratios alike.

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

SOLUTION = "def add(a, b):\n    return a + b\n"
TESTS = "from solution import add\n\nassert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert add(2, 2) == 4\n"
SPEC_FILES = {"solution.py": SOLUTION, "test_solution.py": TESTS}
CORES = os.cpu_count() or 1


def timed_loop(seconds: float, work) -> int:
    count, deadline = 0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        work()
        count += 1
    return count


def concurrent_rate(seconds: float, threads: int, make_work) -> float:
    counts = [0] * threads

    def run(index: int) -> None:
        counts[index] = timed_loop(seconds, make_work())

    workers = [threading.Thread(target=run, args=(index,)) for index in range(threads)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(counts) / (time.perf_counter() - started)


def baseline_check():
    """The same check as a fresh, unisolated `python3` per run (what a naive grader does).

    The interpreter is the one the sandboxes run (/usr/bin/python3), not a wrapper such as a pyenv shim.
    """
    python = sandbox_settings().python
    folder = tempfile.mkdtemp(prefix="bench-sandbox-")
    for name, content in SPEC_FILES.items():
        Path(folder, name).write_text(content)

    def check() -> None:
        subprocess.run([python, "test_solution.py"], cwd=folder, check=True, capture_output=True)

    return check


class Backend:
    """A warm pool of one backend, the check through it, and its cold start and reset latency."""

    def __init__(self, backend: str) -> None:
        self.spec = SandboxSpec(backend=backend, files=SPEC_FILES, limits=Limits())
        self.concurrency = 2 * CORES
        self.pool = SandboxPool(max_sandboxes=self.concurrency, warm=self.concurrency)
        started = time.perf_counter()
        with self.pool.acquire(self.spec):
            pass
        self.cold_start = time.perf_counter() - started
        self.pool.prewarm(self.spec, self.concurrency)

    def check(self) -> None:
        with self.pool.acquire(self.spec) as sandbox:
            run = sandbox.run_tests("test_solution.py")
            assert run.all_passed, run

    def resets(self, count: int = 300) -> list[float]:
        timings = []
        with self.pool.acquire(self.spec) as sandbox:
            for _ in range(count):
                sandbox.write_file("scratch.txt", "x" * 100)
                started = time.perf_counter()
                sandbox.reset()
                timings.append(time.perf_counter() - started)
        return sorted(timings)


def measure(rounds: int, seconds: float, backends: list[str]) -> dict:
    """Rounds of short windows, the baseline and each backend one after the other in every round,
    so that a noisy neighbour slows them alike; ratios are taken within a round, then the median."""
    base = baseline_check()
    pools = {name: Backend(name) for name in backends}
    rates: dict[str, dict[str, list[float]]] = {
        name: {"serial": [], "concurrent": []} for name in ["python3", *backends]
    }
    try:
        for _ in range(rounds):
            rates["python3"]["serial"].append(timed_loop(seconds, base) / seconds)
            rates["python3"]["concurrent"].append(concurrent_rate(seconds, CORES, lambda: base))
            for name, backend in pools.items():
                rates[name]["serial"].append(timed_loop(seconds, backend.check) / seconds)
                rates[name]["concurrent"].append(
                    concurrent_rate(seconds, backend.concurrency, lambda backend=backend: backend.check)
                )
        report = {
            "baseline_python3": {
                f"{mode}_per_s": round(statistics.median(rates["python3"][mode]), 1)
                for mode in ("serial", "concurrent")
            }
        }
        for name, backend in pools.items():
            resets = backend.resets()
            figures = {
                f"{mode}_per_s": round(statistics.median(rates[name][mode]), 1)
                for mode in ("serial", "concurrent")
            }
            for mode in ("serial", "concurrent"):
                ratios = [
                    mine / base for mine, base in zip(rates[name][mode], rates["python3"][mode], strict=True)
                ]
                figures[f"ratio_{mode}"] = round(statistics.median(ratios), 2)
                figures[f"ratio_{mode}_range"] = [round(min(ratios), 2), round(max(ratios), 2)]
            report[name] = figures | {
                "concurrency": backend.concurrency,
                "reset_p50_ms": round(statistics.median(resets) * 1000, 3),
                "reset_p99_ms": round(resets[int(len(resets) * 0.99) - 1] * 1000, 3),
                "cold_start_ms": round(backend.cold_start * 1000, 1),
            }
        return report
    finally:
        for backend in pools.values():
            backend.pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds; figures are medians")
    parser.add_argument("--seconds", type=float, default=1.0, help="measuring window per figure and round")
    parser.add_argument("--backends", default="bubblewrap,docker")
    args = parser.parse_args()
    backends = args.backends.split(",")
    report = {
        "cores": CORES,
        "python": sandbox_settings().python,
        "check": "3 asserts against a 2-line function",
        "rounds": args.rounds,
    } | measure(args.rounds, args.seconds, backends)
    base = report["baseline_python3"]
    print(f"{'':12} {'serial/s':>10} {'concurrent/s':>13} {'ratio':>7} {'reset p50':>10} {'reset p99':>10}")
    print(f"{'python3':12} {base['serial_per_s']:>10} {base['concurrent_per_s']:>13}")
    for backend in backends:
        f = report[backend]
        print(
            f"{backend:12} {f['serial_per_s']:>10} {f['concurrent_per_s']:>13} {f['ratio_concurrent']:>6}x"
            f" {f['reset_p50_ms']:>8}ms {f['reset_p99_ms']:>8}ms"
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()

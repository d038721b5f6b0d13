"""Sandbox throughput and reset latency, against plain `python3` subprocesses as the baseline.

Run: .venv/bin/python benchmarks/bench_sandbox.py [--seconds 3]. Prints a table, then one line of JSON.
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


def baseline(seconds: float) -> dict:
    """The same check as a fresh, unisolated `python3` per run (what a naive grader does).

    The interpreter is the one the sandboxes run (/usr/bin/python3), not a wrapper such as a pyenv shim.
    """
    python = sandbox_settings().python
    folder = tempfile.mkdtemp(prefix="bench-sandbox-")
    for name, content in SPEC_FILES.items():
        Path(folder, name).write_text(content)

    def check() -> None:
        subprocess.run([python, "test_solution.py"], cwd=folder, check=True, capture_output=True)

    serial = timed_loop(seconds, check) / seconds
    parallel = concurrent_rate(seconds, CORES, lambda: check)
    return {"serial_per_s": round(serial, 1), "concurrent_per_s": round(parallel, 1)}


def backend_figures(backend: str, seconds: float) -> dict:
    spec = SandboxSpec(backend=backend, files=SPEC_FILES, limits=Limits())
    concurrency = 2 * CORES
    pool = SandboxPool(max_sandboxes=concurrency, warm=concurrency)
    try:
        started = time.perf_counter()
        with pool.acquire(spec):
            pass
        cold_start = time.perf_counter() - started
        pool.prewarm(spec, concurrency)

        def check_once() -> None:
            with pool.acquire(spec) as sandbox:
                run = sandbox.run_tests("test_solution.py")
                assert run.all_passed, run

        serial = timed_loop(seconds, check_once) / seconds
        parallel = concurrent_rate(seconds, concurrency, lambda: check_once)
        resets = []
        with pool.acquire(spec) as sandbox:
            for _ in range(300):
                sandbox.write_file("scratch.txt", "x" * 100)
                started = time.perf_counter()
                sandbox.reset()
                resets.append(time.perf_counter() - started)
        resets.sort()
    finally:
        pool.close()
    return {
        "serial_per_s": round(serial, 1),
        "concurrent_per_s": round(parallel, 1),
        "concurrency": concurrency,
        "reset_p50_ms": round(statistics.median(resets) * 1000, 3),
        "reset_p99_ms": round(resets[int(len(resets) * 0.99) - 1] * 1000, 3),
        "cold_start_ms": round(cold_start * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per figure")
    parser.add_argument("--backends", default="bubblewrap,docker")
    args = parser.parse_args()
    report = {
        "cores": CORES,
        "python": sandbox_settings().python,
        "check": "3 asserts against a 2-line function",
        "baseline_python3": baseline(args.seconds),
    }
    base = report["baseline_python3"]
    for backend in args.backends.split(","):
        figures = backend_figures(backend, args.seconds)
        figures["ratio_serial"] = round(figures["serial_per_s"] / base["serial_per_s"], 1)
        figures["ratio_concurrent"] = round(figures["concurrent_per_s"] / base["concurrent_per_s"], 1)
        report[backend] = figures
    print(f"{'':12} {'serial/s':>10} {'concurrent/s':>13} {'ratio':>7} {'reset p50':>10} {'reset p99':>10}")
    print(f"{'python3':12} {base['serial_per_s']:>10} {base['concurrent_per_s']:>13}")
    for backend in args.backends.split(","):
        f = report[backend]
        print(
            f"{backend:12} {f['serial_per_s']:>10} {f['concurrent_per_s']:>13} {f['ratio_concurrent']:>6}x"
            f" {f['reset_p50_ms']:>8}ms {f['reset_p99_ms']:>8}ms"
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()

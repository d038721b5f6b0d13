"""ms per item of `unit_tests` with the host deciding tests from reported values, against the
in-sandbox verdicts it replaced (same pool, interleaved rounds; bubblewrap). One sandbox call per
item either way: the values ride the run that executes the tests. Prints one line of JSON."""

import dataclasses
import json
import os
import statistics
import sys
import time

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

import django  # noqa: E402

django.setup()

from rewards.graders import sandboxed  # noqa: E402
from sandboxes.config import sandbox_settings  # noqa: E402
from sandboxes.pool import SandboxPool  # noqa: E402
from sandboxes.sandbox import Sandbox  # noqa: E402

TESTS = "def check(candidate):\n" + "".join(f"    assert candidate({n}, 2) == {n + 2}\n" for n in range(10))
SOLUTION = {"solution.py": "def add(a, b):\n    return a + b\n"}
ROUNDS, ITEMS = 5, 40


def main() -> None:
    settings = dataclasses.replace(sandbox_settings(), backend="bubblewrap")
    pool = SandboxPool(settings=settings, max_sandboxes=1)
    real = Sandbox.run_tests
    timings: dict[str, list[float]] = {"host": [], "sandbox": []}
    calls = {"host": 0, "sandbox": 0}
    item = {"kind": "code", "tests": TESTS, "entry_point": "add"}
    try:
        with pool.acquire(sandboxed.task_spec({"tests.py": TESTS}, sandboxed.limits(10), None)) as box:
            for _ in range(ROUNDS):
                for mode in ("sandbox", "host"):

                    def run(self, *args, _mode=mode, **kwargs):
                        calls[_mode] += 1
                        return real(self, *args, **kwargs | {"host_decides": _mode == "host"})

                    started = time.perf_counter()
                    for _ in range(ITEMS):
                        result = run(box, "tests.py", style="candidate", entry_point="add", files=SOLUTION)
                        assert result.all_passed, result.tests
                    timings[mode].append((time.perf_counter() - started) * 1000 / ITEMS)
    finally:
        pool.close()
    del item
    print(
        json.dumps(
            {
                "tests_per_item": 10,
                "sandbox_calls_per_item": {mode: calls[mode] / (ROUNDS * ITEMS) for mode in calls},
                "ms_per_item_in_sandbox_verdicts": round(statistics.median(timings["sandbox"]), 2),
                "ms_per_item_host_decides": round(statistics.median(timings["host"]), 2),
            }
        )
    )


if __name__ == "__main__":
    main()

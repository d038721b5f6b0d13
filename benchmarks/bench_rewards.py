"""Reward scoring throughput: in-process graders and unit_tests through the sandbox pool, each against a
baseline measured in the same run.

- In-process graders (string_check, text_similarity fuzzy_match, numeric, regex, json_schema and a
  multi formula over three of them) score a batch through `rewards.engine.score_batch` on one
  thread, so items/s is per core; the baseline is the bare Python comparison `a == b` over the same
  items. Target: at least 10,000 items/s per core for each grader.
- unit_tests grades code solutions through the sandbox pool with as many threads as the pool lends
  sandboxes; the baseline runs the same check as a plain `python3` subprocess per solution (no
  isolation) with the same number of threads.

Every figure is the median of several repeats; unit_tests and its baseline alternate round by round,
and their ratio is the median of the rounds' ratios. Run: .venv/bin/python benchmarks/bench_rewards.py
[--items 4000 --repeats 7 --code-items 256]. Prints a table, then one line of JSON.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rewards.engine import Sample, score_batch  # noqa: E402
from sandboxes.config import sandbox_settings  # noqa: E402
from sandboxes.interface import Limits, SandboxSpec  # noqa: E402
from sandboxes.pool import SandboxPool  # noqa: E402

CORES = os.cpu_count() or 1
TARGET_PER_CORE = 10_000
OUTPUT = "{{ sample.output_text }}"
REFERENCE = "{{ item.reference }}"
RULES = {
    "string_check": {"type": "string_check", "input": OUTPUT, "reference": REFERENCE, "operation": "eq"},
    "text_similarity_fuzzy": {
        "type": "text_similarity",
        "input": OUTPUT,
        "reference": REFERENCE,
        "evaluation_metric": "fuzzy_match",
    },
    "numeric": {"type": "numeric", "input": OUTPUT, "reference": REFERENCE, "tolerance": 0.01},
    "regex": {"type": "regex", "input": OUTPUT, "pattern": r"^\s*-?\d+(\.\d+)?\s*$"},
    "json_schema": {
        "type": "json_schema",
        "schema": {"type": "object", "properties": {"answer": {"type": "number"}}, "required": ["answer"]},
    },
    "multi_formula": {
        "type": "multi",
        "graders": {
            "exact": {"type": "string_check", "input": OUTPUT, "reference": REFERENCE, "operation": "eq"},
            "close": {"type": "numeric", "input": OUTPUT, "reference": REFERENCE, "tolerance": 0.5},
            "invalid": {"type": "invalid_actions"},
        },
        "calculate_output": "clamp(0.7 * exact + 0.3 * close - 0.1 * invalid, 0, 1)",
    },
}
TESTS = "from solution import add\n\nassert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert add(2, 2) == 4\n"
SOLUTIONS = ["def add(a, b):\n    return a + b\n", "def add(a, b):\n    return a - b\n"]


def answer_pairs(count: int) -> list[tuple[dict, Sample]]:
    pairs = []
    for n in range(count):
        reference = str(n % 97)
        output = reference if n % 3 else str(n % 89)
        steps = [
            {
                "action": "a",
                "kind": "code",
                "valid": n % 5 != 0,
                "format_ok": True,
                "tokens": 3,
                "observation": "",
            }
        ]
        item = {
            "id": f"q{n}",
            "kind": "answer",
            "split": "train",
            "prompt": f"what is {reference}?",
            "reference": reference,
        }
        sample = Sample(
            output_text=output, output_json={"answer": n} if n % 4 else {"answer": "x"}, steps=steps
        )
        pairs.append((item, sample))
    return pairs


def median_rate(count: int, repeats: int, work) -> float:
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        rates.append(count / (time.perf_counter() - started))
    return statistics.median(rates)


def in_process(items: int, repeats: int) -> dict:
    pairs = answer_pairs(items)
    baseline = median_rate(items, repeats, lambda: [float(s.output_text == i["reference"]) for i, s in pairs])
    figures = {"baseline_eq_per_s": round(baseline)}
    for name, rule in RULES.items():
        score_batch(rule, pairs[:50])  # compile and warm imports outside the timing
        rate = median_rate(items, repeats, lambda rule=rule: score_batch(rule, pairs))
        figures[name] = {
            "items_per_s": round(rate),
            "ratio_to_baseline": round(rate / baseline, 4),
            "meets_target": rate >= TARGET_PER_CORE,
        }
    return figures


def code_pairs(count: int) -> list[tuple[dict, Sample]]:
    item = {
        "id": "add",
        "kind": "code",
        "split": "train",
        "prompt": "add(a, b)",
        "tests": TESTS,
        "entry_point": "add",
    }
    return [(item, Sample(files={"solution.py": SOLUTIONS[n % 2]})) for n in range(count)]


def subprocess_baseline(pairs: list[tuple[dict, Sample]], workers: int) -> None:
    python = sandbox_settings().python

    def check(pair: tuple[dict, Sample]) -> float:
        item, sample = pair
        with tempfile.TemporaryDirectory(prefix="bench-rewards-") as folder:
            Path(folder, "solution.py").write_text(sample.files["solution.py"])
            Path(folder, "test_solution.py").write_text(item["tests"])
            done = subprocess.run([python, "test_solution.py"], cwd=folder, capture_output=True, check=False)
        return float(done.returncode == 0)

    with ThreadPoolExecutor(max_workers=workers) as executor:
        list(executor.map(check, pairs))


def through_pool(count: int, repeats: int) -> dict:
    workers = 2 * CORES
    pairs = code_pairs(count)
    pool = SandboxPool(max_sandboxes=workers, warm=workers)
    rule = {"type": "unit_tests"}
    try:
        pool.prewarm(SandboxSpec(files={"test_solution.py": TESTS}, limits=Limits()), workers)
        warm = score_batch(rule, pairs[: 2 * workers], pool=pool)
        assert [result.total for result in warm[:2]] == [1.0, 0.0], warm[:2]
        # Both sides in every round, one after the other, so that a noisy neighbour slows them alike;
        # the ratio is taken within each round, then the median.
        rates, baselines = [], []
        for _ in range(repeats):
            graded = median_rate(count, 1, lambda: score_batch(rule, pairs, pool=pool, max_workers=workers))
            rates.append(graded)
            baselines.append(median_rate(count, 1, lambda: subprocess_baseline(pairs, workers)))
    finally:
        pool.close()
    ratios = [rate / baseline for rate, baseline in zip(rates, baselines, strict=True)]
    return {
        "backend": sandbox_settings().backend,
        "workers": workers,
        "items_per_s": round(statistics.median(rates), 1),
        "baseline_python3_subprocess_per_s": round(statistics.median(baselines), 1),
        "ratio_to_baseline": round(statistics.median(ratios), 2),
        "ratio_range": [round(min(ratios), 2), round(max(ratios), 2)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=4000, help="answer items per in-process repeat")
    parser.add_argument("--code-items", type=int, default=256, help="code solutions per unit_tests repeat")
    parser.add_argument("--repeats", type=int, default=7, help="repeats (unit_tests: interleaved rounds)")
    args = parser.parse_args()
    report = {
        "cores": CORES,
        "target_in_process_per_core": TARGET_PER_CORE,
        "in_process": in_process(args.items, args.repeats),
        "unit_tests": through_pool(args.code_items, max(3, args.repeats // 2 + 1)),
    }
    figures = report["in_process"]
    print(f"{'grader':24} {'items/s':>10} {'x baseline':>11} {'target':>7}")
    print(f"{'a == b (baseline)':24} {figures['baseline_eq_per_s']:>10}")
    for name in RULES:
        row = figures[name]
        verdict = "ok" if row["meets_target"] else "MISS"
        print(f"{name:24} {row['items_per_s']:>10} {row['ratio_to_baseline']:>11} {verdict:>7}")
    unit = report["unit_tests"]
    print(f"{'unit_tests (pool)':24} {unit['items_per_s']:>10} {unit['ratio_to_baseline']:>11}")
    print(f"{'python3 per check':24} {unit['baseline_python3_subprocess_per_s']:>10}")
    report["all_in_process_meet_target"] = all(figures[name]["meets_target"] for name in RULES)
    print(json.dumps(report))


if __name__ == "__main__":
    main()

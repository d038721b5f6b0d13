"""Reward scoring throughput: in-process graders and unit_tests through the sandbox pool, each against a
baseline measured in the same run.

- In-process graders (string_check, text_similarity fuzzy_match, numeric, regex, json_schema and a
  multi formula over three of them) score a batch through `rewards.engine.score_batch` on one
  thread, so items/s is per core; the baseline is the bare Python comparison `a == b` over the same
  items. Target: at least 10,000 items/s per core for each grader.
  Their inputs are realistic: model outputs of 200 to 3,000 characters (reasoning, then the
  answer), references of the same size for text similarity.
- unit_tests grades code solutions through the sandbox pool with as many threads as the pool lends
  sandboxes; the baseline runs the same check as a plain `python3` subprocess per solution (no
  isolation) with the same number of threads.
- candidate workload: at least 150 distinct HumanEval-shaped problems (benchmarks/code_problems.py,
  each with its own check(candidate) tests) and three completions each (right, wrong, raising),
  graded by `unit_tests` (`score: all_pass`) through the sandbox pool against the public HumanEval
  harness's own method, re-implemented here: per check, a multiprocessing Manager list and a forked
  `multiprocessing.Process` that runs prompt + completion + tests + `check(entry_point)` in a temp
  directory under its reliability guard and time limit, with the same number of threads. Also, for
  reference, the same program in a bare `os.fork()` with a pipe (no Manager). Target: at least 3x
  the harness's checks/s at identical verdicts (both verdict tables are printed). Besides wall-clock
  checks/s (and per core), the CPU time of every process involved per check is measured, which a
  loaded machine disturbs far less (bubblewrap: its sandboxes are this process's descendants).

Every figure is the median of several repeats; sandboxed checks and their baselines alternate round
by round, and ratios are the median of the rounds' ratios. Run: .venv/bin/python
benchmarks/bench_rewards.py [--items 4000 --repeats 7 --code-items 256 --problems 160 --rounds 3].
Prints tables, then one line of JSON.
"""

import argparse
import contextlib
import io
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.code_problems import problems as candidate_problems  # noqa: E402
from rewards.engine import Sample, score_batch  # noqa: E402
from sandboxes.config import sandbox_settings  # noqa: E402
from sandboxes.interface import Limits, SandboxSpec  # noqa: E402
from sandboxes.pool import SandboxPool  # noqa: E402

CORES = os.cpu_count() or 1
TARGET_PER_CORE = 10_000
OUTPUT = "{{ sample.output_text }}"
REFERENCE = "{{ item.reference }}"
EXPLANATION = "{{ item.metadata.explanation }}"
RULES = {
    "string_check": {"type": "string_check", "input": OUTPUT, "reference": REFERENCE, "operation": "ilike"},
    "text_similarity_fuzzy": {
        "type": "text_similarity",
        "input": OUTPUT,
        "reference": EXPLANATION,
        "evaluation_metric": "fuzzy_match",
    },
    "numeric": {"type": "numeric", "input": OUTPUT, "reference": REFERENCE, "tolerance": 0.01},
    "regex": {"type": "regex", "input": OUTPUT, "pattern": r"answer is (-?\d+(\.\d+)?)\.?\s*$"},
    "json_schema": {
        "type": "json_schema",
        "schema": {"type": "object", "properties": {"answer": {"type": "number"}}, "required": ["answer"]},
    },
    "multi_formula": {
        "type": "multi",
        "graders": {
            "exact": {"type": "string_check", "input": OUTPUT, "reference": REFERENCE, "operation": "ilike"},
            "close": {"type": "numeric", "input": OUTPUT, "reference": REFERENCE, "tolerance": 0.5},
            "invalid": {"type": "invalid_actions"},
        },
        "calculate_output": "clamp(0.7 * exact + 0.3 * close - 0.1 * invalid, 0, 1)",
    },
}
TESTS = "from solution import add\n\nassert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert add(2, 2) == 4\n"
SOLUTIONS = ["def add(a, b):\n    return a + b\n", "def add(a, b):\n    return a - b\n"]


REASONING = (
    "First read the question carefully and restate what is asked. The quantities are small, so work "
    "them out step by step, checking each intermediate result against the constraints given. "
)


def long_text(n: int, answer: str) -> str:
    """A model's answer of 200 to 3,000 characters: reasoning, then the answer on its last line."""
    size = 200 + (n * 7919) % 2800
    reasoning = (REASONING * (size // len(REASONING) + 1))[:size]
    return f"{reasoning}\nStep {n}: carry the result over.\nSo the answer is {answer}."


def answer_pairs(count: int) -> list[tuple[dict, Sample]]:
    pairs = []
    for n in range(count):
        reference = str(n % 97)
        output = long_text(n, reference if n % 3 else str(n % 89))
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
            "metadata": {"explanation": long_text(n + 1, reference)},
        }
        sample = Sample(
            output_text=output,
            output_json={"answer": n, "reasoning": output} if n % 4 else {"answer": "x", "reasoning": output},
            steps=steps,
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


# -- the candidate workload: the sandbox pool against the HumanEval harness's own method -------------

CHECK_SECONDS = 3.0  # the HumanEval harness's default timeout
KINDS = ("right", "wrong", "raises")


def candidate_checks(count: int) -> list[tuple[dict, str, str]]:
    """(problem, completion kind, completion) for every problem and each of its three completions."""
    return [
        (problem, kind, problem["completions"][kind])
        for problem in candidate_problems(count)
        for kind in KINDS
    ]


def candidate_pairs(checks: list[tuple[dict, str, str]]) -> list[tuple[dict, Sample]]:
    pairs = []
    for problem, _, completion in checks:
        item = {
            "id": problem["task_id"],
            "kind": "code",
            "split": "train",
            "prompt": problem["prompt"],
            "tests": problem["test"],
            "entry_point": problem["entry_point"],
            "test_format": "candidate",
        }
        pairs.append((item, Sample(files={"solution.py": problem["prompt"] + completion})))
    return pairs


class CheckTimeoutError(Exception):
    pass


def harness_program(problem: dict, completion: str) -> str:
    """What the HumanEval harness runs: prompt, completion, the tests, and the call of check."""
    return problem["prompt"] + completion + "\n" + problem["test"] + "\n" + f"check({problem['entry_point']})"


def harness_guard() -> None:
    """The harness's reliability guard, in short: no exit, no kill, no fork, no file removal."""
    import builtins
    import shutil

    builtins.exit = builtins.quit = None
    for name in ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fork", "killpg", "unlink"):
        setattr(os, name, None)
    shutil.rmtree = shutil.move = None
    subprocess.Popen = None


def harness_execute(program: str, timeout: float, result) -> None:
    """The body of the harness's forked process: a temp directory, the guard, output swallowed,
    a SIGALRM time limit, and one word of result."""
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        rmtree, rmdir, chdir = __import__("shutil").rmtree, os.rmdir, os.chdir
        harness_guard()

        def alarm(signum, frame):
            raise CheckTimeoutError

        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                signal.signal(signal.SIGALRM, alarm)
                signal.setitimer(signal.ITIMER_REAL, timeout)
                try:
                    exec(program, {})  # noqa: S102  (the reference harness's own method, on our own problems)
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            result.append("passed")
        except CheckTimeoutError:
            result.append("timed out")
        except BaseException as exc:  # noqa: BLE001
            result.append(f"failed: {exc}")
        __import__("shutil").rmtree, os.rmdir = rmtree, rmdir
        chdir("/")


def harness_check(check: tuple[dict, str, str]) -> bool:
    """One check the HumanEval harness's way: a Manager list and a forked Process per check."""
    problem, _, completion = check
    manager = multiprocessing.Manager()
    try:
        result = manager.list()
        process = multiprocessing.Process(
            target=harness_execute, args=(harness_program(problem, completion), CHECK_SECONDS, result)
        )
        process.start()
        process.join(timeout=CHECK_SECONDS + 1)
        if process.is_alive():
            process.kill()
            process.join()
        return bool(result) and result[0] == "passed"
    finally:
        manager.shutdown()


def fork_check(check: tuple[dict, str, str]) -> bool:
    """The same program in a bare fork with a pipe: the harness's method without its Manager."""
    problem, _, completion = check
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        word = []
        harness_execute(harness_program(problem, completion), CHECK_SECONDS, word)
        os.write(write_end, (word[0] if word else "").encode()[:200])
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        answer = pipe.read()
    os.waitpid(pid, 0)
    return answer == b"passed"


def tree_cpu_seconds() -> float:
    """CPU time of this process and every process under it, live or reaped: the benchmark's own
    threads, the bubblewrap sandboxes' servers and their forks, the harness's Managers and forks.
    (A Docker sandbox runs under the engine, not here: only bubblewrap's figure is complete.)"""
    import psutil

    me, total = psutil.Process(), 0.0
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def verdict_table(checks: list[tuple[dict, str, str]], verdicts: list[bool]) -> dict:
    table = {kind: {"passed": 0, "failed": 0} for kind in KINDS}
    for (_, kind, _), passed in zip(checks, verdicts, strict=True):
        table[kind]["passed" if passed else "failed"] += 1
    return table


def candidate_workload(count: int, rounds: int) -> dict:
    workers = 2 * CORES
    checks = candidate_checks(count)
    pairs = candidate_pairs(checks)
    rule = {"type": "unit_tests", "score": "all_pass", "timeout": CHECK_SECONDS}
    pool = SandboxPool(max_sandboxes=workers, warm=workers)
    rates, harness_rates, fork_rates = [], [], []
    cpu = {"pool": [], "harness": [], "fork": []}
    try:
        limits = Limits(cpu_seconds=CHECK_SECONDS, wall_seconds=CHECK_SECONDS)
        pool.prewarm(SandboxSpec(limits=limits), workers)
        score_batch(rule, pairs[: 2 * workers], pool=pool)  # warm imports outside the timing

        def through_the_pool() -> list[bool]:
            return [
                result.total == 1.0 for result in score_batch(rule, pairs, pool=pool, max_workers=workers)
            ]

        def harness_way() -> list[bool]:
            with ThreadPoolExecutor(max_workers=workers) as executor:
                return list(executor.map(harness_check, checks))

        def forked() -> list[bool]:
            with ThreadPoolExecutor(max_workers=workers) as executor:
                return list(executor.map(fork_check, checks))

        sides = (
            (rates, through_the_pool, "pool"),
            (harness_rates, harness_way, "harness"),
            (fork_rates, forked, "fork"),
        )
        verdicts = {}
        for _ in range(rounds):
            for rates_of, work, side in sides:
                started, cpu_before = time.perf_counter(), tree_cpu_seconds()
                verdicts[side] = work()
                rates_of.append(len(checks) / (time.perf_counter() - started))
                cpu[side].append((tree_cpu_seconds() - cpu_before) / len(checks))
        ours, theirs, bare = verdicts["pool"], verdicts["harness"], verdicts["fork"]
    finally:
        pool.close()
    ratios = [rate / base for rate, base in zip(rates, harness_rates, strict=True)]
    fork_ratios = [rate / base for rate, base in zip(rates, fork_rates, strict=True)]
    problems = {problem["task_id"] for problem, _, _ in checks}
    return {
        "problems": len(problems),
        "distinct_tests": len({problem["test"] for problem, _, _ in checks}),
        "checks_per_round": len(checks),
        "workers": workers,
        "backend": sandbox_settings().backend,
        "checks_per_s": round(statistics.median(rates), 1),
        "checks_per_s_per_core": round(statistics.median(rates) / CORES, 1),
        "humaneval_harness_checks_per_s": round(statistics.median(harness_rates), 1),
        "bare_fork_checks_per_s": round(statistics.median(fork_rates), 1),
        "ratio_to_humaneval_harness": round(statistics.median(ratios), 2),
        "ratio_range": [round(min(ratios), 2), round(max(ratios), 2)],
        "ratio_to_bare_fork": round(statistics.median(fork_ratios), 2),
        "cpu_ms_per_check": {
            side: round(1000 * statistics.median(values), 2) for side, values in cpu.items()
        },
        "checks_per_cpu_second": {
            side: round(1 / statistics.median(values), 1) for side, values in cpu.items()
        },
        "cpu_ratio_to_humaneval_harness": round(
            statistics.median(cpu["harness"]) / statistics.median(cpu["pool"]), 2
        ),
        "verdicts_identical": ours == theirs == bare,
        "verdicts_flywheel": verdict_table(checks, ours),
        "verdicts_humaneval_harness": verdict_table(checks, theirs),
        "meets_3x_target": statistics.median(ratios) >= 3 and ours == theirs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=4000, help="answer items per in-process repeat")
    parser.add_argument("--code-items", type=int, default=256, help="code solutions per unit_tests repeat")
    parser.add_argument("--repeats", type=int, default=7, help="repeats (unit_tests: interleaved rounds)")
    parser.add_argument("--problems", type=int, default=160, help="distinct candidate-style problems (150+)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the candidate workload")
    args = parser.parse_args()
    report = {
        "cores": CORES,
        "load_average": [round(value, 2) for value in os.getloadavg()],
        "target_in_process_per_core": TARGET_PER_CORE,
        "in_process": in_process(args.items, args.repeats),
        "unit_tests": through_pool(args.code_items, max(3, args.repeats // 2 + 1)),
        "candidate_workload": candidate_workload(args.problems, args.rounds),
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
    work = report["candidate_workload"]
    print(
        f"\ncandidate workload: {work['problems']} problems x 3 completions, {work['workers']} workers "
        f"({work['backend']})"
    )
    print(f"{'sandbox pool':24} {work['checks_per_s']:>10} checks/s ({work['checks_per_s_per_core']}/core)")
    print(f"{'HumanEval harness way':24} {work['humaneval_harness_checks_per_s']:>10} checks/s")
    print(f"{'bare fork + pipe':24} {work['bare_fork_checks_per_s']:>10} checks/s")
    print(
        f"CPU per check (ms, all processes): {work['cpu_ms_per_check']}; "
        f"harness / pool: {work['cpu_ratio_to_humaneval_harness']}x"
    )
    print(
        f"ratio to the harness {work['ratio_to_humaneval_harness']}x {work['ratio_range']}, "
        f"verdicts identical: {work['verdicts_identical']}"
    )
    for side in ("verdicts_flywheel", "verdicts_humaneval_harness"):
        print(
            f"{side:28}",
            "  ".join(
                f"{kind}: {row['passed']} pass / {row['failed']} fail" for kind, row in work[side].items()
            ),
        )
    report["all_in_process_meet_target"] = all(figures[name]["meets_target"] for name in RULES)
    print(json.dumps(report))


if __name__ == "__main__":
    main()

"""Benchmark: the asynchronous run pipeline (staleness k = 1) against the synchronous one (k = 0).

`make bench-runs`. REPEATS pairs of runs on the same workload with the same workers (one learner
worker, two rollout workers, one eval worker, as separate processes), through the real queues,
sandboxes and learner; the order alternates (sync first, then async first, ...), and the figure is
the median of the per-repeat ratios of wall time to the same step count, with its range.

The workload: demo function tasks, one item in HEAVY_SHARE carrying a test suite that does a fixed
amount of computation in the sandbox (HEAVY_ITERATIONS loop iterations, real CPU, not a sleep: a
slow test suite overlaps only where a core is free). The held-out set is larger than either run
saturates (both kinds, HELDOUT items, a lower learning rate and few steps); the base model's
held-out pass rate (each run's step 0) is reported beside each mode's final one.

Per mode: learned and dropped episodes (the learner's `episodes/learned` and `dropped/*`), the
phase times per step (generate and score from the rollout batches, learn and wait from the
learner), and the CPU the workers' process trees used (learner, rollout workers and their
sandboxes, eval) against the machine's (other jobs share it). From the synchronous run's own
phase times, the ideal speedup of pipelining is computed and printed beside the measured one:

- phases: overlapping step s's learning with step s+1's rollout hides at most min(rollout, learn)
  per step, so ideal = wall / (wall - sum of min(rollout_s, learn_s));
- CPU: no schedule finishes before the run's CPU seconds over the cores, so ideal <= wall /
  (cpu / cores); the ideal is the smaller of the two.

Each run starts once the learner worker's spare learner has loaded, as runs minutes apart find it.
Ends with one line of JSON. BENCH_RUNS_REPEATS, _STEPS, _HELDOUT and _LR change it
while developing (BENCH_RUNS_MODEL: another base folder). Runs on a fresh SQLite database under a
temporary FLYWHEEL_HOME unless DATABASE_URL / FLYWHEEL_HOME are set.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS = int(os.environ.get("BENCH_RUNS_STEPS", "8"))
REPEATS = int(os.environ.get("BENCH_RUNS_REPEATS", "3"))
HELDOUT = int(os.environ.get("BENCH_RUNS_HELDOUT", "128"))
# The default 3e-4 over 12 steps solved a 48-item held-out set in both modes; fewer steps or a
# lower rate leave room to see a difference.
LEARNING_RATE = float(os.environ.get("BENCH_RUNS_LR", "1e-4"))
HEAVY_SHARE = 4  # every 4th training item carries a heavy test suite
HEAVY_ITERATIONS = 3_000_000
HEAVY_LINE = f"_work = sum(i * i % 7 for i in range({HEAVY_ITERATIONS}))  # a slow test suite: real CPU\n"
CORES = os.cpu_count() or 1
ROLLOUT_WORKERS = 2
WORKERS = (
    ("learner", "learner"),
    ("control", "control"),
    ("rollout", "rollout-1"),
    ("rollout", "rollout-2"),
    ("eval", "eval"),
)


def setup_environment() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("FLYWHEEL_HOME", tempfile.mkdtemp(prefix="flywheel-bench-runs-"))
    env["FLYWHEEL_REDIS_PORT"] = env.get("FLYWHEEL_REDIS_PORT", "6471")
    env["FLYWHEEL_ROLLOUT_CONCURRENCY"] = "2"
    env["FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS"] = "1"
    env["FLYWHEEL_TORCH_THREADS"] = "1"  # four worker processes and a learner share the cores
    os.environ.update(env)
    return env


def django_setup() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()


def base_model(home: Path) -> Path:
    """The tiny base `make up` uses (FLYWHEEL_HOME/models/tiny-base, or the checkout's), else built here."""
    from django.core.management import call_command

    if os.environ.get("BENCH_RUNS_MODEL"):  # another base, e.g. a smaller one while developing
        return Path(os.environ["BENCH_RUNS_MODEL"])
    target = home / "models" / "tiny-base"
    shared = ROOT / ".flywheel" / "models" / "tiny-base"
    if not (target / "config.json").exists() and (shared / "config.json").exists():
        shutil.copytree(shared, target, dirs_exist_ok=True)
    if not (target / "config.json").exists():
        call_command("build_base_model", "--out", str(target))
    return target


def heavy_test_cpu_seconds() -> float:
    """What one heavy suite's extra computation costs on this machine, outside any sandbox."""
    started = time.process_time()
    exec(compile(HEAVY_LINE, "heavy", "exec"), {})  # our own constant line, not model output
    return time.process_time() - started


def heavy(item: dict, index: int) -> dict:
    return item if index % HEAVY_SHARE else item | {"tests": HEAVY_LINE + item["tests"]}


def workload(model: Path):
    from projects import services as project_services
    from projects.demo_tasks import demo_task_sets
    from rewards import services as reward_services
    from runs import services
    from tiers import services as tier_services

    owner = services.User.objects.create_user(username=f"bench-{time.time_ns()}")
    project = project_services.project_create(name=f"bench-{time.time_ns()}", by=owner)
    sets = demo_task_sets(seed=0, train_size=400, heldout_size=HELDOUT, kinds=("scalar",))
    items = [heavy(item, index) for index, item in enumerate(sets["train"])] + sets["heldout"]
    task_set = project_services.task_set_create(project=project, name="mixed", by=owner)
    lines = [(json.dumps(item) + "\n").encode() for item in items]
    version = project_services.task_set_import(
        task_set=task_set, stream=lines, file_format="jsonl", by=owner
    ).version
    rule = reward_services.reward_rule_create(
        project=project, name="tests", spec={"type": "unit_tests", "name": "tests"}, by=owner
    )
    tier = tier_services.tier_create(
        project=project,
        by=owner,
        name="rollout",
        base_model=str(model),
        temperature=1.0,
        max_new_tokens=32,
        batch_size=64,
    )
    return owner, project, version, rule, tier


def start_workers(env: dict[str, str]) -> list[subprocess.Popen]:
    from benchmarks.worker_processes import start_workers as started

    return started(env, WORKERS, "bench")


def spare_settle(learner_worker: subprocess.Popen, timeout: float = 60.0) -> None:
    """Wait until the learner worker's spare learner has loaded: its CPU time stops growing."""
    import psutil
    from django.conf import settings

    if not settings.FLYWHEEL_LEARNER_SPARE:
        return
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        used = None
        for child in psutil.Process(learner_worker.pid).children():
            try:
                if "--wait" in child.cmdline():
                    used = sum(child.cpu_times()[:2])
            except (psutil.ZombieProcess, psutil.NoSuchProcess):
                continue  # the learner that has just exited, not reaped yet
        if used is not None and used == last:
            return
        last = used
        time.sleep(1.0)  # sampling the spare's CPU time, not synchronising


def tree_cpu_seconds(pids: list[int]) -> float:
    """CPU (user + system) used so far by each process tree: live processes, plus what their
    exited and reaped children (sandboxes, finished learners) left in their parents' totals."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            members = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for process in members:
            try:
                times = process.cpu_times()
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
            total += times.user + times.system + times.children_user + times.children_system
    return total


def machine_cpu_seconds() -> float:
    import psutil

    times = psutil.cpu_times()
    return times.user + times.nice + times.system + getattr(times, "irq", 0) + getattr(times, "softirq", 0)


@dataclass
class StepPhases:
    """One step of a run: its rollout batches' durations (claim to finish) and generation times,
    the span from the first claim to the last finish, and the learner's wait and learn times."""

    durations: list[float]
    generate: list[float]
    span: float
    wait: float
    learn: float


@dataclass
class Measured:
    staleness: int
    wall: float
    figures: dict
    steps: list[StepPhases]
    cpu: float


def run_once(staleness: int, pids: list[int], owner, project, version, rule, tier) -> Measured:
    from runs.lifecycle import RunRequest, run_create
    from runs.models import Run

    request = RunRequest(
        project=project,
        name=f"k={staleness}",
        task_set_version=version,
        reward_rule_version=rule.versions.get(),
        tier=tier,
        max_steps=STEPS,
        hyperparameters={
            "group_size": 8,
            "batch_size": 16,
            "staleness": staleness,
            "seed": 0,
            "learning_rate": LEARNING_RATE,
            "checkpoint_every": STEPS,
            "eval_every": STEPS,
            "eval_items": 0,
        },
    )
    cpu_before, machine_before, window = tree_cpu_seconds(pids), machine_cpu_seconds(), time.monotonic()
    run = run_create(request=request, by=owner)
    while not run.is_terminal:
        time.sleep(0.2)  # following a run to its end
        run.refresh_from_db()
    cpu, machine_cpu = tree_cpu_seconds(pids) - cpu_before, machine_cpu_seconds() - machine_before
    window = time.monotonic() - window  # submit to end: the span the CPU figures cover
    assert run.status == Run.Status.SUCCEEDED, run.error
    return measured(run, staleness, cpu, (machine_cpu - cpu) / window)


def step_phases(run, waits: list[float], learns: list[float]) -> list[StepPhases]:
    from runs.models import RolloutBatch

    rows = RolloutBatch.objects.filter(run=run, status=RolloutBatch.Status.DONE, step__lt=STEPS)
    by_step: dict[int, list] = {}
    for step, claimed, finished, generate in rows.values_list(
        "step", "claimed_at", "finished_at", "generate_seconds"
    ):
        by_step.setdefault(step, []).append((claimed, finished, generate))
    phases = []
    for step, wait, learn in zip(sorted(by_step), waits, learns, strict=False):
        batches = by_step[step]
        span = max(f for _, f, _ in batches) - min(c for c, _, _ in batches)
        durations = [(f - c).total_seconds() for c, f, _ in batches]
        phases.append(StepPhases(durations, [g for *_, g in batches], span.total_seconds(), wait, learn))
    return phases


def measured(run, staleness: int, cpu: float, others_rate: float) -> Measured:
    """The run's figures; `others_rate`: the cores other jobs kept busy while it ran."""
    from runs.models import MetricPoint, RolloutBatch

    while not MetricPoint.objects.filter(run=run, name="heldout/pass_rate", step=STEPS).exists():
        time.sleep(0.5)  # the final evaluation arrives from the eval worker
    points = MetricPoint.objects.filter(run=run)

    def series(name: str) -> list[float]:
        return list(points.filter(name=name).order_by("step").values_list("value", flat=True))

    steps = step_phases(run, series("time/wait"), series("time/learn"))
    wall = (run.finished_at - run.started_at).total_seconds()
    first_claim = (
        RolloutBatch.objects.filter(run=run).order_by("claimed_at").values_list("claimed_at", flat=True)[0]
    )
    figures = {
        "wall_seconds": wall,
        "heldout_pass_rate": points.get(name="heldout/pass_rate", step=STEPS).value,
        "base_heldout_pass_rate": points.get(name="heldout/pass_rate", step=0).value,
        "train_pass_rate_last": (series("train/pass_rate") or [0.0])[-1],
        "episodes_learned": sum(series("episodes/learned")),
        "episodes_dropped": {
            kind: sum(series(f"dropped/{kind}")) for kind in ("errored", "zero_variance", "stale")
        },
        "per_step_p50_s": {
            "rollout_span": statistics.median(step.span for step in steps),
            "batch": statistics.median(d for step in steps for d in step.durations),
            "generate_per_batch": statistics.median(g for step in steps for g in step.generate),
            "learn": statistics.median(step.learn for step in steps),
            "wait": statistics.median(step.wait for step in steps),
        },
        "workers_cpu_seconds": cpu,
        "others_cpu_share": max(0.0, others_rate) / CORES,
        "submit_to_first_rollout_s": (first_claim - run.created_at).total_seconds(),
        "submit_to_learner_running_s": (run.started_at - run.created_at).total_seconds(),
    }
    return Measured(staleness, wall, figures, steps, cpu)


def where_sync_waits(sync: Measured) -> dict[str, float]:
    """The synchronous run's wall time split into what a step waits on, in seconds: generation
    and scoring (the rollout workers' busy time, per worker), stragglers (a worker done, the
    step waiting for the other's batch), dispatch (from the step's start to its first claim and
    from its last finish to the learner noticing), learning (GRPO step and publishing the new
    version) and the rest (the learner's bookkeeping, checkpoints, start-up)."""
    parts = {"generate": 0.0, "score": 0.0, "stragglers": 0.0, "dispatch": 0.0, "learn": 0.0}
    for step in sync.steps:
        busy = sum(step.durations) / ROLLOUT_WORKERS
        generate = sum(step.generate) / ROLLOUT_WORKERS
        parts["generate"] += generate
        parts["score"] += busy - generate
        parts["stragglers"] += step.span - busy
        parts["dispatch"] += step.wait - step.span
        parts["learn"] += step.learn
    parts["other"] = sync.wall - sum(parts.values())
    return parts


def ideal_speedups(sync: Measured) -> dict[str, float]:
    """What perfect pipelining could give, from the synchronous run's own measurements: each
    step's rollout spread evenly over the workers and run while the previous step learns
    (max(busy, learn)), dispatch latency hidden behind queued work, the rest as measured; and no
    faster than the run's CPU seconds over the cores."""
    waits = where_sync_waits(sync)
    pipelined = sum(max(sum(step.durations) / ROLLOUT_WORKERS, step.learn) for step in sync.steps)
    phases = sync.wall / (pipelined + waits["other"])
    cpu = sync.wall / max(sync.cpu / CORES, 1e-9)
    return {"phases": phases, "cpu": cpu, "ideal": min(phases, cpu)}


def rounded(value):
    if isinstance(value, dict):
        return {key: rounded(inner) for key, inner in value.items()}
    return round(value, 3) if isinstance(value, float) else value


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def main() -> None:
    env = setup_environment()
    django_setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    model = base_model(Path(env["FLYWHEEL_HOME"]))
    heavy_cpu = heavy_test_cpu_seconds()
    workers = start_workers(env)  # with the embedded Redis, which the workload's events go to
    pids = [process.pid for process in workers]
    repeats: list[dict] = []
    try:
        setup = workload(model)
        for repeat in range(REPEATS):
            order = (0, 1) if repeat % 2 == 0 else (1, 0)
            runs = {}
            for staleness in order:
                spare_settle(workers[0])  # runs minutes apart find the worker's spare learner loaded
                runs[staleness] = run_once(staleness, pids, *setup)
                print(
                    f"repeat {repeat + 1}/{REPEATS}, k={staleness}: {rounded(runs[staleness].figures)}",
                    flush=True,
                )
            ideal = ideal_speedups(runs[0])
            waits = where_sync_waits(runs[0])
            speedup = runs[0].wall / runs[1].wall
            repeats.append(
                {
                    "order": "sync first" if order[0] == 0 else "async first",
                    "speedup": speedup,
                    "ideal": ideal,
                    "share_of_ideal": speedup / ideal["ideal"],
                    "sync_wall_split_s": waits,
                    "sync_k0": runs[0].figures,
                    "async_k1": runs[1].figures,
                }
            )
            print(f"repeat {repeat + 1}: speedup {speedup:.2f}x, ideal {rounded(ideal)}", flush=True)
    finally:
        from benchmarks.worker_processes import stop_all

        stop_all(workers)

    def both(mode: str, key: str) -> list[float]:
        return [repeat[mode][key] for repeat in repeats]

    print(
        json.dumps(
            {
                "benchmark": "run_pipeline",
                "steps": STEPS,
                "repeats": REPEATS,
                "order": [repeat["order"] for repeat in repeats],
                "workers": {"learner": 1, "rollout": ROLLOUT_WORKERS, "eval": 1},
                "cores": CORES,
                "workload": (
                    f"demo functions, 1 in {HEAVY_SHARE} with a heavy test suite "
                    f"({HEAVY_ITERATIONS:,} loop iterations, {heavy_cpu:.2f} CPU-s here); "
                    f"lr {LEARNING_RATE:g}; {HELDOUT} held-out items"
                ),
                "speedup": spread([repeat["speedup"] for repeat in repeats]),
                "ideal_speedup": spread([repeat["ideal"]["ideal"] for repeat in repeats]),
                "ideal_speedup_phases": spread([repeat["ideal"]["phases"] for repeat in repeats]),
                "ideal_speedup_cpu": spread([repeat["ideal"]["cpu"] for repeat in repeats]),
                "share_of_ideal": spread([repeat["share_of_ideal"] for repeat in repeats]),
                "sync_wall_share_p50": {
                    part: round(
                        statistics.median(
                            r["sync_wall_split_s"][part] / r["sync_k0"]["wall_seconds"] for r in repeats
                        ),
                        3,
                    )
                    for part in repeats[0]["sync_wall_split_s"]
                },
                "wall_s": {
                    "sync_k0": spread(both("sync_k0", "wall_seconds")),
                    "async_k1": spread(both("async_k1", "wall_seconds")),
                },
                "heldout_pass_rate": {
                    "base": repeats[0]["sync_k0"]["base_heldout_pass_rate"],
                    "sync_k0": spread(both("sync_k0", "heldout_pass_rate")),
                    "async_k1": spread(both("async_k1", "heldout_pass_rate")),
                },
                "others_cpu_share": spread(
                    both("sync_k0", "others_cpu_share") + both("async_k1", "others_cpu_share")
                ),
                "learner_spare": settings.FLYWHEEL_LEARNER_SPARE,
                "rollout_batch_items": settings.FLYWHEEL_ROLLOUT_BATCH_ITEMS or "one per rollout process",
                "per_repeat": rounded(repeats),
            }
        )
    )


if __name__ == "__main__":
    main()

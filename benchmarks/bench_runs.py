"""Benchmark: the asynchronous run pipeline (staleness k = 1) against the synchronous one (k = 0).

`make bench-runs`. One run of each on the same workload, with the same workers (one learner
worker, two rollout workers, one eval worker, as separate processes), through the real queues,
sandboxes and learner. The workload mixes short and long episodes: a quarter of the demo function
tasks carry tests that take two seconds to run in the sandbox, as slow test suites (or agents
waiting on tools) do. Reports
the wall time to a fixed number of learner steps, the final held-out pass rate of each run, the
ratio, and the time from submit to the learner running and to the first rollout. Each run starts
once the learner worker's spare learner has loaded, as runs minutes apart find it;
FLYWHEEL_LEARNER_SPARE=false measures cold learners instead. Ends with one line of JSON. Runs on a
fresh SQLite database under a temporary FLYWHEEL_HOME unless DATABASE_URL is set.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS = 12
SLOW_SHARE = 4  # every 4th item is slow
SLOW_TEST_SECONDS = 2.0


def setup_environment() -> dict[str, str]:
    home = tempfile.mkdtemp(prefix="flywheel-bench-runs-")
    env = dict(os.environ)
    env.setdefault("FLYWHEEL_HOME", home)
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
    """The project's tiny base model: the one `make up` built, else built here once."""
    from django.core.management import call_command

    shared = ROOT / ".flywheel" / "models" / "tiny-base"
    target = home / "models" / "tiny-base"
    if (shared / "config.json").exists():
        shutil.copytree(shared, target, dirs_exist_ok=True)
    elif not (target / "config.json").exists():
        call_command("build_base_model", "--out", str(target))
    return target


def slow(item: dict, index: int) -> dict:
    if index % SLOW_SHARE:
        return item
    slow_line = f"import time\ntime.sleep({SLOW_TEST_SECONDS})  # a slow test suite\n"
    return item | {"tests": slow_line + item["tests"]}


def workload(model: Path):
    from rewards import services as reward_services
    from runs import services
    from runs.demo_tasks import demo_task_sets

    owner = services.User.objects.create_user(username=f"bench-{time.time_ns()}")
    project = services.project_create(name=f"bench-{time.time_ns()}", by=owner)
    sets = demo_task_sets(seed=0, train_size=400, heldout_size=48, kinds=("scalar",))
    items = [slow(item, index) for index, item in enumerate(sets["train"])] + sets["heldout"]
    task_set = services.task_set_create(project=project, name="mixed", by=owner)
    lines = [(json.dumps(item) + "\n").encode() for item in items]
    version = services.task_set_import(task_set=task_set, stream=lines, file_format="jsonl", by=owner).version
    rule = reward_services.reward_rule_create(
        project=project, name="tests", spec={"type": "unit_tests", "name": "tests"}, by=owner
    )
    tier = services.tier_create(
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
    from webapp.embedded_redis import redis_start
    from webapp.stack import solo_worker_argv

    redis_start(home=Path(env["FLYWHEEL_HOME"]), port=int(env["FLYWHEEL_REDIS_PORT"]))
    processes = []
    for queues, name in (
        ("learner", "learner"),
        ("rollout", "rollout-1"),
        ("rollout", "rollout-2"),
        ("eval", "eval"),
    ):
        argv = solo_worker_argv(queues, f"{name}@bench")
        process = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for line in process.stdout:
            if " ready." in line:
                break
        processes.append(process)
    return processes


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


def run_once(staleness: int, owner, project, version, rule, tier) -> dict:
    from runs.lifecycle import RunRequest, run_create
    from runs.models import MetricPoint, RolloutBatch, Run

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
            "checkpoint_every": STEPS,
            "eval_every": STEPS,
            "eval_items": 0,
        },
    )
    run = run_create(request=request, by=owner)
    while not run.is_terminal:
        time.sleep(0.5)  # following a run to its end
        run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    while not MetricPoint.objects.filter(run=run, name="heldout/pass_rate", step=STEPS).exists():
        time.sleep(0.5)  # the final evaluation arrives from the eval worker
    first_claim = (
        RolloutBatch.objects.filter(run=run).order_by("claimed_at").values_list("claimed_at", flat=True)[0]
    )

    def per_step(name: str) -> float:
        values = MetricPoint.objects.filter(run=run, name=name).values_list("value", flat=True)
        return statistics.median(values) if values else 0.0

    return {
        "wall_seconds": (run.finished_at - run.started_at).total_seconds(),
        "learn_s_per_step_p50": per_step("time/learn"),
        "wait_s_per_step_p50": per_step("time/wait"),
        "generate_s_per_step_p50": per_step("time/generate"),
        "score_s_per_step_p50": per_step("time/score"),
        "heldout_pass_rate": MetricPoint.objects.get(run=run, name="heldout/pass_rate", step=STEPS).value,
        "submit_to_first_rollout_s": (first_claim - run.created_at).total_seconds(),
        "submit_to_learner_running_s": (run.started_at - run.created_at).total_seconds(),
    }


def main() -> None:
    env = setup_environment()
    django_setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    model = base_model(Path(env["FLYWHEEL_HOME"]))
    workers = start_workers(env)  # with the embedded Redis, which the workload's events go to
    try:
        setup = workload(model)
        spare_settle(workers[0])  # runs minutes apart find the worker's spare learner loaded
        sync = run_once(0, *setup)
        spare_settle(workers[0])
        asynchronous = run_once(1, *setup)
    finally:
        for process in workers:
            process.terminate()
        for process in workers:
            process.wait(timeout=60)
        from webapp.stack import process_stop

        process_stop("redis")
    print(
        json.dumps(
            {
                "benchmark": "run_pipeline",
                "steps": STEPS,
                "workers": {"learner": 1, "rollout": 2, "eval": 1},
                "workload": f"demo functions, 1 in {SLOW_SHARE} with {SLOW_TEST_SECONDS}s tests",
                "sync_k0": {k: round(v, 3) for k, v in sync.items()},
                "async_k1": {k: round(v, 3) for k, v in asynchronous.items()},
                "speedup": round(sync["wall_seconds"] / asynchronous["wall_seconds"], 2),
                "learner_spare": settings.FLYWHEEL_LEARNER_SPARE,
                "submit_to_first_rollout_p50_s": round(
                    statistics.median(
                        [sync["submit_to_first_rollout_s"], asynchronous["submit_to_first_rollout_s"]]
                    ),
                    3,
                ),
            }
        )
    )


if __name__ == "__main__":
    main()

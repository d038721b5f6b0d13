"""Benchmark: how close a run's estimate comes to what the run then records. `make bench-estimate`.

The demo's GRPO on the tiny base (`make up`'s), through real workers (one learner, one rollout, one
eval process) and sandboxes. Three settings differ from a calibration in one way each (more steps; a
larger group; a tier of 24 new tokens instead of 64). Each, as a user would run it, in a project of
its own: its tier is calibrated (a short run of CALIBRATION_STEPS steps, group 4, batch 16, whose
record is the only basis the estimate has), then the setting is estimated with
`costs.estimates.run_estimate`, launched, run, and compared with what it recorded: device-seconds
of its learner and rollout steps (held-out evaluation is outside both sides), and wall time from
the run's start to its last step's end.

The three are repeated (BENCH_ESTIMATE_REPEATS, default 3), their order reversed every other time;
the very first calibration is the first work of fresh workers. This machine's pace for the same
work drifts by a third between runs minutes apart (shared cores), so each estimate rests on the
calibration just before it, and the figures are per-setting medians over the repeats.

Ends with one line of JSON: per setting each repeat's estimate (with its range), record and ratios,
and the median ratios. BENCH_ESTIMATE_CALIBRATION changes the calibration's steps.
"""

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_runs import base_model, django_setup  # noqa: E402

CALIBRATION_STEPS = int(os.environ.get("BENCH_ESTIMATE_CALIBRATION", "8"))
REPEATS = int(os.environ.get("BENCH_ESTIMATE_REPEATS", "3"))
WORKERS = (("learner", "learner"), ("control", "control"), ("rollout", "rollout"), ("eval", "eval"))
CALIBRATION = {"batch_size": 16, "group_size": 4}
SETTINGS = (  # (name, tier, steps, hyperparameters): each differs from the calibration once
    ("more steps", "long", 24, CALIBRATION),
    ("larger group", "long", 8, {"batch_size": 16, "group_size": 8}),
    ("other tier", "short", 12, CALIBRATION),
)


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("FLYWHEEL_HOME", tempfile.mkdtemp(prefix="flywheel-bench-estimate-"))
    env["FLYWHEEL_REDIS_PORT"] = env.get("FLYWHEEL_REDIS_PORT", "6473")
    env["FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS"] = "1"
    env["FLYWHEEL_TORCH_THREADS"] = "1"
    os.environ.update(env)
    return env


def workload(model: Path, heldout_size: int = 16) -> dict:
    from projects import services as project_services
    from projects.demo_tasks import demo_task_sets
    from rewards import services as reward_services
    from runs import services
    from tiers import services as tier_services

    owner = services.User.objects.create_user(username=f"bench-{time.time_ns()}")
    project = project_services.project_create(name=f"bench-{time.time_ns()}", by=owner)
    sets = demo_task_sets(seed=0, train_size=400, heldout_size=heldout_size, kinds=("scalar",))
    task_set = project_services.task_set_create(project=project, name="functions", by=owner)
    lines = [(json.dumps(item) + "\n").encode() for item in sets["train"] + sets["heldout"]]
    version = project_services.task_set_import(
        task_set=task_set, stream=lines, file_format="jsonl", by=owner
    ).version
    rule = reward_services.reward_rule_create(
        project=project, name="tests", spec={"type": "unit_tests", "name": "tests"}, by=owner
    )
    tiers = {
        name: tier_services.tier_create(
            project=project,
            by=owner,
            name=name,
            base_model=str(model),
            temperature=1.0,
            max_new_tokens=tokens,
        )
        for name, tokens in (("long", 64), ("short", 24))
    }
    return {"owner": owner, "project": project, "version": version, "rule": rule, "tiers": tiers}


def run(setup: dict, name: str, tier, steps: int, hyperparameters: dict):
    from runs.lifecycle import RunRequest, run_create
    from runs.models import Run

    request = RunRequest(
        project=setup["project"],
        name=name,
        task_set_version=setup["version"],
        reward_rule_version=setup["rule"].versions.get(),
        tier=tier,
        max_steps=steps,
        hyperparameters=hyperparameters | {"seed": 0, "eval_every": 1000, "eval_items": 0},
    )
    launched = run_create(request=request, by=setup["owner"])
    while not launched.is_terminal:
        time.sleep(0.5)  # following the run to its end
        launched.refresh_from_db()
    assert launched.status == Run.Status.SUCCEEDED, launched.error
    return launched


def recorded(run) -> dict[str, float]:
    """What the run recorded: its learner and rollout device-seconds, and the seconds from its
    start to its last learner step's end."""
    from django.db.models import Max, Sum

    from costs.models import Usage

    steps = Usage.objects.filter(run=run, kind__in=("learner", "rollout"))
    ended = Usage.objects.filter(run=run, kind="learner").aggregate(last=Max("first_recorded_at"))["last"]
    return {
        "device_seconds": steps.aggregate(total=Sum("device_seconds"))["total"],
        "wall_seconds": (ended - run.started_at).total_seconds(),
    }


def compared(name: str, tier: str, steps: int, estimate: dict, actual: dict[str, float]) -> dict:
    """One setting's estimate beside its record: recorded / expected, device time and wall time."""
    device_hours = actual["device_seconds"] / 3600
    wall = actual["wall_seconds"]
    return {
        "setting": name,
        "tier": tier,
        "steps": steps,
        "work_per_step": estimate["work_per_step"],
        "basis_steps": estimate["basis"]["steps"],
        "device_hours": {"estimate": estimate["device_hours"], "recorded": round(device_hours, 6)},
        "device_ratio": round(device_hours / estimate["device_hours"]["expected"], 3),
        "wall_seconds": {"estimate": estimate["wall_seconds"], "recorded": round(wall, 1)},
        "wall_ratio": round(wall / estimate["wall_seconds"]["expected"], 3),
    }


def main() -> None:
    env = environment()
    django_setup()
    from django.core.management import call_command

    from benchmarks.worker_processes import start_workers, stop_all
    from costs.estimates import run_estimate
    from runs.learners import hyperparameters_resolve

    call_command("migrate", verbosity=0)
    model = base_model(Path(env["FLYWHEEL_HOME"]))
    load_before, started = os.getloadavg(), time.monotonic()
    workers = start_workers(env, WORKERS, "bench-estimate")
    repeats: list[list[dict]] = []
    try:
        for repeat in range(REPEATS):
            results: dict[str, dict] = {}
            order = SETTINGS if repeat % 2 == 0 else SETTINGS[::-1]
            for name, tier_name, steps, hyperparameters in order:
                setup = workload(model)
                tier = setup["tiers"][tier_name]
                run(setup, f"calibration {tier_name}", tier, CALIBRATION_STEPS, CALIBRATION)
                resolved, _ = hyperparameters_resolve("grpo", hyperparameters)
                estimate = run_estimate(tier=tier, method="grpo", resolved=resolved, steps=steps)
                actual = recorded(run(setup, name, tier, steps, hyperparameters))
                results[name] = compared(name, tier_name, steps, estimate, actual)
                print(json.dumps({"repeat": repeat} | results[name]), flush=True)
            repeats.append([results[name] for name, *_ in SETTINGS])
    finally:
        stop_all(workers)
    settings = [
        {
            "setting": name,
            "tier": tier_name,
            "steps": steps,
            "device_ratio": statistics.median(r[index]["device_ratio"] for r in repeats),
            "wall_ratio": statistics.median(r[index]["wall_ratio"] for r in repeats),
            "repeats": [r[index] for r in repeats],
        }
        for index, (name, tier_name, steps, _) in enumerate(SETTINGS)
    ]
    worst = max(max(abs(s["device_ratio"] - 1), abs(s["wall_ratio"] - 1)) for s in settings)
    worst_single = max(
        max(abs(r["device_ratio"] - 1), abs(r["wall_ratio"] - 1)) for rs in repeats for r in rs
    )
    print(
        json.dumps(
            {
                "benchmark": "estimate",
                "calibration": {"steps": CALIBRATION_STEPS} | CALIBRATION,
                "repeats": REPEATS,
                "settings": settings,
                "worst_error": round(worst, 3),
                "within_25_percent": worst <= 0.25,
                "worst_single_error": round(worst_single, 3),
                "seconds": round(time.monotonic() - started, 1),
                "load_average": {
                    "before": [round(x, 2) for x in load_before],
                    "after": list(os.getloadavg()),
                },
                "cores": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()

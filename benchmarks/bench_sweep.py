"""Benchmark: the issue's two sweep demonstrations on real workers. `make bench-sweep`.

1. Learning rate × group size (a grid of 6, ASHA on the held-out pass rate, reduction factor 3,
   its rungs at the first held-out evaluation and three times later) of the demo's GRPO on the
   tiny base, within a device-hour budget, against the default setting run alone in the same
   benchmark: does the sweep find a setting whose held-out pass rate beats the default's, stopping
   at least two runs early?
2. One recipe across three base models (the tiny base and two more built here, smaller and
   trained less): each model's lift on the held-out set (its best run's last evaluation minus its
   step 0) and what its runs cost.

The benchmark plays the periodic tick itself (a pass of every sweep, then admission) every
TICK_SECONDS, since its learner worker is a solo process busy with the run it supervises. Ends
with one line of JSON. BENCH_SWEEP_STEPS (default 8) and BENCH_SWEEP_BASE_STEPS (the extra
models' pretraining steps, default 300) shorten it; BENCH_SWEEP_HELDOUT sizes the held-out set
(default 64); BENCH_SWEEP_BUDGET is the grid sweep's budget in device-hours, as a multiple of what
the default run recorded (default 7: about what the whole grid run to its end costs, its group-8
runs taking about 1.5 times a group-4 run's device time; the JSON extrapolates what the stopped
runs would have cost, to show whether the budget bound); BENCH_SWEEP_SEED is the runs'
seed (default 0); BENCH_SWEEP_REDUCTION is ASHA's reduction factor (default 3). BENCH_RUNS_MODEL
reuses a built tiny base and BENCH_SWEEP_MODELS names a folder that keeps the two extra models
between attempts (built there when missing).
"""

import json
import os
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_estimate import workload  # noqa: E402
from benchmarks.bench_runs import base_model, django_setup  # noqa: E402

STEPS = int(os.environ.get("BENCH_SWEEP_STEPS", "8"))
BASE_STEPS = int(os.environ.get("BENCH_SWEEP_BASE_STEPS", "300"))
HELDOUT = int(os.environ.get("BENCH_SWEEP_HELDOUT", "64"))
BUDGET_RUNS = float(os.environ.get("BENCH_SWEEP_BUDGET", "7"))
SEED = int(os.environ.get("BENCH_SWEEP_SEED", "0"))
REDUCTION = int(os.environ.get("BENCH_SWEEP_REDUCTION", "3"))
EVAL_EVERY = max(1, STEPS // 4)
TICK_SECONDS = 2.0
WORKERS = (("learner", "learner"), ("control", "control"), ("rollout", "rollout"), ("eval", "eval"))
RECIPE = {"batch_size": 16, "eval_items": 0, "seed": SEED, "eval_every": EVAL_EVERY}
DEFAULT = {"learning_rate": 3e-4, "group_size": 4}
GRID = [
    {"name": "hyperparameters.learning_rate", "values": [1e-4, 3e-4, 1e-3]},
    {"name": "hyperparameters.group_size", "values": [4, 8]},
]
EXTRA_MODELS = {  # name: (hidden size, layers): smaller than the tiny base, pretrained less
    "narrow": (96, 3),
    "shallow": (128, 2),
}


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("FLYWHEEL_HOME", tempfile.mkdtemp(prefix="flywheel-bench-sweep-"))
    env["FLYWHEEL_REDIS_PORT"] = env.get("FLYWHEEL_REDIS_PORT", "6474")
    env["FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS"] = "1"
    env["FLYWHEEL_TORCH_THREADS"] = "1"
    os.environ.update(env)
    return env


def extra_models(home: Path) -> list[Path]:
    from django.core.management import call_command

    folder = Path(os.environ.get("BENCH_SWEEP_MODELS") or home / "models")
    built = []
    for name, (hidden, layers) in EXTRA_MODELS.items():
        out = folder / name
        if not (out / "config.json").exists():
            call_command(
                "build_base_model",
                "--out",
                str(out),
                "--hidden-size",
                str(hidden),
                "--intermediate-size",
                str(hidden * 3),
                "--layers",
                str(layers),
                "--steps",
                str(BASE_STEPS),
            )
        built.append(out)
    return built


def template(setup: dict, tier) -> dict:
    return {
        "task_set_version": setup["version"].pk,
        "reward_rule_version": setup["rule"].versions.get().pk,
        "tier": tier.pk,
        "hyperparameters": RECIPE | DEFAULT,
        "max_steps": STEPS,
    }


def tick() -> None:
    from runs.scheduling import runs_admit
    from sweeps.driver import sweeps_advance

    sweeps_advance()
    runs_admit()


def follow_sweep(sweep_id: int) -> None:
    from sweeps.models import Sweep

    while not Sweep.objects.get(pk=sweep_id).is_terminal:
        tick()
        time.sleep(TICK_SECONDS)  # the tick's period


def follow_run(run) -> None:
    while not run.is_terminal:
        tick()
        time.sleep(TICK_SECONDS)
        run.refresh_from_db()


def heldout(run_id: int, step: int | None = None) -> float | None:
    from runs.models import MetricPoint

    points = MetricPoint.objects.filter(run_id=run_id, name="heldout/pass_rate").order_by("-step")
    point = points.filter(step=step).first() if step is not None else points.first()
    return None if point is None else point.value


def default_run(setup: dict, tier) -> dict:
    from runs.lifecycle import run_create
    from sweeps.selectors import trial_costs
    from sweeps.specs import template_request

    request = template_request(setup["project"], template(setup, tier), name="default")
    run = run_create(request=request, by=setup["owner"])
    follow_run(run)
    cost, hours = trial_costs([run.pk])[run.pk]
    return {
        "run": run.pk,
        "status": run.status,
        "heldout": heldout(run.pk),
        "start": heldout(run.pk, 0),
        "money": str(cost.quantize(Decimal("0.0001"))),
        "device_hours": round(hours, 6),
    }


def money(summary: dict) -> str:
    return str(summary["spent"]["money"].quantize(Decimal("0.0001")))


def trial_row(trial: dict) -> dict:
    """A trial's figures, with the steps its run trained: a run stopped early ends at the next
    step boundary after the pass that stops it, which may come after its last step."""
    from runs.models import Run

    keys = ("number", "params", "state", "value", "step", "stopped_early")
    return {k: trial[k] for k in keys} | {
        "run_steps": Run.objects.get(pk=trial["run"]).learner_step,
        "money": str(trial["money"].quantize(Decimal("0.0001"))),
        "device_hours": round(trial["device_hours"], 6),
    }


def full_grid_hours(trials: list[dict]) -> float:
    """What the grid would have cost had no run been stopped: a stopped run's device-hours scaled
    from the steps it trained to all of them (linear; its start-up and evaluations make it rough)."""
    return sum(
        t["device_hours"] * (STEPS / t["run_steps"] if t["stopped_early"] and t["run_steps"] else 1.0)
        for t in trials
    )


def main() -> None:
    env = environment()
    django_setup()
    import torch
    from django.core.management import call_command

    from benchmarks.worker_processes import start_workers, stop_all
    from costs.models import Price
    from sweeps import selectors, services

    # The bases built here share the cores with other jobs: one thread (two thrash on two cores).
    torch.set_num_threads(1)
    call_command("migrate", verbosity=0)
    home = Path(env["FLYWHEEL_HOME"])
    model = base_model(home)
    others = extra_models(home)
    Price.objects.get_or_create(unit=Price.Unit.DEVICE_HOUR, scope="", defaults={"amount": Decimal(2)})
    load_before, started = os.getloadavg(), time.monotonic()
    workers = start_workers(env, WORKERS, "bench-sweep")
    try:
        setup = workload(model, heldout_size=HELDOUT)
        tier = setup["tiers"]["long"]
        baseline = default_run(setup, tier)
        # A budget the whole grid run to its end would about reach or pass: stopping losers keeps within.
        budget_hours = round(BUDGET_RUNS * baseline["device_hours"], 6)
        grid = services.sweep_create(
            project=setup["project"],
            by=setup["owner"],
            name="lr x group",
            template=template(setup, tier),
            parameters=GRID,
            search_kind="grid",
            early_stopping="asha",
            min_steps=EVAL_EVERY,
            # 3, the sweep's default and ASHA's usual: with 2, trials that came after the grid's
            # worst ones were always in the top half (seed 1 stopped none of 6).
            reduction_factor=REDUCTION,
            concurrency=2,
            max_device_hours=budget_hours,
        )
        follow_sweep(grid.pk)
        grid_summary = selectors.sweep_summary(sweep=grid)
        grid_seconds = round(time.monotonic() - started, 1)
        across = services.sweep_create(
            project=setup["project"],
            by=setup["owner"],
            name="across base models",
            template=template(setup, tier),
            parameters=[{"name": "base_model", "values": [str(model), *map(str, others)]}],
            search_kind="grid",
            concurrency=1,
        )
        follow_sweep(across.pk)
        across.refresh_from_db()
        across_summary = selectors.sweep_summary(sweep=across)
    finally:
        stop_all(workers)
    grid.refresh_from_db()
    best = grid_summary["best"]
    rows = [trial_row(t) for t in grid_summary["trials"]]
    print(
        json.dumps(
            {
                "benchmark": "sweep",
                "steps": STEPS,
                "seed": SEED,
                "reduction_factor": REDUCTION,
                "eval_every": EVAL_EVERY,
                "heldout_items": HELDOUT,
                "default": baseline,
                "grid": {
                    "status": grid.status,
                    "reason": grid.reason,
                    "trials": rows,
                    "stopped_early": grid_summary["stopped_early"],
                    "best": None if best is None else {"params": best["params"], "heldout": best["value"]},
                    "spent": money(grid_summary),
                    "spent_device_hours": round(grid_summary["spent"]["device_hours"], 6),
                    "budget_device_hours": grid.max_device_hours,
                    "full_grid_device_hours_extrapolated": round(full_grid_hours(rows), 6),
                    "within_budget": grid_summary["spent"]["device_hours"] <= (grid.max_device_hours or 0.0),
                    "seconds": grid_seconds,
                },
                "best_beats_default": best is not None
                and baseline["heldout"] is not None
                and best["value"] > baseline["heldout"],
                "across_base_models": {
                    "status": across.status,
                    "models": [
                        {k: (str(v) if isinstance(v, Decimal) else v) for k, v in row.items()}
                        | {"base_model": Path(row["base_model"]).name}
                        for row in across_summary["base_models"]
                    ],
                },
                "seconds": round(time.monotonic() - started, 1),
                "load_average": {
                    "before": [round(x, 2) for x in load_before],
                    "after": [round(x, 2) for x in os.getloadavg()],
                },
                "cores": os.cpu_count(),
            },
            default=str,
        )
    )


if __name__ == "__main__":
    main()

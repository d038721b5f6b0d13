"""A run's estimate before launch (POST /api/v1/runs/estimate): scaled from the steps earlier runs
of its tier and method recorded, per unit of work (batch_size × group_size), with the range they
spread over; no basis without an earlier step; the launch's own refusals; nothing created."""

# The fixture imported from run_fixtures is a test parameter here, not a redefinition:
# ruff: noqa: F811

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from costs import services
from costs.models import Price, Usage
from runs.models import Run
from tests.conftest import api_client_for
from tests.run_fixtures import lab, make_run  # noqa: F401

STEP_SECONDS = 30  # between an earlier run's learner steps


def recorded_run(
    lab,
    *,
    batch: int,
    group: int,
    device: list[float],
    cpu: float = 0.0,
    ends: list[float] | None = None,
    warm_ups: dict[int, tuple[str, ...]] | None = None,
) -> Run:
    """An earlier run of the lab's tier whose step s used device[s] seconds (learner and rollout
    halves), `cpu` sandbox seconds, and ended STEP_SECONDS after the one before (the first
    STEP_SECONDS after the run started), or ends[s] seconds after the run started. `warm_ups`: the
    kinds (learner, rollout) whose worker recorded a step as its process's first work."""
    run = make_run(lab, hyperparameters={"batch_size": batch, "group_size": group})
    start = timezone.now() - timedelta(hours=1)
    ends = ends or [STEP_SECONDS * step for step in range(1, len(device) + 1)]
    Run.objects.filter(pk=run.pk).update(learner_step=len(device), started_at=start)
    for step, seconds in enumerate(device, start=1):
        for kind in ("learner", "rollout"):
            services.usage_record(
                run_id=run.pk,
                step=step,
                component=kind if kind == "learner" else "rollout:0",
                kind=kind,
                device_seconds=seconds / 2,
                cpu_seconds=cpu / 2,
                device_class="cpu",
                warm_up=kind in (warm_ups or {}).get(step, ()),
            )
        Usage.objects.filter(run=run, step=step).update(
            first_recorded_at=start + timedelta(seconds=ends[step - 1])
        )
    return run


def estimate(lab, who: str = "owner", **changes):
    body = lab["launch"] | {"hyperparameters": {"batch_size": 8, "group_size": 4}, "max_steps": 10} | changes
    return api_client_for(lab[who]).post("/api/v1/runs/estimate", body, format="json")


def test_the_estimate_scales_the_earlier_steps_per_unit_of_work_to_the_new_runs_size(lab):
    Price.objects.create(unit=Price.Unit.DEVICE_HOUR, scope="", amount=Decimal("3.6"))
    Price.objects.create(unit=Price.Unit.CPU_HOUR, scope="", amount=Decimal("0.36"))
    earlier = recorded_run(lab, batch=4, group=2, device=[8.0] * 5, cpu=2.0)  # 8 units a step
    runs_before = Run.objects.count()

    answer = estimate(lab)  # 8 × 4 = 32 units a step, 10 steps: 320 units at 1 device-second each
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["steps"], body["work_per_step"]) == (10, 32)
    assert body["basis"] == {"runs": [earlier.pk], "steps": 5, "device_class": "cpu"}
    hours = 320 / 3600  # figures are kept to the millionth
    assert body["device_hours"] == pytest.approx({"low": hours, "expected": hours, "high": hours}, abs=1e-6)
    assert body["sandbox_cpu_hours"]["expected"] == pytest.approx(320 * 0.25 / 3600, abs=1e-6)
    # Wall: 30 s to the first step's end, then 30 s a step of 8 units: 9 more steps of 32 units.
    assert body["wall_seconds"]["expected"] == pytest.approx(30 + 9 * 32 * 30 / 8)
    money = Decimal("3.6") * Decimal(320) / 3600 + Decimal("0.36") * Decimal(80) / 3600
    assert Decimal(body["money"]["expected"]) == money.quantize(Decimal("0.000001"))
    assert Run.objects.count() == runs_before  # an estimate launches nothing


def test_the_range_is_what_the_steady_steps_spread_over_and_the_start_counts_once(lab):
    # A first step of 30 s (loading), then steps of 2 units that took 2, 4, … 22 s: 1 … 11
    # device-seconds a unit; the start cost 30 - 12 (the median steady step) = 18 s once.
    recorded_run(lab, batch=1, group=2, device=[30.0] + [2.0 * s for s in range(1, 12)])
    body = estimate(lab, hyperparameters={"batch_size": 1, "group_size": 2}, max_steps=3600).json()
    device = body["device_hours"]  # 2 units a step over 3,600 steps: hours = 2 × seconds a unit
    start = 18 / 3600
    assert device["expected"] == pytest.approx(12.0 + start, abs=1e-5)  # the median, 6 s a unit
    assert device["low"] == pytest.approx(4.0 + start, abs=1e-5)  # the 10th percentile, 2 s
    assert device["high"] == pytest.approx(20.0 + start, abs=1e-5)  # the 90th, 10 s
    assert body["basis"]["steps"] == 12


def test_a_workers_warm_up_is_left_out_of_the_steady_rates_and_of_the_start(lab):
    # The first run on fresh workers: its first step's rollouts were a worker's first batch (40 s
    # of device, 300 s to the step's end), and a learner restarted before step 4 (its first step
    # in a new process, 900 s after step 3). Steps 2, 3 and 5 are steady: 8 device-seconds and
    # 30 s each, for 8 units of work.
    cold = recorded_run(
        lab,
        batch=4,
        group=2,
        device=[40.0, 8.0, 8.0, 60.0, 8.0],
        ends=[300, 330, 360, 1260, 1290],
        warm_ups={1: ("learner", "rollout"), 4: ("learner",)},
    )
    body = estimate(lab).json()  # 32 units a step, 10 steps
    assert body["basis"] == {"runs": [cold.pk], "steps": 5, "device_class": "cpu"}
    # Device: 1 second a unit over 320 units, and the start's learner extra (20 - 4 s) once; the
    # rollouts' extra (20 - 4 s) was the worker's warm-up, not the run's.
    assert body["device_hours"]["expected"] == pytest.approx((320 + 16) / 3600, abs=1e-6)
    # Wall: no start on warm workers to go by, so 10 steady steps of 32 units at 30 s per 8.
    assert body["wall_seconds"] == pytest.approx(dict.fromkeys(("low", "expected", "high"), 10 * 32 * 30 / 8))
    assert "their starts were on workers just started" in body["why"]

    # A later run started on warm workers: 60 s to its first step's end, its start the basis.
    warm = recorded_run(
        lab, batch=4, group=2, device=[8.0] * 3, ends=[60, 90, 120], warm_ups={1: ("learner",)}
    )
    body = estimate(lab).json()
    assert body["basis"]["runs"] == [warm.pk, cold.pk]
    assert body["wall_seconds"]["expected"] == pytest.approx(60 + 9 * 32 * 30 / 8)
    assert "workers just started" not in body["why"]


def test_the_steps_of_a_host_still_warming_up_are_left_out_and_the_settled_pace_is_the_basis(lab):
    # The first run on a fresh host: after its start, steps 2-5 keep speeding up (24, 20, 16, 12
    # device-seconds) before they settle at 8 for 8 units; its later half's median is 8, and a
    # step more than 1.25 × that (10 s) was still warming up. A median over all would say 14.
    recorded_run(lab, batch=4, group=2, device=[8.0, 24.0, 20.0, 16.0, 12.0, 8.0, 8.0])
    body = estimate(lab).json()  # 32 units a step, 10 steps
    assert body["basis"]["steps"] == 7
    assert body["device_hours"] == pytest.approx(
        dict.fromkeys(("low", "expected", "high"), 320 / 3600), abs=1e-6
    )
    # Steady steps that merely vary (no slow lead) are all kept: the range test above.


def test_without_an_earlier_step_of_the_tier_and_method_there_is_no_basis_and_it_says_why(lab):
    make_run(lab)  # queued: it has recorded nothing
    body = estimate(lab).json()
    assert body["basis"] is None and "device_hours" not in body
    assert body["why"].startswith(
        f"no run of tier {lab['tier'].name} with method grpo has recorded two steps yet"
    )


def test_an_estimate_refuses_what_a_launch_would_naming_the_field_and_outsiders_get_404(lab, team):
    refused = estimate(lab, hyperparameters={"group_size": "many"})
    assert refused.status_code == 400
    assert "hyperparameters.group_size" in refused.content.decode()
    assert estimate(lab, who="viewer").status_code == 200  # reading a project is enough
    outsider = api_client_for(team["outsider"]).post("/api/v1/runs/estimate", lab["launch"], format="json")
    assert outsider.status_code == 404


def test_calibrate_launches_a_short_run_of_the_same_shape_once_and_the_estimate_then_rests_on_it(
    lab, settings
):
    settings.FLYWHEEL_CALIBRATION_STEPS = 3
    hyperparameters = {"batch_size": 8, "group_size": 4, "learning_rate": 0.0002}
    refused = estimate(lab, who="viewer", calibrate=True, hyperparameters=hyperparameters)
    assert refused.status_code in (403, 404) and not Run.objects.filter(calibration=True).exists()

    answer = estimate(lab, calibrate=True, hyperparameters=hyperparameters, budget_money="1.00")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    run = Run.objects.get(calibration=True)
    assert (run.tier, run.method, run.max_steps, run.status) == (lab["tier"], "grpo", 3, "queued")
    assert (run.task_set_version, run.created_by) == (lab["version"], lab["owner"])
    assert run.hyperparameters == hyperparameters | {"eval_every": 100_000, "eval_items": 1}
    assert (run.resolved["batch_size"], run.resolved["group_size"], run.resolved["learning_rate"]) == (
        8,
        4,
        0.0002,
    )
    assert (run.budget_money, run.budget_device_hours, run.name) == (
        None,
        None,
        f"calibration: {lab['tier'].name} (grpo)",
    )
    assert body["basis"] is None
    assert body["calibration"] == {
        "run": run.pk,
        "status": "queued",
        "learner_step": 0,
        "max_steps": 3,
        "launched": True,
    }
    assert body["why"] == (
        f"calibration run {run.pk} of tier {lab['tier'].name} (grpo) is queued, at step 0 of 3: the "
        "estimate rests on it once it has recorded two steps"
    )
    again = estimate(lab, calibrate=True, hyperparameters=hyperparameters).json()
    assert again["calibration"]["launched"] is False and Run.objects.filter(calibration=True).count() == 1
    assert api_client_for(lab["owner"]).get(f"/api/v1/runs/{run.pk}").json()["calibration"] is True

    # Its steps recorded (a fresh worker's first batch at step 1; then 30 s a step of 32 units):
    start = timezone.now() - timedelta(minutes=5)
    Run.objects.filter(pk=run.pk).update(status="succeeded", learner_step=3, started_at=start)
    for step in (1, 2, 3):
        for kind in ("learner", "rollout"):
            services.usage_record(
                run_id=run.pk,
                step=step,
                component=kind if kind == "learner" else "rollout:0",
                kind=kind,
                device_seconds=16.0,
                device_class="cpu",
                warm_up=step == 1,
            )
        Usage.objects.filter(run=run, step=step).update(
            first_recorded_at=start + timedelta(seconds=30 * step)
        )
    body = estimate(lab, hyperparameters=hyperparameters).json()  # 32 units a step, 10 steps
    assert body["basis"] == {"runs": [run.pk], "steps": 3, "device_class": "cpu"}
    assert body["calibration"]["status"] == "succeeded"
    assert body["device_hours"]["expected"] == pytest.approx(10 * 32 / 3600, abs=1e-6)
    assert body["wall_seconds"]["expected"] == pytest.approx(10 * 30)

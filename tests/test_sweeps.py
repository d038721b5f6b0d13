"""Sweeps: the driver over runs made through the real run services, their held-out figures
written directly as the evaluation workers write them (no training here): the grid covered
exactly, losers stopped early by the median and by ASHA, the budget and the concurrency limit
kept, a pass repeated after a crash counting nothing twice, and bad input refused by field."""

import itertools
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError

from core.exceptions import StateError
from costs.models import Price, Usage
from runs.models import MetricPoint, Run, RunEvent
from runs.services import metrics_write
from sweeps import driver, selectors, services
from sweeps.models import Sweep, SweepTrial
from tests import run_fixtures
from tests.conftest import api_client_for
from tests.run_fixtures import set_status
from tiers.models import Tier

lab = run_fixtures.lab  # the fixture: a project ready to launch
T = SweepTrial.State
LR = "hyperparameters.learning_rate"
GROUP = "hyperparameters.group_size"


def template_of(lab, **changes):
    launch = lab["launch"]
    return {
        "task_set_version": launch["task_set_version"],
        "reward_rule_version": launch["reward_rule_version"],
        "tier": launch["tier"],
        "hyperparameters": {"group_size": 4, "eval_every": 1},
        "max_steps": 4,
    } | changes


def make_sweep(lab, parameters, **settings) -> Sweep:
    values = {"search_kind": "grid", "concurrency": 2} | settings
    template = values.pop("template", None) or template_of(lab)
    return services.sweep_create(
        project=lab["project"], by=lab["owner"], name="lr", template=template, parameters=parameters, **values
    )


def report(trial: SweepTrial, values: dict[int, float]) -> None:
    """The held-out pass rate at some steps, as the evaluation worker records it."""
    MetricPoint.objects.bulk_create(
        [
            MetricPoint(run_id=trial.run_id, name="heldout/pass_rate", step=s, value=v)
            for s, v in values.items()
        ]
    )


def finish(trial: SweepTrial, values: dict[int, float]) -> None:
    report(trial, values)
    set_status(trial.run, Run.Status.SUCCEEDED)


def trials(sweep: Sweep) -> list[SweepTrial]:
    return list(sweep.trials.select_related("run").order_by("number"))


def test_a_grid_sweep_runs_every_point_once_and_then_finishes(lab):
    sweep = make_sweep(lab, [{"name": LR, "values": [1e-4, 3e-4]}, {"name": GROUP, "values": [2, 4]}])
    assert sweep.max_runs == 4
    first = driver.sweep_advance(sweep_id=sweep.pk)
    assert first.launched == [0, 1]
    for trial in trials(sweep):
        finish(trial, {0: 0.1, 4: 0.5})
    second = driver.sweep_advance(sweep_id=sweep.pk)
    assert (second.settled, second.launched, second.status) == ([0, 1], [2, 3], "running")
    for trial in trials(sweep)[2:]:
        finish(trial, {0: 0.1, 4: 0.6})
    last = driver.sweep_advance(sweep_id=sweep.pk)
    assert (last.launched, last.status) == ([], "finished")
    done = trials(sweep)
    points = sorted((t.params[LR], t.params[GROUP]) for t in done)
    assert points == sorted(itertools.product([1e-4, 3e-4], [2, 4]))
    # Each run is an ordinary run carrying its point in its hyperparameters.
    assert all(
        (t.run.hyperparameters["learning_rate"], t.run.resolved["group_size"])
        == (t.params[LR], t.params[GROUP])
        for t in done
    )
    assert [(t.state, t.value, t.step) for t in done] == [(T.COMPLETE, 0.5, 4)] * 2 + [
        (T.COMPLETE, 0.6, 4)
    ] * 2
    assert Run.objects.filter(project=lab["project"]).count() == 4


def test_no_more_trials_are_active_than_the_concurrency_allows(lab):
    sweep = make_sweep(
        lab, [{"name": LR, "low": 1e-5, "high": 1e-2, "log": True}], search_kind="random", max_runs=5
    )
    assert driver.sweep_advance(sweep_id=sweep.pk).launched == [0, 1]
    assert driver.sweep_advance(sweep_id=sweep.pk).launched == []
    first = trials(sweep)[0]
    finish(first, {4: 0.3})
    assert driver.sweep_advance(sweep_id=sweep.pk).launched == [2]
    assert SweepTrial.objects.filter(sweep=sweep, state=T.RUNNING).count() == 2
    rates = [t.params[LR] for t in trials(sweep)]
    assert len(set(rates)) == 3 and all(1e-5 <= rate <= 1e-2 for rate in rates)


def test_a_trial_below_the_median_of_finished_ones_is_stopped_early_and_says_why(lab):
    sweep = make_sweep(
        lab, [{"name": LR, "values": [1e-4, 2e-4, 3e-4]}], concurrency=3, early_stopping="median", min_steps=1
    )
    driver.sweep_advance(sweep_id=sweep.pk)
    done, losing, winning = trials(sweep)
    finish(done, {0: 0.1, 1: 0.6, 2: 0.8})
    report(losing, {0: 0.1, 1: 0.2})
    report(winning, {0: 0.1, 1: 0.7})
    result = driver.sweep_advance(sweep_id=sweep.pk)
    assert (result.settled, result.pruned) == ([0], [1])
    losing.refresh_from_db()
    losing.run.refresh_from_db()
    why = f"stopped early by sweep {sweep.pk}: heldout/pass_rate 0.2 at step 1 is below the median 0.6"
    assert (losing.state, losing.stopped_early, losing.value, losing.step) == (T.PRUNED, True, 0.2, 1)
    assert losing.why.startswith(why)
    assert losing.run.status == Run.Status.CANCELLED
    assert RunEvent.objects.filter(run=losing.run, kind="sweep", message=losing.why).exists()
    assert SweepTrial.objects.get(pk=winning.pk).state == T.RUNNING


def test_asha_stops_the_trials_outside_the_top_of_their_rung_and_keeps_its_rungs(lab):
    sweep = make_sweep(
        lab,
        [{"name": LR, "values": [1e-4, 2e-4, 3e-4, 4e-4]}],
        concurrency=4,
        early_stopping="asha",
        min_steps=1,
        reduction_factor=2,
    )
    driver.sweep_advance(sweep_id=sweep.pk)
    for trial, value in zip(trials(sweep), (0.9, 0.1, 0.5, 0.95), strict=True):
        report(trial, {0: 0.0, 1: value})
    assert driver.sweep_advance(sweep_id=sweep.pk).pruned == [1, 2]
    after = trials(sweep)
    assert [t.state for t in after] == [T.RUNNING, T.PRUNED, T.PRUNED, T.RUNNING]
    assert after[0].system_attrs["completed_rung_0"] == 0.9
    assert "ASHA rung 0 (step 1)" in after[1].why and "the cut is 0.9" in after[1].why
    # A fresh pass (another process, or one after a crash) finds the rungs recorded: it stops no one
    # again, and a pruned run that ends cancelled stays pruned, not failed.
    again = driver.sweep_advance(sweep_id=sweep.pk)
    assert (again.pruned, again.settled, again.launched) == ([], [], [])
    assert [t.state for t in trials(sweep)] == [T.RUNNING, T.PRUNED, T.PRUNED, T.RUNNING]
    assert sum(t.stopped_early for t in trials(sweep)) == 2


def test_asha_compares_each_rung_at_its_own_step_when_a_pass_comes_after_several_figures(lab):
    # Found by `make bench-sweep`: a pass that came after two evaluations put the newest figure
    # in every rung it crossed, so trials were compared at different steps.
    sweep = make_sweep(
        lab,
        [{"name": LR, "values": [1e-4, 2e-4]}],
        concurrency=2,
        early_stopping="asha",
        min_steps=1,
        reduction_factor=2,
    )
    driver.sweep_advance(sweep_id=sweep.pk)
    first, second = trials(sweep)
    report(first, {0: 0.0, 1: 0.5, 2: 0.9})
    report(second, {0: 0.0, 1: 0.6, 2: 0.3})  # first at step 1, behind at step 2
    assert driver.sweep_advance(sweep_id=sweep.pk).pruned == [second.number]
    first, second = trials(sweep)
    assert first.system_attrs["completed_rung_0"] == 0.5  # its step-1 figure, not step 2's 0.9
    assert first.system_attrs["completed_rung_1"] == 0.9
    assert (second.system_attrs["completed_rung_0"], second.system_attrs["completed_rung_1"]) == (0.6, 0.3)
    assert second.why.startswith(
        f"stopped early by sweep {sweep.pk}: heldout/pass_rate 0.3 at step 2 is below the top 1/2 "
        "of the 2 trial(s) at ASHA rung 1 (step 2): the cut is 0.9"
    )
    assert (second.state, second.step, second.value) == (T.PRUNED, 2, 0.3)
    # Settling a trial records the rungs no pass saw at their own steps too.
    third = make_sweep(
        lab,
        [{"name": LR, "values": [1e-4]}],
        concurrency=1,
        early_stopping="asha",
        min_steps=1,
        reduction_factor=2,
    )
    driver.sweep_advance(sweep_id=third.pk)
    finish(trials(third)[0], {0: 0.0, 1: 0.2, 2: 0.4, 4: 0.7})
    driver.sweep_advance(sweep_id=third.pk)
    attrs = trials(third)[0].system_attrs
    assert [attrs[f"completed_rung_{rung}"] for rung in range(3)] == [0.2, 0.4, 0.7]


def test_the_budget_stops_launching_and_ends_the_sweep_as_budget_exhausted(lab):
    Price.objects.create(unit=Price.Unit.DEVICE_HOUR, scope="", amount=Decimal(10))
    sweep = make_sweep(
        lab, [{"name": LR, "values": [1e-4, 2e-4, 3e-4]}], concurrency=1, max_money=Decimal("1.00")
    )
    assert driver.sweep_advance(sweep_id=sweep.pk).launched == [0]
    first = trials(sweep)[0]
    # 0.06 device-hours at 10 an hour: 0.60 spent, and the next run is expected to cost as much.
    Usage.objects.create(
        run=first.run, project=lab["project"], step=1, component="learner", kind="learner", device_seconds=216
    )
    finish(first, {4: 0.5})
    result = driver.sweep_advance(sweep_id=sweep.pk)
    sweep.refresh_from_db()
    assert (result.launched, sweep.status) == ([], Sweep.Status.BUDGET_EXHAUSTED)
    assert sweep.reason.startswith("the budget of 1.00 would be passed: 0.60 spent or committed")
    assert SweepTrial.objects.filter(sweep=sweep).count() == 1
    summary = selectors.sweep_summary(sweep=sweep)
    assert summary["spent"]["money"] == Decimal("0.600000")
    assert summary["trials"][0]["money"] == Decimal("0.600000")


def test_a_pass_that_crashes_midway_leaves_nothing_and_the_next_one_launches_once(lab, monkeypatch):
    sweep = make_sweep(lab, [{"name": LR, "low": 1e-5, "high": 1e-2}], search_kind="tpe", max_runs=4)
    real_create = SweepTrial.objects.create
    calls = []

    def crash_on_second(**fields):
        calls.append(fields["number"])
        if len(calls) == 2:
            raise RuntimeError("the worker died")
        return real_create(**fields)

    monkeypatch.setattr(SweepTrial.objects, "create", crash_on_second)
    with pytest.raises(RuntimeError):
        driver.sweep_advance(sweep_id=sweep.pk)
    assert (SweepTrial.objects.count(), Run.objects.filter(project=lab["project"]).count()) == (0, 0)
    monkeypatch.undo()
    result = driver.sweep_advance(sweep_id=sweep.pk)
    assert result.launched == [0, 1]
    again = driver.sweep_advance(sweep_id=sweep.pk)
    assert again.launched == []
    assert Run.objects.filter(project=lab["project"]).count() == 2
    # The seed makes the search repeatable: the crashed pass had proposed the same first point.
    assert trials(sweep)[0].params == {LR: pytest.approx(trials(sweep)[0].params[LR])}


def test_a_sweep_across_base_models_reports_each_models_lift_and_cost(lab, tmp_path):
    Price.objects.create(unit=Price.Unit.DEVICE_HOUR, scope="", amount=Decimal(1))
    models = [lab["tier"].base_model, str(tmp_path / "small"), str(tmp_path / "wide")]
    for path in models[1:]:
        (tmp_path / path).mkdir()
    sweep = make_sweep(lab, [{"name": "base_model", "values": models}], concurrency=3)
    assert sorted(sweep.base_model_tiers) == sorted(models)
    made = Tier.objects.get(pk=sweep.base_model_tiers[models[1]])
    assert (made.name, made.base_model, made.temperature) == (
        "cap @ small",
        models[1],
        lab["tier"].temperature,
    )
    driver.sweep_advance(sweep_id=sweep.pk)
    figures = dict(zip(models, [(0.1, 0.5, 3600), (0.2, 0.3, 7200), (0.0, 0.6, 1800)], strict=True))
    for trial in trials(sweep):
        start, end, seconds = figures[trial.params["base_model"]]
        assert trial.run.tier_config["base_model"] == trial.params["base_model"]
        Usage.objects.create(
            run=trial.run,
            project=lab["project"],
            step=1,
            component="learner",
            kind="learner",
            device_seconds=seconds,
        )
        finish(trial, {0: start, 4: end})
    assert driver.sweep_advance(sweep_id=sweep.pk).status == "finished"
    table = selectors.sweep_summary(sweep=sweep)["base_models"]
    assert [(r["base_model"], r["lift"], r["money"], r["device_hours"]) for r in table] == [
        (models[2], pytest.approx(0.6), Decimal("0.500000"), 0.5),
        (models[0], pytest.approx(0.4), Decimal("1.000000"), 1.0),
        (models[1], pytest.approx(0.1), Decimal("2.000000"), 2.0),
    ]


def test_cancelling_a_sweep_cancels_its_active_runs_once(lab):
    sweep = make_sweep(lab, [{"name": LR, "values": [1e-4, 2e-4, 3e-4]}])
    driver.sweep_advance(sweep_id=sweep.pk)
    services.sweep_cancel(sweep=sweep)
    assert {t.run.status for t in trials(sweep)} == {Run.Status.CANCELLED}
    with pytest.raises(StateError, match="only a running sweep"):
        services.sweep_cancel(sweep=sweep)
    result = driver.sweep_advance(sweep_id=sweep.pk)
    assert (result.launched, result.settled, result.status) == ([], [0, 1], "cancelled")
    assert [t.why for t in trials(sweep)] == ["its run was cancelled"] * 2


@pytest.mark.parametrize(
    ("parameters", "options", "expected"),
    [
        ([{"name": LR, "values": [1e-4, 5.0]}], {}, {"parameters.0.values": "5.0 must be at most 1"}),
        (
            [{"name": LR, "values": [1e-4]}, {"name": "hyperparameters.nope", "values": [1]}],
            {},
            {"parameters.1.name": "nope is not a hyperparameter of grpo"},
        ),
        ([{"name": LR, "low": 1e-4, "high": 1e-3}], {}, {"parameters.0": "a grid search takes a list"}),
        ([{"name": "tier", "values": [999999]}], {}, {"parameters.0.values": "no tier 999999 in project"}),
        (
            [{"name": LR, "values": [1e-4]}],
            {"metric": "reward/mean"},
            {"metric": "must be a held-out figure"},
        ),
        (
            [{"name": LR, "values": [1e-4]}],
            {"search_kind": "random", "early_stopping": "asha", "reduction_factor": 1},
            {"reduction_factor": "must be at least 2"},
        ),
        ([], {}, {"parameters": "must be a non-empty list"}),
    ],
)
def test_bad_parameters_are_refused_by_field_path_and_nothing_is_written(lab, parameters, options, expected):
    tiers = Tier.objects.count()
    with pytest.raises(ValidationError) as refused:
        make_sweep(lab, parameters, **options)
    problems = {key: " ".join(messages) for key, messages in refused.value.message_dict.items()}
    assert sorted(problems) == sorted(expected)
    assert all(expected[key] in problems[key] for key in expected)
    assert (Sweep.objects.count(), Tier.objects.count()) == (0, tiers)


def test_a_template_that_would_fail_is_refused_by_its_field(lab):
    template = template_of(lab, tier=None, max_steps=0)
    with pytest.raises(ValidationError) as refused:
        make_sweep(lab, [{"name": LR, "values": [1e-4]}], template=template)
    assert refused.value.message_dict == {"template.tier": ["is required"]}
    with pytest.raises(ValidationError) as refused:
        make_sweep(lab, [{"name": LR, "values": [1e-4]}], template=template_of(lab, max_steps=0))
    assert refused.value.message_dict == {"template.max_steps": ["must be at least 1"]}
    assert Sweep.objects.count() == 0


@pytest.mark.parametrize("template", ["null", [1], 7])
def test_a_template_that_is_not_an_object_is_named_with_the_other_problems(lab, template):
    with pytest.raises(ValidationError) as refused:
        make_sweep(lab, "null", template=template)
    assert refused.value.message_dict == {
        "template": ["must be an object of run fields"],
        "parameters": ["must be a non-empty list of {name, values} or {name, low, high}"],
    }
    assert Sweep.objects.count() == 0


def test_a_form_encoded_sweep_with_null_fields_is_refused_by_field(lab):
    """Schemathesis' case: a form body whose template and parameters are the text "null"."""
    client = api_client_for(lab["owner"])
    form = {"name": "0", "template": "null", "parameters": "null", "search": "tpe", "max_money": ""}
    refused = client.post(f"/api/v1/projects/{lab['project'].pk}/sweeps", form)
    assert refused.status_code == 400
    assert {d["param"] for d in refused.json()["error"]["details"]} >= {"template", "parameters"}
    assert Sweep.objects.count() == 0


def test_a_held_out_figure_of_a_trial_advances_its_sweep_and_a_training_step_does_not(
    lab, django_capture_on_commit_callbacks
):
    sweep = make_sweep(lab, [{"name": LR, "values": [1e-4]}])
    driver.sweep_advance(sweep_id=sweep.pk)
    run = trials(sweep)[0].run
    with django_capture_on_commit_callbacks() as training:
        metrics_write(run, 1, {"reward/mean": 0.5})
    with django_capture_on_commit_callbacks() as held_out:
        metrics_write(run, 1, {"heldout/pass_rate": 0.5})
    assert len(held_out) == len(training) + 1  # the pass, beside what every write sends


# --- REST and the page -------------------------------------------------------------------------


def test_rest_creates_reads_and_cancels_a_sweep_and_names_a_bad_value_by_its_path(lab):
    client = api_client_for(lab["owner"])
    url = f"/api/v1/projects/{lab['project'].pk}/sweeps"
    body = {
        "name": "lr",
        "template": template_of(lab),
        "parameters": [{"name": LR, "values": [1e-4, 3e-4]}, {"name": GROUP, "values": [2, 1]}],
        "search": "grid",
    }
    refused = client.post(url, body, format="json")
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert [d["param"] for d in error["details"]] == ["parameters.1.values"]
    assert Sweep.objects.count() == 0
    body["parameters"][1]["values"] = [2, 4]
    created = client.post(url, body, format="json")
    assert created.status_code == 201
    sweep_id = created.json()["sweep"]["id"]
    driver.sweep_advance(sweep_id=sweep_id)
    detail = client.get(f"{url}/{sweep_id}").json()
    assert (detail["sweep"]["status"], len(detail["trials"]), detail["best"]) == ("running", 2, None)
    assert client.get(url).json()["results"][0]["id"] == sweep_id
    assert client.post(f"{url}/{sweep_id}/cancel").json()["sweep"]["status"] == "cancelled"
    assert client.post(f"{url}/{sweep_id}/cancel").status_code == 409


def test_the_sweep_page_shows_trials_best_run_chart_and_base_model_lift(lab, tmp_path, client):
    other = tmp_path / "other"
    other.mkdir()
    sweep = make_sweep(lab, [{"name": "base_model", "values": [lab["tier"].base_model, str(other)]}])
    driver.sweep_advance(sweep_id=sweep.pk)
    by_model = {lab["tier"].base_model: (0.1, 0.5), str(other): (0.2, 0.3)}
    for trial in trials(sweep):
        start, end = by_model[trial.params["base_model"]]
        finish(trial, {0: start, 4: end})
    driver.sweep_advance(sweep_id=sweep.pk)
    client.force_login(lab["owner"])
    page = client.get(f"/sweeps/{sweep.pk}/").content.decode()
    best = next(t for t in trials(sweep) if t.value == 0.5)
    assert 'id="trial-table"' in page and page.count("data-trial=") == 2
    link = f'href="/runs/{best.run_id}/">{best.run.name}</a>'
    assert f"{link}: heldout/pass_rate <strong>0.500</strong>" in page
    assert 'id="base-model-table"' in page and "0.400" in page and "0.100" in page
    assert '"label": "heldout/pass_rate"' in page  # the chart's data
    project_page = client.get(f"/projects/{lab['project'].pk}/").content.decode()
    assert f'href="/projects/{lab["project"].pk}/sweeps/"' in project_page

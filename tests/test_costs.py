"""Costs: usage recorded once per (run, step, component) however often a step is recorded, money
from units times the prices in force when they were recorded, budgets that pause a run or refuse
a launch, and who may read and change them."""

# The fixture imported from run_fixtures is a test parameter here, not a redefinition:
# ruff: noqa: F811

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from unittest import mock

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.db.models import Sum
from django.urls import reverse
from django.utils import timezone

from costs import selectors, services
from costs.models import Price, Usage
from inference.policy import policy_load
from projects import services as project_services
from rewards.services import reward_rule_create
from runs import lifecycle
from runs.lifecycle import RunRequest
from runs.models import Checkpoint, MetricPoint, RolloutBatch, Run, RunEvent, Trajectory
from runs.run_store import policy_publish
from runs.services import metrics_write
from tests.conftest import api_client_for, make_project, make_user
from tests.cost_checks import assert_billed_once, sampled_tokens_of_done_batches
from tests.run_fixtures import lab, make_run, set_status  # noqa: F401
from tests.run_harness import (
    Host,
    demo_project,
    hosts_killed,
    run_body,
    tiny_model,  # noqa: F401
    wait_for_terminal,
    wait_until,
    worker_env,
)
from tests.test_learner_processes import SIMILARITY
from tests.test_runs_pages import launch_form
from tiers import services as tier_services
from webhooks import services as webhook_services
from webhooks.models import WebhookDelivery
from workers.run_rollout import rollout_batch_run
from workers.usage import rollout_component

S = Run.Status
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def record(run: Run, step: int = 1, component: str = "learner", kind: str = "learner", **units) -> Usage:
    return services.usage_record(run_id=run.pk, step=step, component=component, kind=kind, **units)


def this_device() -> str:
    """The device class the workers here record: the GPU's name where there is one, else cpu."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def problems(response) -> dict[str, str]:
    return {detail["param"]: detail["message"] for detail in response.json()["error"]["details"]}


def test_a_step_recorded_twice_is_billed_once_and_says_so(lab):
    run = make_run(lab)
    record(run, device_class="cpu", device_seconds=10.0, tokens_trained=40)
    again = record(run, device_class="cpu", device_seconds=12.5, tokens_trained=48)
    assert Usage.objects.filter(run=run).count() == 1
    assert (again.recordings, again.device_seconds, again.tokens_trained, again.rerecorded) == (
        2,
        12.5,
        48,
        True,
    )
    cost = selectors.run_cost(run=run)
    assert cost["units"]["device_seconds"] == 12.5
    assert cost["rerecorded"] == 1


def test_units_are_refused_when_unknown_or_negative(lab):
    run = make_run(lab)
    with pytest.raises(ValueError, match="unknown usage units: gpu_minutes"):
        record(run, gpu_minutes=3)
    with pytest.raises(ValueError, match="cannot be negative: tokens_sampled"):
        record(run, tokens_sampled=-1)
    assert not Usage.objects.filter(run=run).exists()


def test_money_is_units_times_the_prices_in_force_when_they_were_recorded(lab):
    run = make_run(lab)
    services.price_set(unit="device_hour", scope="cpu", amount=Decimal("2.00"), effective_from=EPOCH)
    services.price_set(unit="device_hour", amount=Decimal("9.00"), effective_from=EPOCH)  # other classes
    services.price_set(unit="cpu_hour", amount=Decimal("0.36"), effective_from=EPOCH)
    services.price_set(unit="engine_mtok_in", scope="remote", amount=Decimal("1.5"), effective_from=EPOCH)
    services.price_set(unit="engine_mtok_out", scope="remote", amount=Decimal("6"), effective_from=EPOCH)
    services.price_set(unit="gb_month", amount=Decimal("0.02"), effective_from=EPOCH)
    record(run, step=1, device_class="cpu", device_seconds=1800.0)  # half an hour at 2.00
    record(run, step=1, component="rollout:a", kind="rollout", device_class="H100", device_seconds=360.0)
    record(run, step=1, component="rollout:b", kind="rollout", cpu_seconds=100.0)
    record(
        run,
        step=2,
        component="rollout:c",
        kind="rollout",
        engine="remote",
        engine_tokens_in=2_000_000,
        engine_tokens_out=500_000,
    )
    record(run, step=2, component="checkpoint", kind="storage", storage_bytes=3_000_000_000)

    cost = selectors.run_cost(run=run)
    assert cost["money"] == {
        "device_hour": "1.900000",  # 0.5 h x 2.00 + 0.1 h x 9.00
        "cpu_hour": "0.010000",  # 100 s / 3600 x 0.36
        "engine_mtok_in": "3.000000",
        "engine_mtok_out": "3.000000",
        "gb_month": "0.060000",  # 3 GB x 0.02, its first month
    }
    assert cost["total"] == "7.970000"
    assert [(s["step"], s["total"]) for s in cost["steps"]] == [(1, "1.910000"), (2, "6.060000")]
    assert cost["by_kind"]["learner"]["total"] == "1.000000"

    # A new price applies to units recorded from then on; what was recorded keeps its price.
    services.price_set(unit="device_hour", scope="cpu", amount=Decimal("100"))
    assert selectors.run_cost(run=run)["total"] == "7.970000"
    record(run, step=3, device_class="cpu", device_seconds=36.0)
    assert selectors.run_cost(run=run)["total"] == "8.970000"
    assert Usage.objects.get(run=run, step=1, component="learner").device_seconds == 1800.0


def test_storage_is_billed_for_each_month_begun(lab):
    run = make_run(lab)
    services.price_set(unit="gb_month", amount=Decimal("0.5"), effective_from=EPOCH)
    row = record(run, component="checkpoint", kind="storage", storage_bytes=2_000_000_000)
    later = row.first_recorded_at + timedelta(days=45)
    assert selectors.run_cost(run=run, now=later)["total"] == "2.000000"  # 2 GB x 0.5 x 2 months


def test_a_price_needs_a_known_unit_and_no_negative_amount():
    with pytest.raises(Exception) as refused:
        services.price_set(unit="gpu_day", amount=Decimal("-1"), scope="x")
    assert refused.value.message_dict == {
        "unit": [
            "unknown unit 'gpu_day'; use device_hour, cpu_hour, engine_mtok_in, engine_mtok_out, gb_month"
        ],
        "amount": ["must be 0 or more"],
    }


def test_a_run_at_its_budget_pauses_with_an_event_and_a_webhook(lab):
    run = make_run(lab, budget_device_hours=0.01)  # 36 device-seconds
    run = set_status(run, S.RUNNING)
    webhook = webhook_services.webhook_create(
        project=lab["project"], by=lab["owner"], url="https://hooks.example.com/x", events=["run.budget"]
    )
    record(run, step=1, device_class="cpu", device_seconds=20.0)
    assert services.run_budget_check(run=run, step=1) is None
    assert Run.objects.get(pk=run.pk).status == S.RUNNING

    record(run, step=2, device_class="cpu", device_seconds=20.0)
    reached = services.run_budget_check(run=run, step=2)
    assert reached == {"kind": "device_hours", "budget": 0.01, "spent": 40.0 / 3600, "step": 2}
    assert Run.objects.get(pk=run.pk).status == S.PAUSING
    event = RunEvent.objects.get(run=run, kind="budget")
    assert event.message == "budget reached at step 2: spent 0.01111 of 0.01 device-hours"
    delivery = WebhookDelivery.objects.get(webhook=webhook)
    assert delivery.type == "run.budget"
    assert delivery.payload["data"]["budget"] == reached


def test_a_money_budget_counts_every_price_unit(lab, settings):
    run = set_status(make_run(lab, budget_money=Decimal("1.00")), S.RUNNING)
    services.price_set(unit="cpu_hour", amount=Decimal("36"), effective_from=EPOCH)  # 0.01 a second
    record(run, step=1, component="rollout:a", kind="rollout", cpu_seconds=99.0)
    assert services.run_budget_check(run=run, step=1) is None
    record(run, step=2, component="rollout:a", kind="rollout", cpu_seconds=100.0)
    assert services.run_budget_check(run=run, step=2) == {
        "kind": "money",
        "budget": "1.00",
        "spent": "1.990000",
        "step": 2,
    }


def test_a_project_past_its_monthly_budget_refuses_new_runs(lab):
    first = make_run(lab)
    services.price_set(unit="device_hour", amount=Decimal("10"), effective_from=EPOCH)
    services.project_budget_set(project=lab["project"], monthly=Decimal("5"))
    record(first, device_class="cpu", device_seconds=1800.0)  # 5.00: the whole budget
    client = api_client_for(lab["owner"])
    response = client.post("/api/v1/runs", lab["launch"], format="json")
    assert response.status_code == 400
    assert problems(response) == {
        "project": "project alpha has spent 5.00 of its monthly budget of 5.00 this month; an owner "
        "can raise the budget to launch more runs"
    }
    assert Run.objects.filter(project=lab["project"]).count() == 1

    assert client.patch(
        f"/api/v1/projects/{lab['project'].pk}/budget", {"monthly": "6"}, format="json"
    ).json() == {
        "monthly": "6.00",
        "spent_this_month": "5.000000",
    }
    assert client.post("/api/v1/runs", lab["launch"], format="json").status_code == 201


def test_the_run_cost_endpoint_shows_units_by_kind_and_step(lab):
    run = make_run(lab)
    record(run, step=1, component="rollout:a", kind="rollout", tokens_prefilled=30, tokens_sampled=12)
    record(run, step=1, tokens_trained=12, device_seconds=2.0, device_class="cpu")
    body = api_client_for(lab["viewer"]).get(f"/api/v1/runs/{run.pk}/cost").json()
    assert body["units"]["tokens_sampled"] == 12
    assert body["by_kind"]["rollout"]["units"]["tokens_prefilled"] == 30
    assert body["by_kind"]["learner"]["units"]["tokens_trained"] == 12
    assert body["steps"][0]["step"] == 1 and body["steps"][0]["device_seconds"] == 2.0
    assert body["currency"] == "USD"
    assert body["budget"] == {"money": None, "device_hours": None}


def test_project_costs_are_split_per_run_and_per_user_over_a_period(lab):
    mine = make_run(lab, name="mine")
    theirs = lifecycle_run_by(lab, lab["launcher"], "theirs")
    services.price_set(unit="device_hour", amount=Decimal("3.6"), effective_from=EPOCH)  # 0.001 a second
    record(mine, device_seconds=1000.0)
    record(theirs, device_seconds=500.0)
    Usage.objects.filter(run=theirs).update(recorded_at=timezone.now() - timedelta(days=2))
    client = api_client_for(lab["viewer"])
    url = f"/api/v1/projects/{lab['project'].pk}/costs"
    body = client.get(url).json()
    assert body["total"] == "1.500000"
    assert [(r["name"], r["total"]) for r in body["runs"]] == [("mine", "1.000000"), ("theirs", "0.500000")]
    assert [(u["username"], u["total"]) for u in body["users"]] == [
        ("launcher", "0.500000"),
        ("owner", "1.000000"),
    ]
    since = (timezone.now() - timedelta(days=1)).isoformat()
    assert client.get(url, {"since": since}).json()["total"] == "1.000000"
    refused = client.get(url, {"since": since, "until": since})
    assert refused.status_code == 400
    assert problems(refused) == {"until": "must be after since"}
    # A period far in the past is echoed as RFC 3339 (a four-digit year), found by make fuzz.
    ancient = client.get(url, {"since": "0116-08-29T15:32:09Z", "until": "7776-09-09T09:32:51+03:20"}).json()
    assert (ancient["since"], ancient["until"]) == ("0116-08-29T15:32:09Z", "7776-09-09T06:12:51Z")
    assert ancient["total"] == "1.500000"


def lifecycle_run_by(lab, user: User, name: str) -> Run:
    run = make_run(lab, name=name)
    Run.objects.filter(pk=run.pk).update(created_by=user)
    return Run.objects.get(pk=run.pk)


def test_members_read_costs_owners_change_budgets_and_outsiders_see_nothing(lab):
    run = make_run(lab)
    url, budget = f"/api/v1/runs/{run.pk}/cost", f"/api/v1/runs/{run.pk}/budget"
    for role in ("owner", "launcher", "reviewer", "viewer"):
        assert api_client_for(lab[role]).get(url).status_code == 200
    assert api_client_for(lab["outsider"]).get(url).status_code == 404
    assert (
        api_client_for(lab["outsider"]).get(f"/api/v1/projects/{lab['project'].pk}/costs").status_code == 404
    )
    for role in ("launcher", "reviewer", "viewer"):
        assert (
            api_client_for(lab[role]).patch(budget, {"budget_money": "5"}, format="json").status_code == 403
        )
        put = api_client_for(lab[role]).patch(
            f"/api/v1/projects/{lab['project'].pk}/budget", {"monthly": "5"}, format="json"
        )
        assert put.status_code == 403
    assert Run.objects.get(pk=run.pk).budget_money is None
    raised = api_client_for(lab["owner"]).patch(
        budget, {"budget_money": "5", "budget_device_hours": 2}, format="json"
    )
    assert raised.status_code == 200
    assert raised.json()["budget"] == {"money": "5.00", "device_hours": 2.0}
    assert (
        RunEvent.objects.filter(run=run, kind="budget").last().message
        == "budget set to 5.00 USD and 2 device-hours"
    )
    bad = api_client_for(lab["owner"]).patch(budget, {"budget_device_hours": 0}, format="json")
    assert bad.status_code == 400
    assert problems(bad) == {"budget_device_hours": "must be more than 0, or null for none"}


def test_only_staff_set_prices_and_everyone_signed_in_reads_them(lab):
    body = {"unit": "device_hour", "scope": "cpu", "amount": "1.25"}
    assert api_client_for(lab["owner"]).post("/api/v1/prices", body, format="json").status_code == 403
    assert not Price.objects.exists()
    User.objects.filter(pk=lab["viewer"].pk).update(is_staff=True)
    created = api_client_for(lab["viewer"]).post("/api/v1/prices", body, format="json")
    assert created.status_code == 201
    assert created.json()["amount"] == "1.250000"
    listed = api_client_for(lab["outsider"]).get("/api/v1/prices").json()["results"]
    assert [(p["unit"], p["scope"], p["amount"]) for p in listed] == [("device_hour", "cpu", "1.250000")]


# --- a real run: workers record, a budget pauses it, raising it lets it finish -------------------


@pytest.fixture
def hosts():
    env = worker_env()
    learner_host, rollout_host = Host(env), Host(env)
    with hosts_killed(learner_host, rollout_host):
        learner_host.worker("learner,control")
        rollout_host.worker("rollout,eval")
        yield learner_host, rollout_host


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(600)
@pytest.mark.backend_independent
def test_a_run_records_what_its_workers_did_pauses_at_its_budget_and_resumes_when_raised(tiny_model, hosts):
    setup = demo_project(tiny_model)
    setup["rule"] = reward_rule_create(
        project=setup["project"], name="similar", spec=SIMILARITY, by=setup["owner"]
    )
    storage = services.price_set(unit="gb_month", amount=Decimal("1000"), effective_from=EPOCH)
    # A checkpoint of the tiny model and its optimiser costs a few tenths at 1000 a GB-month: a
    # budget of three times the model's own size crosses after a few steps, before the last.
    model_bytes = sum(f.stat().st_size for f in tiny_model.rglob("*") if f.is_file())
    budget = (Decimal(model_bytes * 3) / 1_000_000_000 * storage.amount).quantize(Decimal("0.01"))
    body = run_body(setup, steps=8, eval_every=8, checkpoint_every=1) | {"budget_money": str(budget)}
    client = api_client_for(setup["owner"])
    created = client.post("/api/v1/runs", body, format="json")
    assert created.status_code == 201, created.json()
    run_id = created.json()["id"]
    wait_until(
        lambda: Run.objects.get(pk=run_id).status in (S.PAUSED, *Run.TERMINAL), "the budget to pause it"
    )
    run = Run.objects.get(pk=run_id)
    assert run.status == S.PAUSED, run.error
    reached = RunEvent.objects.get(run=run, kind="budget").data
    step = reached["step"]
    assert 1 <= step < 8 and run.learner_step == step
    assert Decimal(reached["spent"]) >= budget
    spent_by_step = dict(MetricPoint.objects.filter(run=run, name="cost/total").values_list("step", "value"))
    assert (
        step == 1 or spent_by_step[step - 1] < budget
    )  # not over at the step before: paused at the crossing
    assert Checkpoint.objects.filter(run=run, step=step).exists()

    raised = client.patch(f"/api/v1/runs/{run_id}/budget", {"budget_money": "100000"}, format="json")
    assert raised.status_code == 200
    assert client.post(f"/api/v1/runs/{run_id}/resume").status_code == 200
    run = wait_for_terminal(run_id)
    assert run.status == S.SUCCEEDED, run.error

    cost = client.get(f"/api/v1/runs/{run_id}/cost").json()
    units = cost["units"]
    assert units["tokens_sampled"] == sampled_tokens_of_done_batches(run) > 0
    learned = Trajectory.objects.filter(run=run).exclude(learned_in_step=None)
    assert learned.exists(), "nothing was learned"
    assert units["tokens_trained"] == learned.aggregate(n=Sum("completion_tokens"))["n"]
    assert_billed_once(run)
    learner_rows = Usage.objects.filter(run=run, kind="learner")
    assert sorted(learner_rows.values_list("step", flat=True)) == list(range(1, 9))  # each step once
    assert all(row.device_class == this_device() and row.device_seconds > 0 for row in learner_rows)
    evaluations = Usage.objects.filter(run=run, kind="evaluation")
    assert sorted(evaluations.values_list("step", flat=True)) == [0, 8]  # the start and the end, once each
    checkpoints = Usage.objects.filter(run=run, kind="storage").order_by("step")
    assert [row.step for row in checkpoints] == list(range(1, 9))
    # Money is units times prices: only storage has a price here.
    expected = sum(
        (Decimal(row.storage_bytes) / 1_000_000_000 * storage.amount).quantize(Decimal("0.000001"))
        for row in checkpoints
    )
    assert cost["total"] == str(expected)
    assert cost["budget"] == {"money": "100000.00", "device_hours": None}


def test_usage_is_exported_as_prometheus_counters(lab, client):
    run = make_run(lab)
    record(run, device_class="cpu", device_seconds=4.5, tokens_trained=7)
    record(run, component="rollout:a", kind="rollout", tokens_sampled=11, cpu_seconds=2.0)
    record(run, component="checkpoint", kind="storage", storage_bytes=1000)
    text = client.get(
        "/metrics", HTTP_AUTHORIZATION=f"Bearer {django_settings.FLYWHEEL_OPS_TOKEN}"
    ).content.decode()
    assert 'flywheel_usage_device_seconds_total{device_class="cpu",kind="learner"} 4.5' in text
    assert 'flywheel_usage_tokens_total{kind="rollout",tokens="sampled"} 11.0' in text
    assert 'flywheel_usage_tokens_total{kind="learner",tokens="trained"} 7.0' in text
    assert 'flywheel_usage_cpu_seconds_total{kind="rollout"} 2.0' in text
    assert "flywheel_usage_storage_bytes_total 1000.0" in text


def test_the_run_page_shows_the_cost_panel_and_the_runs_table_a_sortable_cost_column(lab, client):
    cheap, dear = make_run(lab, name="cheap"), make_run(lab, name="dear")
    services.price_set(unit="device_hour", amount=Decimal("3.6"), effective_from=EPOCH)
    record(cheap, device_class="cpu", device_seconds=1000.0, tokens_trained=9)
    record(dear, device_class="cpu", device_seconds=5000.0)
    for run in (cheap, dear):
        metrics_write(run, 1, {"cost/total": float(selectors.run_spent(run=run).total)})
    client.force_login(lab["viewer"])
    page = client.get(reverse("run-detail", args=[cheap.pk])).content.decode()
    assert '<span id="run-cost-total">1.00</span> USD' in page
    assert '<tr data-kind="learner"><td>learner</td><td class="num">1000.0</td>' in page
    table = client.get(reverse("run-list"), {"sort": "-cost"}).content.decode()
    assert table.index('data-cost="5.0"') < table.index('data-cost="1.0"')
    over = client.get(reverse("run-list"), {"cost_min": "2"}).content.decode()
    assert ">dear</a>" in over and ">cheap</a>" not in over


def test_the_launch_form_sets_a_budget_and_refuses_a_project_past_its_own(client, lab):
    client.force_login(lab["launcher"])
    url = reverse("run-create", args=[lab["project"].pk])
    form = launch_form(lab, budget_money="2.50", budget_device_hours="0.5")
    assert client.post(url, form).status_code == 302
    run = Run.objects.get()
    assert (run.budget_money, run.budget_device_hours) == (Decimal("2.50"), 0.5)

    services.price_set(unit="device_hour", amount=Decimal("10"), effective_from=EPOCH)
    services.project_budget_set(project=lab["project"], monthly=Decimal("1"))
    record(run, device_seconds=360.0)  # 1.00
    refused = client.post(url, form)
    assert refused.status_code == 200
    assert "has spent 1.00 of its monthly budget of 1.00 this month" in refused.content.decode()
    assert Run.objects.count() == 1


# --- a rollout batch in this process: what its worker records --------------------------------

JUDGED = {
    "type": "score_model",
    "name": "quality",
    "model": "judge",
    "input": [{"role": "user", "content": "Rate this answer from 0 to 10: {{ sample.output_text }}"}],
    "range": [0, 10],
}


def judged_run(owner, model: Path) -> Run:
    project = make_project(owner, name="judged")
    task_set = project_services.task_set_create(project=project, name="sums", by=owner)
    items = [
        {"id": f"q{n}", "prompt": f"{n}+{n}?", "reference": str(2 * n), "split": "train"} for n in range(2)
    ]
    items.append({"id": "h", "prompt": "9+9?", "reference": "18", "split": "heldout"})
    lines = [(json.dumps(item) + "\n").encode() for item in items]
    version = project_services.task_set_import(
        task_set=task_set, stream=lines, file_format="jsonl", by=owner
    ).version
    rule = reward_rule_create(project=project, name="judged", spec=JUDGED, by=owner)
    tier = tier_services.tier_create(
        project=project, by=owner, name="judge", base_model=str(model), max_new_tokens=8
    )
    request = RunRequest(
        project=project,
        name="judged",
        task_set_version=version,
        reward_rule_version=rule.versions.get(),
        tier=tier,
        hyperparameters={"group_size": 2, "batch_size": 2},
        max_steps=2,
    )
    run = lifecycle.run_create(request=request, by=owner)
    Run.objects.filter(pk=run.pk).update(status=S.RUNNING)
    policy = policy_load(model)
    policy_publish(run.pk, 0, policy.model, policy.tokenizer)
    return run


def batch_play(run: Run, index: int) -> RolloutBatch:
    items = list(
        run.task_set_version.items.filter(split="train").order_by("position").values_list("pk", flat=True)
    )
    batch = RolloutBatch.objects.create(run=run, index=index, step=0, policy_version=0, item_ids=items)
    assert rollout_batch_run(batch.pk) == 4
    return RolloutBatch.objects.get(pk=batch.pk)


def test_a_worker_dying_between_finishing_a_batch_and_billing_it_leaves_it_to_be_run_and_billed_again(
    db, tiny_model, settings, tmp_path
):
    """Done and billed are one transaction: a crash in the billing leaves the batch not done (given
    back for another attempt), never done and unbilled; the next attempt bills it once."""
    settings.FLYWHEEL_HOME = tmp_path
    run = judged_run(make_user("crash-owner"), tiny_model)
    items = list(
        run.task_set_version.items.filter(split="train").order_by("position").values_list("pk", flat=True)
    )
    batch = RolloutBatch.objects.create(run=run, index=0, step=0, policy_version=0, item_ids=items)
    with mock.patch("workers.run_rollout.rollout_usage_record", side_effect=RuntimeError("killed")):
        assert rollout_batch_run(batch.pk) == 0
    assert RolloutBatch.objects.get(pk=batch.pk).status == RolloutBatch.Status.PENDING
    assert not Usage.objects.filter(run=run).exists()
    # The episodes the first attempt stored are kept (nothing is stored twice); the batch ends done.
    assert rollout_batch_run(batch.pk) == 0
    assert RolloutBatch.objects.get(pk=batch.pk).status == RolloutBatch.Status.DONE
    assert Trajectory.objects.filter(batch=batch).count() == 4
    (usage,) = Usage.objects.filter(run=run)
    assert (usage.recordings, usage.tokens_sampled) == (1, sampled_tokens_of_done_batches(run))
    assert usage.tokens_sampled > 0


def test_a_rollout_batch_records_its_tokens_device_time_and_judge_calls_and_a_rerun_replaces_them(
    db, tiny_model, settings, tmp_path
):
    settings.FLYWHEEL_HOME = tmp_path
    run = judged_run(make_user("judged-owner"), tiny_model)
    first = batch_play(run, 0)
    (usage,) = Usage.objects.filter(run=run)
    episodes = Trajectory.objects.filter(batch=first)
    assert (usage.step, usage.kind, usage.component) == (1, "rollout", rollout_component(first.item_ids))
    assert usage.tokens_sampled == sum(episodes.values_list("completion_tokens", flat=True)) > 0
    assert usage.tokens_prefilled == sum(episodes.values_list("prompt_tokens", flat=True)) > 0
    # One verdict per distinct (item, completion): identical answers in a group are judged once.
    assert usage.judge_calls == len(set(episodes.values_list("item_id", "completion_text")))
    assert (usage.device_class, usage.device_seconds) == (this_device(), first.generate_seconds)
    assert usage.recordings == 1

    # The same part of step 0 dispatched again (after a rollback): billed once, recorded twice.
    second = batch_play(run, 1)
    (usage,) = Usage.objects.filter(run=run)
    assert usage.recordings == 2
    again = Trajectory.objects.filter(batch=second)
    assert usage.tokens_sampled == sum(again.values_list("completion_tokens", flat=True))
    assert usage.device_seconds == second.generate_seconds


def test_the_project_page_shows_this_months_cost_per_user_against_its_budget(lab, client):
    mine, theirs = make_run(lab, name="mine"), lifecycle_run_by(lab, lab["launcher"], "theirs")
    services.price_set(unit="device_hour", amount=Decimal("3.6"), effective_from=EPOCH)
    services.project_budget_set(project=lab["project"], monthly=Decimal("20"))
    record(mine, device_seconds=1000.0)
    record(theirs, device_seconds=2500.0)
    record(theirs, step=2, device_seconds=7200.0)
    Usage.objects.filter(run=theirs, step=2).update(
        recorded_at=selectors.month_start(timezone.now()) - timedelta(days=1)
    )
    client.force_login(lab["viewer"])
    page = client.get(reverse("project-detail", args=[lab["project"].pk])).content.decode()
    assert '<span id="project-cost-total">3.50</span> USD' in page
    assert "monthly budget 20.00 USD" in page
    assert '<td>launcher</td><td class="num">0.694</td><td class="num">2.50</td>' in page

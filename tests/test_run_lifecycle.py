"""Run creation (validated up front), clone and fork, status changes and admission by quota."""

import json
from unittest import mock

import pytest
from django.core.exceptions import ValidationError

from core.exceptions import StateError
from projects import services as project_services
from rewards import services as reward_services
from runs import lifecycle
from runs.lifecycle import RunRequest
from runs.models import Checkpoint, Run, RunEvent
from runs.scheduling import runs_admit
from tests.conftest import make_project, make_user
from tiers import services as tier_services

S = Run.Status
ANSWER_RULE = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.reference}}",
    "operation": "eq",
}


@pytest.fixture
def setup(db, tmp_path, settings):
    settings.FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS = 1
    owner = make_user("launcher-1")
    project = make_project(owner)
    task_set = project_services.task_set_create(project=project, name="arith", by=owner)
    items = [{"id": f"q{i}", "prompt": f"{i}+{i}?", "reference": str(2 * i)} for i in range(40)]
    lines = [(json.dumps(item) + "\n").encode() for item in items]
    version = project_services.task_set_import(
        task_set=task_set, stream=lines, file_format="jsonl", by=owner
    ).version
    rule = reward_services.reward_rule_create(project=project, name="exact", spec=ANSWER_RULE, by=owner)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    tier = tier_services.tier_create(project=project, by=owner, name="cap", base_model=str(model_dir))
    request = RunRequest(
        project=project,
        name="first",
        task_set_version=version,
        reward_rule_version=rule.versions.get(),
        tier=tier,
        hyperparameters={"group_size": 4, "learning_rate": "auto"},
        max_steps=5,
    )
    return {"owner": owner, "project": project, "request": request, "tier": tier, "rule": rule}


def test_a_valid_run_is_queued_with_its_hyperparameters_resolved(setup):
    run = lifecycle.run_create(request=setup["request"], by=setup["owner"])
    assert run.status == S.QUEUED
    assert run.resolved["group_size"] == 4 and run.resolved["learning_rate"] == 0.0003
    assert run.tier_config["base_model"] == setup["tier"].base_model
    assert list(run.events.values_list("kind", "message")) == [("status", "queued")]
    assert setup["rule"].versions.get().used_at is not None  # a used version is now immutable


def test_a_run_that_would_fail_at_its_first_step_is_refused_with_every_reason(setup, tmp_path):
    setup["tier"].base_model = str(tmp_path / "missing")
    setup["tier"].save()
    code_rule = reward_services.reward_rule_create(
        project=setup["project"],
        name="bad",
        spec={
            "type": "string_check",
            "name": "x",
            "input": "{{item.nope}}",
            "reference": "a",
            "operation": "eq",
        },
        by=setup["owner"],
    )
    request = RunRequest(
        **(
            vars(setup["request"])
            | {
                "reward_rule_version": code_rule.versions.get(),
                "hyperparameters": {"group_size": 1, "typo": 3},
                "max_steps": 0,
            }
        )
    )
    with pytest.raises(ValidationError) as refused:
        lifecycle.run_create(request=request, by=setup["owner"])
    problems = refused.value.message_dict
    assert sorted(problems) == [  # every reason at once, hyperparameters and the rest
        "hyperparameters.group_size",
        "hyperparameters.typo",
        "max_steps",
        "reward_rule_version.input",
        "tier.base_model",
    ]
    request = RunRequest(**(vars(request) | {"hyperparameters": {}}))
    with pytest.raises(ValidationError) as refused:
        lifecycle.run_create(request=request, by=setup["owner"])
    problems = refused.value.message_dict
    assert sorted(problems) == ["max_steps", "reward_rule_version.input", "tier.base_model"]
    assert "on this machine (moved or deleted since the tier was saved)" in problems["tier.base_model"][0]
    assert Run.objects.count() == 0


def test_admission_respects_the_project_quota_and_priority(setup):
    low = lifecycle.run_create(request=setup["request"], by=setup["owner"])
    high = lifecycle.run_create(
        request=RunRequest(**(vars(setup["request"]) | {"priority": 5})), by=setup["owner"]
    )
    assert (lifecycle.queue_position(high), lifecycle.queue_position(low)) == (1, 2)
    started = runs_admit()
    assert started == [high.pk]
    assert Run.objects.get(pk=high.pk).status == S.STARTING
    assert Run.objects.get(pk=low.pk).status == S.QUEUED
    assert runs_admit() == []  # the quota is full: nothing more starts


@pytest.mark.parametrize(
    ("frees_its_place", "status"),
    [
        (lambda run: lifecycle.run_transition(run, allowed=(S.STARTING,), to=S.SUCCEEDED), S.SUCCEEDED),
        (lambda run: lifecycle.run_pause(run=run), S.PAUSED),
    ],
    ids=["ends", "pauses"],
)
def test_a_run_that_ends_or_pauses_starts_the_next_queued_run_at_once(
    setup, frees_its_place, status, django_capture_on_commit_callbacks
):
    """Without waiting for the periodic tick: a deployment (or a test) without beat would otherwise
    never start the run waiting behind it."""
    first = lifecycle.run_create(request=setup["request"], by=setup["owner"])
    waiting = lifecycle.run_create(request=setup["request"], by=setup["owner"])
    assert runs_admit() == [first.pk]
    with (
        mock.patch("runs.tasks.runs_schedule.delay", side_effect=runs_admit) as schedule,
        mock.patch("runs.scheduling._start_learner") as start,
        django_capture_on_commit_callbacks(execute=True),
    ):
        frees_its_place(Run.objects.get(pk=first.pk))
    assert Run.objects.get(pk=first.pk).status == status
    schedule.assert_called_once_with()
    assert Run.objects.get(pk=waiting.pk).status == S.STARTING
    start.assert_called_once_with(waiting.pk)


def test_status_changes_are_conditional_and_recorded(setup):
    run = lifecycle.run_create(request=setup["request"], by=setup["owner"])
    with pytest.raises(StateError, match="is queued"):
        lifecycle.run_resume(run=run)
    run = lifecycle.run_pause(run=run)
    assert run.status == S.PAUSED
    run = lifecycle.run_cancel(run=run)
    assert run.status == S.CANCELLED and run.finished_at is not None
    with pytest.raises(StateError):
        lifecycle.run_cancel(run=run)
    run = lifecycle.run_retry(run=run)
    assert run.status == S.QUEUED and run.finished_at is None
    statuses = [event.data["status"] for event in RunEvent.objects.filter(run=run).order_by("pk")]
    assert statuses == ["queued", "paused", "cancelled", "queued"]


def test_a_fork_starts_from_a_checkpoint_and_shows_its_config_diff(setup):
    parent = lifecycle.run_create(request=setup["request"], by=setup["owner"])
    checkpoint = Checkpoint.objects.create(run=parent, step=3, policy_version=3, path="/tmp/ck")
    child = lifecycle.run_fork(checkpoint=checkpoint, by=setup["owner"], hyperparameters={"group_size": 8})
    assert child.parent == parent and child.parent_checkpoint == checkpoint
    assert child.name == "first (fork @ 3)"
    assert lifecycle.config_diff(parent, child) == [{"field": "resolved.group_size", "parent": 4, "run": 8}]

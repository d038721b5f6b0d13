"""Quotas of active runs and of GPU workers (a run holds one per learner process): per project
(set by its owners, else FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS and FLYWHEEL_PROJECT_MAX_GPU_WORKERS)
and per user across projects (FLYWHEEL_USER_MAX_ACTIVE_RUNS, FLYWHEEL_USER_MAX_GPU_WORKERS); a
waiting run says why, in the API and on the queue page."""

import html
import json

import pytest
from django.test import Client
from django.urls import reverse

from core.roles import Role
from projects import services as project_services
from rewards import services as reward_services
from runs.models import Run
from runs.scheduling import queue_reason, queue_reasons, runs_admit
from tests.conftest import api_client_for, make_project
from tests.run_fixtures import ANSWER_RULE, ITEMS, lab, make_run
from tiers import services as tier_services

pytestmark = pytest.mark.django_db
__all__ = ["lab"]
S = Run.Status


def another_project(lab, name: str) -> dict:
    """The lab's task set, rule and tier again, in another project of the same owner."""
    owner = lab["owner"]
    project = make_project(owner, name=name)
    task_set = project_services.task_set_create(project=project, name="arith", by=owner)
    lines = [(json.dumps(item) + "\n").encode() for item in ITEMS]
    imported = project_services.task_set_import(
        task_set=task_set, stream=lines, file_format="jsonl", by=owner
    )
    rule = reward_services.reward_rule_create(project=project, name="exact", spec=ANSWER_RULE, by=owner)
    tier = tier_services.tier_create(project=project, by=owner, name="cap", base_model=lab["tier"].base_model)
    return lab | {"project": project, "version": imported.version, "rule": rule, "tier": tier}


def status_of(run: Run) -> str:
    return Run.objects.get(pk=run.pk).status


def test_two_projects_with_a_quota_of_one_share_two_workers_while_a_third_run_waits_and_says_why(lab):
    other = another_project(lab, "beta-2")
    owner = api_client_for(lab["owner"])
    for project in (lab["project"], other["project"]):
        answer = owner.patch(f"/api/v1/projects/{project.pk}/quota", {"max_active_runs": 1}, format="json")
        assert answer.status_code == 200 and answer.json()["max_active_runs"] == 1
    first, waiting = make_run(lab, name="a1"), make_run(lab, name="a2")
    second = make_run(other, name="b1")
    assert sorted(runs_admit()) == sorted([first.pk, second.pk])
    assert (status_of(first), status_of(second), status_of(waiting)) == (S.STARTING, S.STARTING, S.QUEUED)
    why = "the project's quota of 1 active run is in use (1 active)"
    assert queue_reason(Run.objects.get(pk=waiting.pk)) == why
    assert owner.get(f"/api/v1/runs/{waiting.pk}").json()["queue_reason"] == why
    quota = owner.get(f"/api/v1/projects/{lab['project'].pk}/quota").json()
    assert quota == {
        "max_active_runs": 1,
        "default": False,
        "max_gpu_workers": 0,
        "gpu_workers_default": True,
        "active": 1,
        "gpu_workers": 1,
        "queued": 1,
        "user_max_active_runs": 0,
        "user_max_gpu_workers": 0,
    }

    raised = owner.patch(f"/api/v1/projects/{lab['project'].pk}/quota", {"max_active_runs": 2}, format="json")
    assert raised.json()["max_active_runs"] == 2
    assert runs_admit() == [waiting.pk]
    reset = owner.patch(
        f"/api/v1/projects/{lab['project'].pk}/quota", {"max_active_runs": None}, format="json"
    )
    assert (reset.json()["max_active_runs"], reset.json()["default"]) == (1, True)


def test_a_users_quota_holds_across_projects_and_the_next_users_run_starts_instead(lab, settings):
    settings.FLYWHEEL_USER_MAX_ACTIVE_RUNS = 1
    api_client_for(lab["owner"]).patch(
        f"/api/v1/projects/{lab['project'].pk}/quota", {"max_active_runs": 5}, format="json"
    )
    mine = make_run(lab, name="mine")
    blocked = make_run(lab, name="mine-too")
    theirs = make_run(lab | {"owner": lab[Role.LAUNCHER]}, name="theirs")
    assert sorted(runs_admit()) == sorted([mine.pk, theirs.pk])
    assert status_of(blocked) == S.QUEUED
    assert queue_reason(Run.objects.get(pk=blocked.pk)) == "its creator's quota of 1 active run is in use"


def test_only_owners_set_a_quota_and_members_read_it(lab):
    path = f"/api/v1/projects/{lab['project'].pk}/quota"
    refused = api_client_for(lab[Role.LAUNCHER]).patch(path, {"max_active_runs": 9}, format="json")
    assert refused.status_code in (403, 404)
    assert api_client_for(lab[Role.VIEWER]).get(path).json()["max_active_runs"] == 1
    assert api_client_for(lab["outsider"]).get(path).status_code == 404
    bad = api_client_for(lab["owner"]).patch(path, {"max_active_runs": -1}, format="json")
    assert bad.status_code == 400 and "max_active_runs" in json.dumps(bad.json())


def make_learners_run(lab, name: str, processes: int, **changes) -> Run:
    """A queued run whose learner runs on `processes` processes: it holds that many GPU workers."""
    return make_run(lab, name=name, hyperparameters={"learner_processes": processes}, **changes)


def test_two_projects_with_a_quota_of_one_gpu_worker_share_two_workers_while_a_third_run_waits(lab, settings):
    settings.FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS = 5  # only the GPU workers hold runs back here
    other = another_project(lab, "beta-2")
    owner = api_client_for(lab["owner"])
    for project in (lab["project"], other["project"]):
        answer = owner.patch(f"/api/v1/projects/{project.pk}/quota", {"max_gpu_workers": 1}, format="json")
        assert answer.status_code == 200, answer.content
        assert (answer.json()["max_gpu_workers"], answer.json()["gpu_workers_default"]) == (1, False)
        assert answer.json()["max_active_runs"] == 5  # untouched: still the default
    first, waiting = make_run(lab, name="a1"), make_run(lab, name="a2")
    second = make_run(other, name="b1")
    assert sorted(runs_admit()) == sorted([first.pk, second.pk])
    assert (status_of(first), status_of(second), status_of(waiting)) == (S.STARTING, S.STARTING, S.QUEUED)
    why = "the project's quota of 1 GPU worker is in use (1 held)"
    assert queue_reason(Run.objects.get(pk=waiting.pk)) == why
    assert owner.get(f"/api/v1/runs/{waiting.pk}").json()["queue_reason"] == why
    quota = owner.get(f"/api/v1/projects/{lab['project'].pk}/quota").json()
    assert (quota["max_gpu_workers"], quota["gpu_workers"], quota["active"], quota["queued"]) == (1, 1, 1, 1)

    # The queue page shows each project's use against its quotas and why the run waits.
    client = Client()
    client.force_login(lab["owner"])
    page = client.get(reverse("run-queue"))
    assert page.status_code == 200
    body = " ".join(html.unescape(page.content.decode()).split())
    assert f'data-project="{lab["project"].pk}"' in body
    assert "1 of 1 GPU worker" in body and why in body
    assert "a2" in body

    Run.objects.filter(pk=first.pk).update(status=S.SUCCEEDED)  # a worker comes free
    assert runs_admit() == [waiting.pk]


def test_a_run_on_two_learner_processes_holds_two_gpu_workers_and_the_line_holds_behind_it(lab, settings):
    settings.FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS = 5
    scheduling_quota = f"/api/v1/projects/{lab['project'].pk}/quota"
    api_client_for(lab["owner"]).patch(scheduling_quota, {"max_gpu_workers": 2}, format="json")
    holding = make_run(lab, name="one")
    big = make_learners_run(lab, "two", 2, priority=5)  # higher priority: first in line
    small = make_run(lab, name="three")
    assert runs_admit() == [big.pk]  # 2 of 2 held: the others wait
    assert (status_of(holding), status_of(small)) == (S.QUEUED, S.QUEUED)
    reasons = queue_reasons(list(Run.objects.filter(pk__in=[holding.pk, small.pk])))
    assert reasons[holding.pk] == "the project's quota of 2 GPU workers is in use (2 held)"

    Run.objects.filter(pk=big.pk).update(status=S.SUCCEEDED)
    huge = make_learners_run(lab, "four", 3, priority=9)  # more than the quota: never fits
    bigger = make_learners_run(lab, "five", 2, priority=7)
    assert runs_admit() == [bigger.pk]
    assert queue_reason(Run.objects.get(pk=huge.pk)) == (
        "it needs 3 GPU workers, more than the project's quota of 2 GPU workers"
    )
    # "one" waits for "five" to end, and "three" behind "one": the line holds in priority order.
    assert queue_reason(Run.objects.get(pk=holding.pk)) == (
        "the project's quota of 2 GPU workers is in use (2 held)"
    )
    assert queue_reason(Run.objects.get(pk=small.pk)).startswith("behind one (higher in the queue)")


def test_a_users_gpu_workers_hold_across_projects(lab, settings):
    settings.FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS = 5
    settings.FLYWHEEL_USER_MAX_GPU_WORKERS = 2
    other = another_project(lab, "beta-3")
    mine = make_learners_run(lab, "mine", 2)
    blocked = make_run(other, name="mine-too")
    theirs = make_run(other | {"owner": lab[Role.LAUNCHER]}, name="theirs")
    assert sorted(runs_admit()) == sorted([mine.pk, theirs.pk])
    assert status_of(blocked) == S.QUEUED
    assert (
        queue_reason(Run.objects.get(pk=blocked.pk))
        == "its creator's quota of 2 GPU workers is in use (2 held)"
    )

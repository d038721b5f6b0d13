"""Fixtures and helpers for the run tests: a project ready to launch, runs made through the
lifecycle, and their record (trajectories, statuses) written directly, as the run loop would."""

import json

import pytest

from projects import services as project_services
from rewards import services as reward_services
from runs import lifecycle
from runs.lifecycle import RunRequest
from runs.models import Run, Trajectory
from tiers import services as tier_services

S = Run.Status
ANSWER_RULE = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.reference}}",
    "operation": "eq",
}
ITEMS = [
    {"id": f"q{i}", "prompt": f"{i}+{i}?", "reference": str(2 * i), "split": "heldout" if i < 2 else "train"}
    for i in range(6)
]


@pytest.fixture
def lab(team, tmp_path):
    """The team's project with a task set, a reward rule and a tier whose model is on disk."""
    owner, project = team["owner"], team["project"]
    task_set = project_services.task_set_create(project=project, name="arith", by=owner)
    lines = [(json.dumps(item) + "\n").encode() for item in ITEMS]
    version = project_services.task_set_import(
        task_set=task_set, stream=lines, file_format="jsonl", by=owner
    ).version
    rule = reward_services.reward_rule_create(project=project, name="exact", spec=ANSWER_RULE, by=owner)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    tier = tier_services.tier_create(project=project, by=owner, name="cap", base_model=str(model_dir))
    launch = {
        "project": project.pk,
        "name": "first",
        "task_set_version": version.pk,
        "reward_rule_version": rule.versions.get().pk,
        "tier": tier.pk,
        "hyperparameters": {"group_size": 4, "learning_rate": "auto"},
        "max_steps": 5,
    }
    return team | {"version": version, "rule": rule, "tier": tier, "launch": launch}


def make_run(lab, **changes) -> Run:
    request = RunRequest(
        project=lab["project"],
        name=changes.pop("name", "first"),
        task_set_version=lab["version"],
        reward_rule_version=lab["rule"].versions.get(),
        tier=lab["tier"],
        hyperparameters=changes.pop("hyperparameters", {"group_size": 4}),
        max_steps=5,
        **changes,
    )
    return lifecycle.run_create(request=request, by=lab["owner"])


def set_status(run: Run, status: str, **fields) -> Run:
    Run.objects.filter(pk=run.pk).update(status=status, **fields)
    run.refresh_from_db()
    return run


def make_trajectory(run: Run, *, index: int = 0, **fields) -> Trajectory:
    values = {"policy_version": 0, "outcome": "scored", "reward": 1.0} | fields
    item = run.task_set_version.items.order_by("position")[index]
    return Trajectory.objects.create(run=run, item=item, sample_index=index, **values)

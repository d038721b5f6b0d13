"""A run with a trained checkpoint on disk, as the learner leaves one: its policy version published
with `save_pretrained` (the tiny base model with its weights moved, so that it writes other tokens
than the base), the checkpoint row, and held-out metric points. Shared by the export and serving
tests."""

import pytest
import torch

from inference.policy import policy_load
from runs import lifecycle
from runs.lifecycle import RunRequest
from runs.models import Checkpoint, MetricPoint, Run
from runs.run_store import learner_dir, policy_publish
from tests.run_harness import demo_project, tiny_model  # noqa: F401  (a fixture)

STEP = 2


def publish_trained(run: Run, model_path, step: int = STEP, *, metrics: bool = True) -> Checkpoint | None:
    policy = policy_load(model_path)
    generator = torch.Generator().manual_seed(step)
    with torch.no_grad():
        for parameter in policy.model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.3)
    policy_publish(run.pk, step, policy.model, policy.tokenizer)
    if not metrics:
        return None
    MetricPoint.objects.bulk_create(
        [
            MetricPoint(run=run, name="heldout/pass_rate", step=0, value=0.25),
            MetricPoint(run=run, name="heldout/pass_rate", step=step, value=0.75),
            MetricPoint(run=run, name="heldout/reward", step=step, value=0.5),
        ]
    )
    path = learner_dir(run.pk) / f"checkpoint-{step}"
    return Checkpoint.objects.create(run=run, step=step, policy_version=step, path=str(path))


def trained_setup(model) -> dict:
    """A demo project (owner, task set, rule, tier over the tiny model) and a run with a checkpoint."""
    setup = demo_project(model)
    request = RunRequest(
        project=setup["project"],
        name="Adder GRPO",
        task_set_version=setup["version"],
        reward_rule_version=setup["rule"].versions.get(),
        tier=setup["tier"],
        hyperparameters={"group_size": 4},
        max_steps=STEP,
    )
    run = lifecycle.run_create(request=request, by=setup["owner"])
    checkpoint = publish_trained(run, model)
    return setup | {"run": run, "checkpoint": checkpoint, "model": model}


@pytest.fixture
def trained(db, tiny_model):  # noqa: F811
    return trained_setup(tiny_model)

"""`python manage.py demo_reward_model`: RLHF on the demo functions through the running stack.

1. Preference pairs: each demo function's reference solution chosen over the same function with its
   constant off by one (the base model's habit, what a reviewer marks bad), on the train and
   held-out splits of a task-set version, as a reviews export or an import gives them.
2. A reward model trained on them by a learner process (the learner queue); its held-out pair
   accuracy, before training (the fresh head) and after.
3. A GRPO run whose reward rule is that reward model (`reward_model` grader, scored on the rollout
   workers), and the model's mean score per step.
Prints one line of JSON last.
"""

import json
import re
import time
from statistics import fmean

from django.conf import settings
from django.core.management.base import BaseCommand

from reward_models import services
from reward_models.models import RewardModel, RewardModelVersion
from rewards import services as reward_services
from runs import services as run_services
from runs.demo import demo_ensure
from runs.demo_tasks import demo_task_sets
from runs.lifecycle import RunRequest, run_create
from runs.models import MetricPoint, Run, TaskSet, Tier

PAIRS_TASK_SET = "reward-model demo: preferences"
WAIT_SECONDS = 3600
CONSTANT = re.compile(r"return .*?[-+*] (\d+)")


def off_by_one(solution: str, up: bool) -> str:
    """The solution with its constant one off: the rejected side of each pair.

    >>> off_by_one("def f(x):\\n    return x + 3\\n", up=True)
    'def f(x):\\n    return x + 4\\n'
    >>> off_by_one("def f(xs):\\n    return [v * 3 for v in xs]\\n", up=False)
    'def f(xs):\\n    return [v * 2 for v in xs]\\n'
    """
    found = CONSTANT.search(solution)
    value = int(found.group(1)) + (1 if up else -1)
    return solution[: found.start(1)] + str(value) + solution[found.end(1) :]


def pair_lines(*, train: int, heldout: int) -> list[bytes]:
    sets = demo_task_sets(seed=0, train_size=train, heldout_size=heldout)
    lines = []
    for index, item in enumerate(sets["train"] + sets["heldout"]):
        solution = item["reference_solution"]
        rejected = off_by_one(solution, up=index % 2 == 0)
        item = item | {"metadata": item["metadata"] | {"chosen": solution, "rejected": rejected}}
        lines.append((json.dumps(item) + "\n").encode())
    return lines


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(1)  # waiting on other processes' work, reported as it lands


class Command(BaseCommand):
    help = "Train a reward model on the demo's preference pairs, then GRPO against it (the stack must be up)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--train-pairs", type=int, default=200)
        parser.add_argument("--heldout-pairs", type=int, default=32)
        parser.add_argument("--rm-learning-rate", type=float, default=1e-3)
        parser.add_argument("--rm-epochs", type=int, default=3)
        parser.add_argument("--steps", type=int, default=10, help="GRPO steps")
        parser.add_argument("--learning-rate", type=float, default=1e-3, help="GRPO learning rate")

    def handle(self, *args, **options) -> None:
        started = time.monotonic()
        user, project = demo_ensure(
            username=settings.FLYWHEEL_DEMO_USER, password=settings.FLYWHEEL_DEMO_PASSWORD
        )
        task_set = TaskSet.objects.filter(project=project, name=PAIRS_TASK_SET).first()
        if task_set is None:
            task_set = run_services.task_set_create(project=project, name=PAIRS_TASK_SET, by=user)
        lines = pair_lines(train=options["train_pairs"], heldout=options["heldout_pairs"])
        pairs = run_services.task_set_import(
            task_set=task_set, stream=lines, file_format="jsonl", by=user
        ).version
        tier = Tier.objects.get(project=project, name="rollout")
        reward_model = RewardModel.objects.filter(project=project, name="demo-preferences").first()
        if reward_model is None:
            reward_model = services.reward_model_create(project=project, name="demo-preferences", by=user)
        version = services.reward_model_train(
            reward_model=reward_model,
            task_set_version=pairs,
            by=user,
            tier=tier,
            hyperparameters={"learning_rate": options["rm_learning_rate"], "epochs": options["rm_epochs"]},
        )
        self.stdout.write(f"training reward model {reward_model.name} v{version.number} ...")
        wait_for(lambda: RewardModelVersion.objects.get(pk=version.pk).is_terminal, "the reward model")
        version.refresh_from_db()
        if version.status != RewardModelVersion.Status.SUCCEEDED:
            raise SystemExit(f"reward model training {version.status}: {version.error}")
        self.stdout.write(
            f"held-out pair accuracy {version.base_heldout_accuracy:.3f} (fresh head) -> "
            f"{version.heldout_accuracy:.3f} on {version.heldout_pairs} pairs (chance 0.5)"
        )
        spec = {"type": "reward_model", "name": "rm", "model": reward_model.name, "version": version.number}
        rule = project.reward_rules.filter(name="reward-model demo").first()
        if rule is None:
            rule = reward_services.reward_rule_create(
                project=project, name="reward-model demo", spec=spec, by=user
            )
        else:
            rule = reward_services.reward_rule_update(rule=rule, by=user, spec=spec).rule
        steps = options["steps"]
        run = run_create(
            request=RunRequest(
                project=project,
                name=f"GRPO against reward model {reward_model.name} v{version.number}",
                task_set_version=pairs,
                reward_rule_version=rule.versions.order_by("-number").first(),
                tier=tier,
                method="grpo",
                hyperparameters={
                    "group_size": 8,
                    "batch_size": 8,
                    "learning_rate": options["learning_rate"],
                    "checkpoint_every": steps,
                    "eval_every": steps,
                    "eval_items": 8,
                },
                max_steps=steps,
            ),
            by=user,
        )
        wait_for(lambda: Run.objects.get(pk=run.pk).is_terminal, f"run {run.pk}")
        run.refresh_from_db()
        scores = list(
            MetricPoint.objects.filter(run=run, name="reward/mean")
            .order_by("step")
            .values_list("value", flat=True)
        )
        for step, value in enumerate(scores, start=1):
            self.stdout.write(f"step {step:3d}: mean reward-model score {value:+.3f}")
        third = max(1, len(scores) // 3)
        summary = {
            "demo": "reward_model",
            "reward_model_version": version.pk,
            "train_pairs": version.train_pairs,
            "heldout_pairs": version.heldout_pairs,
            "heldout_accuracy_before": version.base_heldout_accuracy,
            "heldout_accuracy": version.heldout_accuracy,
            "train_accuracy": version.train_accuracy,
            "run": run.pk,
            "run_status": run.status,
            "score_first_steps": round(fmean(scores[:third]), 4) if scores else None,
            "score_last_steps": round(fmean(scores[-third:]), 4) if scores else None,
            "score_rose": bool(scores) and fmean(scores[-third:]) > fmean(scores[:third]),
            "seconds": round(time.monotonic() - started, 1),
        }
        self.stdout.write(json.dumps(summary))

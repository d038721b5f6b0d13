"""`python manage.py demo_reward_model`: RLHF on the demo functions through the running stack.

1. Preference pairs: each demo function's reference solution chosen over the same function with its
   constant off by one (the base model's habit, what a reviewer marks bad), on the train and
   held-out splits of a task-set version, as a reviews export or an import gives them.
2. A reward model trained on them by a learner process (the learner queue); its held-out pair
   accuracy, before training (the fresh head) and after.
3. GRPO runs (one per seed) whose reward is that reward model (`reward_model` grader, scored on the
   rollout workers): many prompts per step, a KL term to the starting policy, a small learning rate,
   advantages whitened within each group of completions (what makes the reward model's scale and
   each prompt's difficulty drop out). The rule is `multi`: its total is the reward model's score
   (`rm`), what GRPO learns from, and the unit tests run beside it (`tests`, weight 0), so the
   task's real pass rate is measured on the same completions: a policy that games the reward model
   shows a rising score and a falling pass rate.
4. The measure: each run's held-out evaluation before the first step and after the last (greedy
   decoding on the same fixed held-out prompts, none of them trained on by the reward model or the
   policy): the reward model's mean score and the real pass rate, not the noisy per-step means.
Prints one line of JSON last.
"""

import json
import re
import time
from statistics import fmean, pstdev

from django.conf import settings
from django.core.management.base import BaseCommand

from projects import services as project_services
from projects.demo_tasks import demo_task_sets
from projects.models import TaskSet
from reward_models import services
from reward_models.models import RewardModel, RewardModelVersion
from rewards import services as reward_services
from runs.demo import demo_ensure
from runs.lifecycle import RunRequest, run_create
from runs.models import MetricPoint, Run
from tiers.models import Tier

PAIRS_TASK_SET = "reward-model demo: preferences"
WAIT_SECONDS = 3600
EVAL_WAIT_SECONDS = 900
CONSTANT = re.compile(r"return .*?[-+*] (\d+)")


def off_by_one(solution: str, up: bool) -> str:
    """The solution with its constant one off: the rejected side of each pair.

    >>> off_by_one("def f(x):\\n    return x + 3\\n", up=True)
    'def f(x):\\n    return x + 4\\n'
    >>> off_by_one("def f(xs):\\n    return [v * 3 for v in xs]\\n", up=False)
    'def f(xs):\\n    return [v * 2 for v in xs]\\n'
    """
    found = CONSTANT.search(solution)
    if found is None:
        raise ValueError("the solution has no integer constant to move")
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


def demo_rule_spec(model: str, number: int) -> dict:
    """The reward model's score as the reward; the unit tests beside it, measured but weighted 0."""
    return {
        "type": "multi",
        "name": "rm-with-tests",
        "graders": {
            "rm": {"type": "reward_model", "name": "rm", "model": model, "version": number},
            "tests": {"type": "unit_tests", "name": "tests", "score": "all_pass"},
        },
        "calculate_output": "rm",
    }


def held_out(run: Run, step: int) -> dict[str, float] | None:
    """The run's held-out reward-model score and real pass rate at `step` (None while not written)."""
    names = {"heldout/reward/rm": "rm_score", "heldout/reward/tests": "pass_rate"}
    points = dict(MetricPoint.objects.filter(run=run, step=step, name__in=names).values_list("name", "value"))
    if len(points) < len(names):
        return None
    return {short: round(points[name], 4) for name, short in names.items()}


def thirds(values: list[float]) -> tuple[float | None, float | None]:
    """Means of the first and the last third of a per-step series."""
    if not values:
        return None, None
    third = max(1, len(values) // 3)
    return round(fmean(values[:third]), 4), round(fmean(values[-third:]), 4)


def series(run: Run, name: str) -> list[float]:
    return list(
        MetricPoint.objects.filter(run=run, name=name).order_by("step").values_list("value", flat=True)
    )


class Command(BaseCommand):
    help = (
        "Train a reward model on the demo's preference pairs, then GRPO against it, one run per seed, "
        "with the held-out reward-model score and pass rate before and after (the stack must be up)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--train-pairs", type=int, default=1000)
        parser.add_argument("--heldout-pairs", type=int, default=64, help="also the held-out prompts")
        parser.add_argument("--rm-learning-rate", type=float, default=1e-3)
        parser.add_argument("--rm-epochs", type=int, default=3)
        parser.add_argument("--rm-batch-size", type=int, default=16, help="pairs per reward-model step")
        parser.add_argument(
            "--reward-model-version", type=int, default=0, help="use this trained version (0: train one)"
        )
        parser.add_argument("--steps", type=int, default=30, help="GRPO steps per run")
        parser.add_argument("--batch-size", type=int, default=32, help="GRPO prompts per step")
        parser.add_argument("--group-size", type=int, default=8, help="completions per prompt")
        parser.add_argument("--learning-rate", type=float, default=1e-4, help="GRPO learning rate")
        parser.add_argument("--kl-coef", type=float, default=0.04, help="GRPO KL weight to the start")
        parser.add_argument(
            "--scale-rewards", choices=("group", "none"), default="group", help="whiten within each group"
        )
        parser.add_argument("--seeds", default="0,1", help="GRPO seeds, comma-separated: one run each")

    def handle(self, *args, **options) -> None:
        started = time.monotonic()
        user, project = demo_ensure(
            username=settings.FLYWHEEL_DEMO_USER, password=settings.FLYWHEEL_DEMO_PASSWORD
        )
        tier = Tier.objects.get(project=project, name="rollout")
        reward_model = RewardModel.objects.filter(project=project, name="demo-preferences").first()
        if reward_model is None:
            reward_model = services.reward_model_create(project=project, name="demo-preferences", by=user)
        if options["reward_model_version"]:
            version = reward_model.versions.get(number=options["reward_model_version"])
            pairs = version.task_set_version
        else:
            pairs, version = self.train(project, user, tier, reward_model, options)
        version.refresh_from_db()
        if version.status != RewardModelVersion.Status.SUCCEEDED:
            raise SystemExit(f"reward model training {version.status}: {version.error}")
        self.stdout.write(
            f"held-out pair accuracy {version.base_heldout_accuracy:.3f} (fresh head) -> "
            f"{version.heldout_accuracy:.3f} on {version.heldout_pairs} pairs (chance 0.5)"
        )
        spec = demo_rule_spec(reward_model.name, version.number)
        rule = project.reward_rules.filter(name="reward-model demo").first()
        if rule is None:
            rule = reward_services.reward_rule_create(
                project=project, name="reward-model demo", spec=spec, by=user
            )
        elif rule.versions.latest("number").spec != spec:
            rule = reward_services.reward_rule_update(rule=rule, by=user, spec=spec).rule
        rule_version = rule.versions.order_by("-number").first()
        runs = [
            self.grpo(project, user, tier, pairs, rule_version, version, seed, options)
            for seed in (int(seed) for seed in options["seeds"].split(","))
        ]
        lifts = [run["heldout_after"]["rm_score"] - run["heldout_before"]["rm_score"] for run in runs]
        summary = {
            "demo": "reward_model",
            "reward_model_version": version.pk,
            "train_pairs": version.train_pairs,
            "heldout_pairs": version.heldout_pairs,
            "heldout_accuracy_before": version.base_heldout_accuracy,
            "heldout_accuracy": version.heldout_accuracy,
            "train_accuracy": version.train_accuracy,
            "grpo": {
                name: options[name]
                for name in ("steps", "batch_size", "group_size", "learning_rate", "kl_coef", "scale_rewards")
            },
            "runs": runs,
            "heldout_rm_score_lift": [round(lift, 4) for lift in lifts],
            "heldout_rm_score_rose_every_seed": all(lift > 0 for lift in lifts),
            "seconds": round(time.monotonic() - started, 1),
        }
        self.stdout.write(json.dumps(summary))

    def train(self, project, user, tier, reward_model, options):
        task_set = TaskSet.objects.filter(project=project, name=PAIRS_TASK_SET).first()
        if task_set is None:
            task_set = project_services.task_set_create(project=project, name=PAIRS_TASK_SET, by=user)
        lines = pair_lines(train=options["train_pairs"], heldout=options["heldout_pairs"])
        pairs = project_services.task_set_import(
            task_set=task_set, stream=lines, file_format="jsonl", by=user
        ).version
        version = services.reward_model_train(
            reward_model=reward_model,
            task_set_version=pairs,
            by=user,
            tier=tier,
            hyperparameters={
                "learning_rate": options["rm_learning_rate"],
                "epochs": options["rm_epochs"],
                "batch_size": options["rm_batch_size"],
            },
        )
        self.stdout.write(f"training reward model {reward_model.name} v{version.number} ...")
        wait_for(lambda: RewardModelVersion.objects.get(pk=version.pk).is_terminal, "the reward model")
        return pairs, version

    def grpo(self, project, user, tier, pairs, rule_version, version, seed: int, options) -> dict:
        steps = options["steps"]
        run = run_create(
            request=RunRequest(
                project=project,
                name=f"GRPO against reward model v{version.number} (seed {seed})",
                task_set_version=pairs,
                reward_rule_version=rule_version,
                tier=tier,
                method="grpo",
                hyperparameters={
                    "group_size": options["group_size"],
                    "batch_size": options["batch_size"],
                    "learning_rate": options["learning_rate"],
                    "kl_coef": options["kl_coef"],
                    "scale_rewards": options["scale_rewards"],
                    "seed": seed,
                    "checkpoint_every": steps,
                    "eval_every": steps,
                    "eval_items": 0,  # every held-out prompt, the same ones before and after
                },
                max_steps=steps,
            ),
            by=user,
        )
        self.stdout.write(f"run {run.pk}: GRPO seed {seed}, {steps} steps ...")
        wait_for(lambda: Run.objects.get(pk=run.pk).is_terminal, f"run {run.pk}")
        run.refresh_from_db()
        if run.status != Run.Status.SUCCEEDED:
            raise SystemExit(f"run {run.pk} {run.status}: {run.error}")
        deadline = time.monotonic() + EVAL_WAIT_SECONDS
        while (before := held_out(run, 0)) is None or (after := held_out(run, run.learner_step)) is None:
            if time.monotonic() > deadline:
                raise SystemExit(f"run {run.pk}: its held-out evaluations did not land")
            time.sleep(1)  # the eval queue's work, reported as it lands
        scores, passes = series(run, "reward/rm"), series(run, "reward/tests")
        for step, (score, passed) in enumerate(zip(scores, passes, strict=False), start=1):
            self.stdout.write(f"  step {step:3d}: mean rm score {score:+.3f}, pass rate {passed:.3f}")
        self.stdout.write(
            f"  held out: rm score {before['rm_score']:+.3f} -> {after['rm_score']:+.3f}, "
            f"pass rate {before['pass_rate']:.3f} -> {after['pass_rate']:.3f}"
        )
        return {
            "run": run.pk,
            "seed": seed,
            "steps": run.learner_step,
            "heldout_before": before,
            "heldout_after": after,
            "train_rm_score_first_last_third": thirds(scores),
            "train_pass_rate_first_last_third": thirds(passes),
            "train_rm_score_step_std": round(pstdev(scores), 4) if len(scores) > 1 else None,
        }

"""`make demo-flywheel`: the loop the product is named for, on the demo project, through the running
stack (`make up`).

1. A short GRPO run on the demo functions (unit-test rewards; one step by default, so that its
   held-out pass rate leaves room and its samples hold failures), followed to its end.
2. A reviewer labels a handful of its failures bad, and passing completions of the same prompts good
   (the reviews a person would make; here the labels follow the unit tests' verdicts).
3. Train on reviews: a new task-set version from those labels and an SFT (or DPO) run on it from
   the GRPO run's final checkpoint.
4. Both runs' held-out pass rates (the same 160 held-out items), and the rate of the failure class
   the labels name (the constant off by one, the corpus's habit) among the reviewed failures.
Prints one line of JSON last.
"""

import json
import re
import time
from collections import defaultdict

from django.conf import settings
from django.core.management.base import BaseCommand
from tqdm import tqdm

from reviews import services as review_services
from reviews import training
from runs.demo import DEMO_FUNCTIONS, DEMO_RUN_HYPERPARAMETERS, demo_ensure
from runs.lifecycle import RunRequest, run_create
from runs.models import MetricPoint, Run, TaskSet, Tier, Trajectory

HELDOUT = "heldout/pass_rate"
EVAL_WAIT_SECONDS = 600


def grpo_launch(project, user, steps: int) -> Run:
    """The demo's GRPO run (launch_demo's), shortened to `steps` so reviews have failures to fix."""
    task_set = TaskSet.objects.get(project=project, name=DEMO_FUNCTIONS)
    hyper = DEMO_RUN_HYPERPARAMETERS | {"checkpoint_every": steps, "eval_every": steps}
    request = RunRequest(
        project=project,
        name=f"GRPO demo ({steps} steps)",
        task_set_version=task_set.versions.first(),
        reward_rule_version=project.reward_rules.get(name="unit-tests").versions.order_by("-number").first(),
        tier=Tier.objects.get(project=project, name="rollout"),
        method="grpo",
        hyperparameters=hyper,
        max_steps=steps,
    )
    return run_create(request=request, by=user)


class Command(BaseCommand):
    help = (
        "GRPO on the demo, label a handful of its failures, Train on reviews, and compare both runs' "
        "held-out pass rates (make demo-flywheel; the stack must be up)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--grpo-steps", type=int, default=1, help="short, so the reviews find failures")
        parser.add_argument(
            "--labels", type=int, default=24, help="at most this many failures labelled (and passes)"
        )
        parser.add_argument("--method", choices=("sft", "dpo"), default="sft")
        parser.add_argument("--steps", type=int, default=6, help="steps of the run on the reviews")
        parser.add_argument(
            "--hp",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="a hyperparameter of the second run",
        )

    def handle(
        self, *args, grpo_steps: int, labels: int, method: str, steps: int, hp: list[str], **options
    ) -> None:
        user, project = demo_ensure(
            username=settings.FLYWHEEL_DEMO_USER, password=settings.FLYWHEEL_DEMO_PASSWORD
        )
        first = grpo_launch(project, user, grpo_steps)
        first = self.follow(first.pk, "GRPO")
        labelled = self.label(first, user, labels)
        hyperparameters = {name: json.loads(value) for name, _, value in (pair.partition("=") for pair in hp)}
        result = training.train_on_reviews(
            run=first, by=user, method=method, max_steps=steps, hyperparameters=hyperparameters
        )
        self.stdout.write(f"train on reviews: {result.version} {result.counts}")
        second = self.follow(result.run.pk, f"{method.upper()} on reviews")
        rates = {run.pk: self.final_rate(run) for run in (first, second)}
        summary = {
            "demo": "flywheel",
            "first_run": first.pk,
            "first_method": "grpo",
            "first_steps": first.learner_step,
            "first_heldout_pass_rate": rates[first.pk],
            "labels": labelled,
            "second_run": second.pk,
            "second_method": method,
            "second_steps": second.learner_step,
            "second_heldout_pass_rate": rates[second.pk],
            "trained_on": result.counts,
            "lift_points": round(100 * (rates[second.pk] - rates[first.pk]), 2)
            if None not in rates.values()
            else None,
            "second_beats_first": None not in rates.values() and rates[second.pk] > rates[first.pk],
            "compare": f"/runs/compare/?runs={second.pk},{first.pk}&metric={HELDOUT}",
        }
        self.stdout.write(json.dumps(summary))

    def follow(self, run_id: int, what: str) -> Run:
        run = Run.objects.get(pk=run_id)
        with tqdm(total=run.max_steps, desc=what, unit="step") as bar:
            while not run.is_terminal:
                time.sleep(1)  # following progress for a person, not synchronising anything
                run.refresh_from_db()
                bar.n = run.learner_step
                bar.refresh()
        if run.status != Run.Status.SUCCEEDED:
            raise SystemExit(f"run {run.pk} {run.status}: {run.error}")
        return run

    def final_rate(self, run: Run) -> float | None:
        """The held-out pass rate at the run's last step (its evaluation runs on the eval queue)."""
        deadline = time.monotonic() + EVAL_WAIT_SECONDS
        while time.monotonic() < deadline:
            point = MetricPoint.objects.filter(run=run, name=HELDOUT, step=run.learner_step).first()
            if point is not None:
                return round(point.value, 4)
            time.sleep(1)  # waiting for another process's evaluation, reported as it lands
        return None

    def label(self, run: Run, user, count: int) -> dict:
        """Bad labels on failures of the run's last steps, good ones on passes of the same prompts."""
        threshold = float(run.resolved.get("pass_threshold", 1.0))
        recent = Trajectory.objects.filter(run=run, outcome="scored").select_related("item").order_by("-pk")
        by_item = defaultdict(lambda: {"pass": [], "fail": []})
        for trajectory in recent[:2000]:
            side = "pass" if (trajectory.reward or 0.0) >= threshold else "fail"
            by_item[trajectory.item_id][side].append(trajectory)
        bad = good = off_by_one = 0
        for sides in by_item.values():
            if bad >= count:
                break
            if not sides["fail"] or not sides["pass"]:
                continue
            failure, success = sides["fail"][0], sides["pass"][0]
            review_services.review_save(trajectory=failure, by=user, label="bad", comment="wrong constant")
            review_services.review_save(trajectory=success, by=user, label="good")
            bad, good = bad + 1, good + 1
            off_by_one += _off_by_one(failure.completion_text, success.completion_text)
        return {"bad": bad, "good": good, "failure_class": "constant off by one", "off_by_one": off_by_one}


def _off_by_one(wrong: str, right: str) -> int:
    """1 when the failing solution differs from the passing one only by a constant one apart.

    >>> _off_by_one("return x + 2", "return x + 3"), _off_by_one("return x * 3", "return x + 3")
    (1, 0)
    """
    numbers = [re.findall(r"-?\d+", text) for text in (wrong, right)]
    if len(numbers[0]) != len(numbers[1]) or re.sub(r"-?\d+", "#", wrong) != re.sub(r"-?\d+", "#", right):
        return 0
    return int(any(abs(int(a) - int(b)) == 1 for a, b in zip(*numbers, strict=True)))

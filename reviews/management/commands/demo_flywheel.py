"""`make demo-flywheel`: the loop the product is named for, on the demo project, through the running
stack (`make up`), measured against its control.

1. A short GRPO run on the demo functions (unit-test rewards; one step by default, so that its
   held-out pass rate leaves room), followed to its end.
2. A scripted reviewer labels its completions. It reads only the completion text (never the reward,
   the tests or their verdicts) and applies a house style rule (`style_review`): a short, idiomatic
   solution, one function whose body is a single `return`, with no dead code and nothing around it,
   is good; code that does not parse, code after the return, extra statements or top-level code
   are bad. Per prompt it labels one good completion, and one bad one where there is one.
3. Train on reviews: a new task-set version from those labels and an SFT (or DPO) run on it from the
   GRPO run's final checkpoint, and its control: that checkpoint continued for the same steps by
   GRPO with the same settings, without the reviews.
4. The parent checkpoint's, the control's and the reviews run's held-out pass rates (the same
   held-out items), and the paired bootstrap interval of the reviews run against its control.
Prints one line of JSON last.
"""

import ast
import json
import time
from collections import defaultdict

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from projects.models import TaskSet
from reviews import results, training
from reviews import services as review_services
from runs.demo import DEMO_FUNCTIONS, DEMO_RUN_HYPERPARAMETERS, demo_ensure
from runs.lifecycle import RunRequest, run_create
from runs.models import Run, Trajectory
from tiers.models import Tier

HELDOUT = "heldout/pass_rate"


def grpo_launch(project, user, steps: int, seed: int) -> Run:
    """The demo's GRPO run (launch_demo's), shortened to `steps` so reviews have failures to fix."""
    task_set = TaskSet.objects.get(project=project, name=DEMO_FUNCTIONS)
    version = task_set.versions.first()  # the newest
    if version is None:
        raise CommandError(f"task set {DEMO_FUNCTIONS} has no version: run make demo first")
    hyper = DEMO_RUN_HYPERPARAMETERS | {"checkpoint_every": steps, "eval_every": steps, "seed": seed}
    request = RunRequest(
        project=project,
        name=f"GRPO demo ({steps} steps, seed {seed})",
        task_set_version=version,
        reward_rule_version=project.reward_rules.get(name="unit-tests").versions.order_by("-number").first(),
        tier=Tier.objects.get(project=project, name="rollout"),
        method="grpo",
        hyperparameters=hyper,
        max_steps=steps,
    )
    return run_create(request=request, by=user)


class Command(BaseCommand):
    help = (
        "GRPO on the demo, a scripted style reviewer labels its completions, Train on reviews with its "
        "control, and the reviews run's held-out lift over the control (make demo-flywheel; the stack "
        "must be up)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--grpo-steps", type=int, default=1, help="short, so the reviews find failures")
        parser.add_argument("--labels", type=int, default=24, help="at most this many prompts labelled")
        parser.add_argument("--method", choices=("sft", "dpo"), default="sft")
        parser.add_argument("--steps", type=int, default=6, help="steps of the run on the reviews")
        parser.add_argument("--seed", type=int, default=0, help="the GRPO run's seed (its children keep it)")
        parser.add_argument(
            "--hp",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="a hyperparameter of the run on the reviews",
        )

    def handle(
        self,
        *args,
        grpo_steps: int,
        labels: int,
        method: str,
        steps: int,
        seed: int,
        hp: list[str],
        **options,
    ) -> None:
        started = time.monotonic()
        user, project = demo_ensure(
            username=settings.FLYWHEEL_DEMO_USER, password=settings.FLYWHEEL_DEMO_PASSWORD
        )
        first = self.follow(grpo_launch(project, user, grpo_steps, seed).pk, "GRPO")
        labelled = self.label(first, user, labels)
        hyperparameters = {name: json.loads(value) for name, _, value in (pair.partition("=") for pair in hp)}
        made = training.train_on_reviews(
            run=first, by=user, method=method, max_steps=steps, hyperparameters=hyperparameters
        )
        self.stdout.write(f"train on reviews: {made.version} {made.counts}; control: run {made.control.pk}")
        self.follow(made.run.pk, f"{method.upper()} on reviews", succeed=False)
        self.follow(made.control.pk, "control (GRPO)", succeed=False)
        made.training.refresh_from_db()
        result = results.review_training_result(made.training)
        reviews_run, control, lift = result["run"], result["control"], result["lift_over_control"]
        summary = {
            "demo": "flywheel",
            "seed": seed,
            "parent_run": first.pk,
            "parent_steps": first.learner_step,
            "parent_heldout_pass_rate": reviews_run["before"],
            "reviewer": "style rule on the completion text (see style_review)",
            "labels": labelled,
            "trained_on": made.counts,
            "reviews_run": reviews_run["run"],
            "reviews_method": method,
            "reviews_steps": steps,
            "reviews_heldout_pass_rate": reviews_run["after"],
            "reviews_outcome": reviews_run["outcome"],
            "control_run": control["run"],
            "control_method": first.method,
            "control_heldout_pass_rate": control["after"],
            "control_outcome": control["outcome"],
            "lift_over_control_points": None if lift is None else round(100 * lift["delta"], 2),
            "lift_interval_points": None
            if lift is None
            else [round(100 * lift["low"], 2), round(100 * lift["high"], 2)],
            "heldout_items": None if lift is None else lift["items"],
            "verdict": None if lift is None else lift["verdict"],
            "flags": result["flags"],
            "seconds": round(time.monotonic() - started),
            "compare": result["compare_url"] + f"&metric={HELDOUT}",
        }
        self.stdout.write(json.dumps(summary))

    def follow(self, run_id: int, what: str, succeed: bool = True) -> Run:
        run = Run.objects.get(pk=run_id)
        with tqdm(total=run.max_steps, desc=what, unit="step") as bar:
            while not run.is_terminal:
                time.sleep(1)  # following progress for a person, not synchronising anything
                run.refresh_from_db()
                bar.n = run.learner_step
                bar.refresh()
        if succeed and run.status != Run.Status.SUCCEEDED:
            raise SystemExit(f"run {run.pk} {run.status}: {run.error}")
        return run

    def label(self, run: Run, user, count: int) -> dict:
        """The style reviewer on the run's last completions: per prompt, one good completion and,
        where there is one, one bad, with the reason as the comment. Rewards are never read."""
        recent = Trajectory.objects.filter(run=run, outcome="scored").order_by("-pk")
        by_item: defaultdict[int, dict[str, list[tuple[Trajectory, str]]]] = defaultdict(
            lambda: {"good": [], "bad": []}
        )
        for trajectory in recent[:2000]:
            verdict, why = style_review(trajectory.completion_text)
            by_item[trajectory.item_id][verdict].append((trajectory, why))
        good = bad = 0
        reasons: dict[str, int] = defaultdict(int)
        for sides in by_item.values():
            if good >= count:
                break
            if not sides["good"]:
                continue
            review_services.review_save(trajectory=sides["good"][0][0], by=user, label="good", comment="")
            good += 1
            if sides["bad"]:
                trajectory, why = sides["bad"][0]
                review_services.review_save(trajectory=trajectory, by=user, label="bad", comment=why)
                bad += 1
                reasons[why] += 1
        return {"good": good, "bad": bad, "bad_because": dict(reasons)}


def style_review(text: str) -> tuple[str, str]:
    """A reviewer's house style, read from the completion text alone: one function whose body is a
    single `return` of an expression (a docstring allowed), nothing else at the top level, no dead
    code. Says nothing about whether the function is right: that is what the tests are for.

    >>> style_review("def f(x):\\n    return x + 3\\n")
    ('good', '')
    >>> style_review("def f(x):\\n    y = x + 3\\n    return y\\n")
    ('bad', 'more than a single return')
    >>> style_review("def f(x):\\n    return x + 3\\n    return x\\n")
    ('bad', 'dead code after the return')
    >>> style_review("def f(x):\\n    return x +\\n")
    ('bad', 'does not parse')
    """
    try:
        module = ast.parse(text)
    except (SyntaxError, ValueError):
        return "bad", "does not parse"
    functions = [node for node in module.body if isinstance(node, ast.FunctionDef)]
    if len(functions) != 1 or len(module.body) != 1:
        return "bad", "code outside the one function"
    body = functions[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # a docstring is welcome
    if not body or not isinstance(body[0], ast.Return) or body[0].value is None:
        return "bad", "more than a single return"
    if len(body) > 1:
        return "bad", "dead code after the return"
    return "good", ""

"""`python manage.py train_demo`: the RL demo. GRPO on the demo task family, base vs trained pass rates.

Trains on scalar items only and evaluates the held-out split of both kinds, so the map kind
measures whether the lift transfers to a kind of task RL never trained on. Prints one JSON report.
"""

import json
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from inference.policy import policy_load
from projects.demo_tasks import demo_task_sets
from workers.evaluation import pass_rates
from workers.learners.grpo import GRPOConfig, train_grpo


class Command(BaseCommand):
    help = (
        "GRPO on the demo task family with sandboxed unit-test rewards; reports held-out pass rates per kind."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        home = Path(settings.FLYWHEEL_HOME)
        parser.add_argument("--model", default=str(home / "models" / "tiny-base"))
        parser.add_argument("--out", default=str(home / "runs" / "grpo-demo"))
        parser.add_argument("--seed", type=int, default=0, help="learner seed (sampling, item order)")
        parser.add_argument("--task-seed", type=int, default=0, help="seed of the train / held-out split")
        parser.add_argument("--steps", type=int, default=40)
        parser.add_argument("--time-budget", type=float, default=300.0, help="seconds of training at most")
        parser.add_argument("--train-kinds", default="scalar", help="comma-separated kinds RL trains on")
        parser.add_argument("--heldout-size", type=int, default=160)
        parser.add_argument("--group-size", type=int, default=8)
        parser.add_argument("--prompts-per-step", type=int, default=16)
        parser.add_argument("--learning-rate", type=float, default=3e-4)
        parser.add_argument("--lr-scheduler", default="linear")
        parser.add_argument("--beta", type=float, default=0.0)

    def handle(self, *args, **options) -> None:
        kinds = tuple(options["train_kinds"].split(","))
        sets = demo_task_sets(
            seed=options["task_seed"], train_size=100_000, heldout_size=options["heldout_size"], kinds=kinds
        )
        base = pass_rates(policy_load(options["model"]), sets["heldout"])
        self.stdout.write(f"base held-out pass rate: {json.dumps(base.as_dict())}")
        config = GRPOConfig(
            model=options["model"],
            output_dir=options["out"],
            seed=options["seed"],
            steps=options["steps"],
            learning_rate=options["learning_rate"],
            lr_scheduler=options["lr_scheduler"],
            beta=options["beta"],
            group_size=options["group_size"],
            prompts_per_step=options["prompts_per_step"],
            time_budget_s=options["time_budget"],
            log_every=5,
        )
        started = time.monotonic()
        result = train_grpo(config, sets["train"], log=self.stdout.write)
        seconds = time.monotonic() - started
        final = pass_rates(policy_load(Path(options["out"]) / "final"), sets["heldout"])
        report = {
            "seed": options["seed"],
            "task_seed": options["task_seed"],
            "train_kinds": list(kinds),
            "train_items": len(sets["train"]),
            "heldout_items": len(sets["heldout"]),
            "steps": result.steps,
            "train_seconds": round(seconds, 1),
            "base": base.as_dict(),
            "final": final.as_dict(),
            "lift_points": round(100 * (final.overall - base.overall), 1),
        }
        self.stdout.write(json.dumps(report))

"""`python manage.py train_learner METHOD --data FILE.jsonl --config JSON`: one offline training run.

METHOD is a registered algorithm whose learner module trains on its own (`CONFIG` and
`train_standalone`): `sft` (task items with a `reference_solution`, or prompt / completion
records), `dpo` (`prompt` / `chosen` / `rejected` pairs) or `grpo` (code task items, graded by their
unit tests in the sandbox). `--config` holds the method's config fields as JSON (`model` and `output_dir` at
least); a run with complete checkpoints in its `output_dir` resumes from the latest. The same
command runs unchanged under `accelerate launch` (one or many processes, CPU or GPUs):

    accelerate launch --num_processes 1 --cpu manage.py train_learner sft --data items.jsonl \\
        --config '{"model": "/path/to/tiny-base", "output_dir": "/tmp/sft", "steps": 20}'

Prints one line of JSON at the end: the method, steps, seconds and the last step's metrics.
"""

import importlib
import json
from collections.abc import Callable
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.learners import algorithms
from workers.learners.common import TrainResult


def standalone_methods() -> dict[str, tuple[type, Callable[..., TrainResult]]]:
    """{method: (config class, train function)} of every algorithm that trains outside a run."""
    methods = {}
    for algorithm in algorithms():
        module = importlib.import_module(algorithm.learner)
        if hasattr(module, "train_standalone"):
            methods[algorithm.name] = (module.CONFIG, module.train_standalone)
    return methods


def records_load(path: Path) -> list[dict]:
    """The JSONL file's records; an unreadable line is reported with its number."""
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise CommandError(f"{path}:{number}: not a JSON object: {exc.msg}") from exc
    return records


class Command(BaseCommand):
    help = "Train a policy offline with SFT, DPO or GRPO from a JSONL file; resumes from its checkpoints."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("method", choices=sorted(standalone_methods()))
        parser.add_argument("--data", required=True, type=Path, help="JSONL: items, examples or pairs")
        parser.add_argument("--config", required=True, help="the method's config fields as a JSON object")

    def handle(self, *args, method: str, data: Path, config: str, **options) -> None:
        config_class, train = standalone_methods()[method]
        try:
            settings = config_class(**json.loads(config))
        except (json.JSONDecodeError, TypeError, ValueError) as exc:
            raise CommandError(f"--config: {exc}") from exc
        result = train(
            settings, records_load(data), log=lambda line: self.stdout.write(line) or self.stdout.flush()
        )
        last = {k: v for k, v in (result.history[-1] if result.history else {}).items() if k != "step"}
        self.stdout.write(
            json.dumps({"method": method, "steps": result.steps, "seconds": round(result.seconds, 2), **last})
        )

"""`python manage.py build_draft_model`: a 1-layer draft model for speculative decoding, with the
tiny base model's tokenizer, trained on its corpus."""

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from workers.draft_model import DRAFT_CONFIG, draft_model_build


class Command(BaseCommand):
    help = "Build a small draft model sharing the tiny base model's tokenizer (for speculative decoding)."

    def add_arguments(self, parser: CommandParser) -> None:
        models = Path(settings.FLYWHEEL_HOME) / "models"
        parser.add_argument("--base", type=Path, default=models / "tiny-base", help="the base model's folder")
        parser.add_argument("--out", type=Path, default=models / "tiny-draft", help="where to save the draft")
        parser.add_argument("--steps", type=int, default=DRAFT_CONFIG.steps)

    def handle(self, *args, **options) -> None:
        from dataclasses import replace

        config = replace(DRAFT_CONFIG, steps=options["steps"])
        report = draft_model_build(options["base"], options["out"], config, log=self.stdout.write)
        self.stdout.write(
            f"saved a {report['parameters']}-parameter draft to {options['out']} in {report['seconds']} s "
            f"(final loss {report['final_loss']})"
        )

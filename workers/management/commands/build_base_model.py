"""`python manage.py build_base_model`: pretrain the tiny base model from a seed and save it."""

from dataclasses import fields
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from workers.base_model import BaseModelConfig, base_model_build


def default_model_dir() -> Path:
    return Path(settings.FLYWHEEL_HOME) / "models" / "tiny-base"


class Command(BaseCommand):
    help = (
        "Build the tiny base model (synthetic corpus, tokenizer, small Llama) deterministically from a seed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--out", type=Path, default=None, help="directory (default: FLYWHEEL_HOME/models/tiny-base)"
        )
        defaults = BaseModelConfig()
        for field in fields(BaseModelConfig):
            flag = "--" + field.name.replace("_", "-")
            parser.add_argument(
                flag, type=type(getattr(defaults, field.name)), default=getattr(defaults, field.name)
            )

    def handle(self, *args, **options) -> None:
        config = BaseModelConfig(**{field.name: options[field.name] for field in fields(BaseModelConfig)})
        out = options["out"] or default_model_dir()
        report = base_model_build(out, config, log=self.stdout.write)
        self.stdout.write(
            f"saved {report['parameters']} parameters to {out} in {report['seconds']} s "
            f"(final loss {report['final_loss']})"
        )

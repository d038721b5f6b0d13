import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from runs import checkpoint_exports
from runs.models import Checkpoint


class Command(BaseCommand):
    help = (
        "Export the checkpoint of run RUN_ID at STEP as a save_pretrained folder with a model card "
        "(README.md), or as an archive with --archive. A LoRA run's adapter is merged into its base "
        "unless --weights adapter."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("run_id", type=int)
        parser.add_argument("step", type=int)
        parser.add_argument("--out", required=True, help="The folder (or archive) to write; must not exist")
        parser.add_argument("--weights", choices=checkpoint_exports.WEIGHTS, default="full")
        parser.add_argument("--archive", choices=list(checkpoint_exports.ARCHIVES), default=None)
        parser.add_argument("--no-progress", action="store_true", help="No progress bar")

    def handle(self, *args, run_id: int, step: int, out: str, weights: str, archive: str | None, **options):
        checkpoint = Checkpoint.objects.select_related("run").filter(run_id=run_id, step=step).first()
        if checkpoint is None:
            raise CommandError(f"run {run_id} has no checkpoint at step {step}")
        target = Path(out)
        if target.exists():
            raise CommandError(f"{target} already exists; choose another --out or remove it")
        try:
            plan = checkpoint_exports.export_plan(checkpoint, weights)
        except checkpoint_exports.ExportError as exc:
            raise CommandError(str(exc)) from exc
        total = checkpoint_exports.entries_size(plan.entries)
        with tqdm(
            total=total,
            unit="B",
            unit_scale=True,
            desc=plan.name,
            file=sys.stderr,
            disable=options["no_progress"],
        ) as bar:
            if archive is None:
                checkpoint_exports.folder_write(plan.entries, target, progress=bar.update)
            else:
                with open(target, "wb") as handle:
                    for chunk in checkpoint_exports.archive_chunks(
                        plan.entries, plan.name, archive, bar.update
                    ):
                        handle.write(chunk)
        self.stdout.write(f"exported run {run_id} step {step} ({weights} weights) to {target}")

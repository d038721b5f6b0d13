import os

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from projects import selectors as project_selectors
from projects import services as project_services
from projects.models import Project, TaskSet
from projects.task_format import IMPORT_FORMATS, resolve_format
from rewards.references import references_verify
from runs.management.commands.verify_references import progress_stream, stub_check_with_bar, summary


class Command(BaseCommand):
    help = "Import a JSONL or CSV file as a new version of a task set (created if missing)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("project", help="Project name")
        parser.add_argument("task_set", help="Task set name")
        parser.add_argument("file", help="Path to a .jsonl or .csv file")
        parser.add_argument("--user", required=True, help="Who imports it (needs launcher or owner role)")
        parser.add_argument(
            "--format",
            choices=IMPORT_FORMATS,
            default="auto",
            help="auto (default): CSV or JSONL from the file name, and each JSONL line in Flywheel's "
            "format or a published one (HumanEval, MBPP, APPS, CodeContests, LiveCodeBench) recognised "
            "by its fields; flywheel: only Flywheel's lines; humaneval, mbpp, apps, codecontests, "
            "livecodebench: every line in that format",
        )
        parser.add_argument("--split-seed", type=int)
        parser.add_argument("--heldout-fraction", type=float)
        parser.add_argument("--dry-run", action="store_true", help="Validate and report; import nothing")
        parser.add_argument(
            "--verify-references",
            action="store_true",
            help="Then run each code item's reference_solution against its tests and name the broken ones",
        )

    def handle(self, *args, **opts) -> None:
        user = get_user_model().objects.filter(username=opts["user"]).first()
        project = Project.objects.filter(name=opts["project"]).first()
        if user is None or project is None:
            raise CommandError("no such user" if user is None else f"no project named {opts['project']!r}")
        if not project.memberships.filter(user=user, role__in=["owner", "launcher"]).exists():
            raise CommandError(
                f"{user.username} may not import into {project.name} (needs launcher or owner)"
            )
        task_set = TaskSet.objects.filter(project=project, name=opts["task_set"]).first()
        path = opts["file"]
        file_format, preset = resolve_format(opts["format"], path)
        options = {
            "file_format": file_format,
            "preset": preset,
            "by": user,
            "source_name": os.path.basename(path),
            "split_seed": opts["split_seed"],
            "heldout_fraction": opts["heldout_fraction"],
            "stub_check_enqueue": False,  # run here, with a progress bar
        }
        try:
            if task_set is None:  # created only with its first version: a failed import leaves no set
                task_set, report = project_services.task_set_create_with_import(
                    project=project,
                    name=opts["task_set"],
                    open_stream=lambda: self._read(path),
                    dry_run=opts["dry_run"],  # a dry run validates as a new set's file; creates nothing
                    **options,
                )
            else:
                with open(path, "rb") as handle:
                    report = project_services.task_set_import(
                        task_set=task_set, stream=self._read(path, handle), dry_run=opts["dry_run"], **options
                    )
        except ValidationError as exc:
            raise CommandError(
                "; ".join(f"{k}: {', '.join(v)}" for k, v in exc.message_dict.items())
            ) from None
        if not report.ok:
            for error in report.errors:
                self.stderr.write(f"{path}: {error}")
            raise CommandError(f"{report.error_count} errors; nothing was imported")
        if opts["dry_run"]:
            self.stdout.write(f"valid: {report.item_count} items {report.kind_counts} {report.split_counts}")
            return
        version = report.version
        assert task_set is not None and version is not None  # an import that went through made both
        if report.created:
            self.stdout.write(f"created version {version.number} with {report.item_count} items")
        else:
            self.stdout.write(f"identical to version {version.number}; no new version created")
        if report.created and version.stub_check_status:
            stub_check_with_bar(self, version)
        if opts["verify_references"]:
            items = project_selectors.grading_items_of(version=version)
            with tqdm(total=len(items), unit="item", desc="references", file=progress_stream(self)) as bar:
                references = references_verify(items, progress=lambda: bar.update(1))
            self.stdout.write(summary(task_set.name, version.number, references))
            if references.broken:
                raise CommandError(f"imported, but {len(references.broken)} references are broken")

    def _read(self, path: str, handle=None):
        """The file's lines, with a progress bar; opened here when no handle is given."""
        if handle is None:
            with open(path, "rb") as opened:
                yield from self._read(path, opened)
            return
        with tqdm(total=os.path.getsize(path), unit="B", unit_scale=True, file=progress_stream(self)) as bar:
            for line in handle:
                bar.update(len(line))
                yield line

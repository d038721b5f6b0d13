import json

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from projects import selectors as project_selectors
from projects.models import TaskSet, TaskSetVersion
from rewards.references import ReferenceReport, references_verify
from rewards.stub_checks import version_stub_check_run


class Command(BaseCommand):
    help = (
        "Verify references: run each code item's reference_solution against its own tests in the "
        "sandbox, with a progress bar; name every broken item. Exits 1 when any is broken."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("project", help="Project name")
        parser.add_argument("task_set", help="Task set name")
        parser.add_argument("--set-version", type=int, help="Version number (default: the latest)")
        parser.add_argument("--json", action="store_true", help="Print the report as one line of JSON")

    def handle(self, *args, **opts) -> None:
        task_set = TaskSet.objects.filter(project__name=opts["project"], name=opts["task_set"]).first()
        if task_set is None:
            raise CommandError(f"no task set {opts['task_set']!r} in a project {opts['project']!r}")
        versions = task_set.versions.order_by("-number")
        version = (
            versions.filter(number=opts["set_version"]).first() if opts["set_version"] else versions.first()
        )
        if version is None:
            raise CommandError(f"{task_set.name} has no version {opts['set_version'] or ''}".rstrip())
        stub_check_with_bar(self, version)
        items = project_selectors.grading_items_of(version=version)
        with tqdm(total=len(items), unit="item", desc="references", file=progress_stream(self)) as bar:
            report = references_verify(items, progress=lambda: bar.update(1))
        if opts["json"]:
            self.stdout.write(json.dumps(report.to_dict()))
        else:
            self.stdout.write(summary(task_set.name, version.number, report))
        if report.broken:
            raise CommandError(f"{len(report.broken)} broken references")


def stub_check_with_bar(command: BaseCommand, version: TaskSetVersion) -> None:
    """The version's stub check (its items not checked yet), with a progress bar; each item whose
    every test a stub passes is named, by line, on stderr."""
    todo = version.items.filter(kind="code", stub_check__isnull=True).count()
    with tqdm(total=todo, unit="item", desc="stub check", file=progress_stream(command)) as bar:
        warnings = version_stub_check_run(version_id=version.pk, progress=bar.update)
    for warning in warnings:
        command.stderr.write(f"warning: {warning}")


def progress_stream(command: BaseCommand):
    """The stream under the command's stderr (its wrapper would end each bar update with a newline)."""
    return getattr(command.stderr, "_out", command.stderr)


def summary(name: str, number: int | None, report: ReferenceReport) -> str:
    lines = [
        f"{name} v{number}: {report.checked} references checked, {report.passed} pass, "
        f"{len(report.broken)} broken, {report.errored} errored, {report.skipped} items without one"
    ]
    lines += [f"  broken: {check.item}: {check.reason}" for check in report.broken]
    lines += [
        f"  no credit: a stub passes every test of {item}: it can only ever pay 0"
        for item in report.stub_passes_every_test
    ]
    lines += [f"  errored: {check.item}: {check.reason}" for check in report.errors]
    return "\n".join(lines)

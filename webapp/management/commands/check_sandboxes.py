"""`python manage.py check_sandboxes`: start a sandbox of each backend and grade a check in it."""

import json

from django.core.management.base import BaseCommand, CommandError, CommandParser

from sandboxes.config import BACKENDS, sandbox_settings
from sandboxes.services import SandboxCheck, sandbox_check
from webapp.health import sandbox_check_record


def describe(check: SandboxCheck) -> str:
    if not check.ok:
        return f"{check.backend:<11} FAILED  {check.detail}"
    isolation = [f"seccomp {check.seccomp}"]
    if check.cgroup is not None:
        isolation.append("a cgroup per sandbox" if check.cgroup else "rlimits only (no cgroup)")
    return (
        f"{check.backend:<11} ok      start {check.start_ms:g} ms, check {check.check_ms:g} ms, "
        + ", ".join(isolation)
    )


class Command(BaseCommand):
    help = "Start a sandbox and grade a small check in it, per backend; exits 1 if one fails."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--backend",
            choices=[*BACKENDS, "all"],
            help="which backend to check (default: the configured FLYWHEEL_SANDBOX_BACKEND)",
        )
        parser.add_argument("--json", action="store_true", help="print one line of JSON instead")
        parser.add_argument("--record", metavar="WORKER", help="keep the result for /healthz under WORKER")

    def handle(self, *args, **options) -> None:
        chosen = options["backend"] or sandbox_settings().backend
        checks = [sandbox_check(backend) for backend in (BACKENDS if chosen == "all" else (chosen,))]
        if options["json"]:
            self.stdout.write(json.dumps([check.as_dict() for check in checks]))
        else:
            for check in checks:
                self.stdout.write(describe(check))
        if options["record"]:
            sandbox_check_record(options["record"], [check.as_dict() for check in checks])
        failed = [check.backend for check in checks if not check.ok]
        if failed:
            raise CommandError(f"sandboxes not usable on this host: {', '.join(failed)}")

import os

from django.conf import settings
from django.core.management.base import BaseCommand

from webapp import stack


class Command(BaseCommand):
    help = "Stop everything `make up` started (what `make down` runs)."

    def handle(self, *args, **options) -> None:
        # The supervisor stops its services in reverse order (Redis last), then exits.
        stopped = stack.process_stop("supervisor", timeout=stack.STOP_GRACE_SECONDS * 3)
        self.stdout.write(f"supervisor: {'stopped' if stopped else 'not running'}")
        # Whatever an older stack (or a supervisor that was killed) left running.
        names = [service.name for service in stack.services()]
        if settings.EMBEDDED_REDIS:  # last: workers flush their state to it while stopping
            names = [name for name in names if name != "redis"] + ["redis"]
        for name in names:
            if name == "redis":
                self._stragglers_stop()
            stopped = stack.process_stop(name)
            self.stdout.write(f"{name}: {'stopped' if stopped else 'not running'}")
        self._stragglers_stop()  # and anything of this stack's that is left: none survives

    def _stragglers_stop(self) -> None:
        """Learners, spare learners and whatever else the services started, reparented to init when
        their worker went; they carry the stack's mark (webapp/stack.py)."""
        keep = {os.getpid(), os.getppid()}
        if redis := stack.pid_of("redis"):
            keep.add(redis)
        if pids := stack.stack_processes_stop(settings.FLYWHEEL_HOME, exclude=keep):
            self.stdout.write(f"stopped {len(pids)} processes the services had started: {pids}")

from django.conf import settings
from django.core.management.base import BaseCommand

from webapp import stack


class Command(BaseCommand):
    help = "Stop everything `make up` started (what `make down` runs)."

    def handle(self, *args, **options) -> None:
        names = [service.name for service in stack.services()]
        if settings.EMBEDDED_REDIS:
            names.append("redis")  # last: workers flush their state to it while stopping
        for name in names:
            stopped = stack.process_stop(name)
            self.stdout.write(f"{name}: {'stopped' if stopped else 'not running'}")

from django.conf import settings
from django.core.management.base import BaseCommand

from runs.demo import demo_ensure


class Command(BaseCommand):
    help = "Create the demo account and project (FLYWHEEL_DEMO_USER / FLYWHEEL_DEMO_PASSWORD) if missing."

    def handle(self, *args, **options) -> None:
        user, project = demo_ensure(
            username=settings.FLYWHEEL_DEMO_USER, password=settings.FLYWHEEL_DEMO_PASSWORD
        )
        self.stdout.write(f"demo project {project.name!r} (id {project.pk}) for user {user.username!r}")

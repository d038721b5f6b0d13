import logging
import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from webapp import stack


class Command(BaseCommand):
    help = (
        "Run the local stack's services and start again any that dies (what `make up` starts "
        "detached); SIGTERM stops them all."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--services",
            default="",
            help="comma-separated names (redis, web, worker-rollout, ...); default all",
        )

    def handle(self, *args, services: str, **options) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        os.umask(0o077)  # the logs and pid files it writes: for this user only
        if tightened := stack.home_private(settings.FLYWHEEL_HOME):
            logging.getLogger("flywheel.stack").info("made %d files under the home private", tightened)
        known = {service.name: service for service in stack.services()}
        names = [name.strip() for name in services.split(",") if name.strip()] or list(known)
        unknown = sorted(set(names) - set(known))
        if unknown:
            raise CommandError(f"unknown services {unknown}; known: {sorted(known)}")
        stack.supervise([known[name] for name in names])

from django.conf import settings
from django.core.management.base import BaseCommand

from webapp.static_storage import static_collect_if_changed


class Command(BaseCommand):
    help = (
        "Collect the static files (fingerprinted names, gzip and brotli copies, a manifest) into "
        "STATIC_ROOT when one changed since the last time; `make up` and the web service run it."
    )

    def handle(self, *args, **options) -> None:
        ran = static_collect_if_changed()
        self.stdout.write(f"static files: {'collected' if ran else 'unchanged'} in {settings.STATIC_ROOT}")

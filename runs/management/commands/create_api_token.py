from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from projects import services as project_services


class Command(BaseCommand):
    help = "Create an API token for USERNAME and print it. It is shown only this once."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="command line", help="What the token is for")

    def handle(self, *args, username: str, name: str, **options) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user named {username!r}")
        _, raw = project_services.api_token_create(user=user, name=name)
        self.stdout.write(raw)

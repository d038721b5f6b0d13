import json
import time
import urllib.error
import urllib.request

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from webapp import stack
from webapp.embedded_redis import redis_password, redis_ping, redis_secure

HEALTH_WAIT_SECONDS = 90.0


class Command(BaseCommand):
    help = (
        "Start Flywheel (what `make up` runs): migrate, the demo, then the supervisor, which runs "
        "Redis if embedded, the web server, the workers and the scheduler, and restarts any that dies."
    )

    def handle(self, *args, **options) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        model = settings.FLYWHEEL_HOME / "models" / "tiny-base"
        if not (model / "config.json").exists():
            self.stdout.write("building the tiny base model (about a minute, once)...")
            call_command("build_base_model", stdout=self.stdout)
        call_command("seed_demo", stdout=self.stdout)
        names = [service.name for service in stack.services()]
        if (
            settings.EMBEDDED_REDIS
            and redis_ping(settings.FLYWHEEL_REDIS_PORT)
            and stack.pid_of("supervisor") is None
        ):
            names.remove("redis")  # one an earlier stack left running: the services use it as it is,
            redis_secure(
                settings.FLYWHEEL_REDIS_PORT, redis_password(settings.FLYWHEEL_HOME)
            )  # with a password
            self.stdout.write(f"redis: already running on port {settings.FLYWHEEL_REDIS_PORT}")
        pid = stack.supervisor_start(names)
        self.stdout.write(
            f"supervisor: pid {pid} ({', '.join(names)}); logs in {settings.FLYWHEEL_HOME / 'logs'}"
        )
        url = f"http://{settings.FLYWHEEL_BIND}:{settings.PORT}"
        health = self._wait_healthy(url)
        self.stdout.write(self.style.SUCCESS(f"\nFlywheel is up at {url}/"))
        self.stdout.write(f"  sign in as {settings.FLYWHEEL_DEMO_USER} / {settings.FLYWHEEL_DEMO_PASSWORD}")
        self.stdout.write(
            f"  database: {health['database']['detail']}; logs: {settings.FLYWHEEL_HOME / 'logs'}"
        )
        self.stdout.write("  stop it with: make down")

    def _wait_healthy(self, url: str) -> dict:
        deadline = time.monotonic() + HEALTH_WAIT_SECONDS
        last = "no answer yet"
        while time.monotonic() < deadline:
            try:
                # The operations token: the detail of /healthz, not only its status.
                headers = {"Authorization": f"Bearer {settings.FLYWHEEL_OPS_TOKEN}"}
                probe = urllib.request.Request(f"{url}/healthz", headers=headers)
                with urllib.request.urlopen(probe, timeout=5) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as exc:  # 503 while workers are still starting
                last = exc.read().decode(errors="replace")
            except OSError as exc:
                last = str(exc)
            time.sleep(0.5)
        raise CommandError(
            f"Flywheel did not become healthy in {HEALTH_WAIT_SECONDS:.0f}s: {last}\n"
            f"see the logs in {settings.FLYWHEEL_HOME / 'logs'}"
        )

import json
import time
import urllib.error
import urllib.request

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from webapp import stack
from webapp.celery import SAMPLING_QUEUES
from webapp.embedded_redis import redis_password, redis_ping, redis_secure

STALL_SECONDS = 60.0  # a starting service with no CPU time and nothing logged this long is stuck
RESTARTS_BEFORE_GIVING_UP = 3
REPORT_SECONDS = 10.0


class Command(BaseCommand):
    help = (
        "Start Flywheel (what `make up` runs): migrate, the demo, then the supervisor, which runs "
        "Redis if embedded, the web server, the workers and the scheduler, and restarts any that dies."
    )

    def handle(self, *args, **options) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collect_static_if_changed", stdout=self.stdout)
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
        health = self._wait_healthy(url, names)
        self.stdout.write(self.style.SUCCESS(f"\nFlywheel is up at {url}/"))
        self.stdout.write(f"  sign in as {settings.FLYWHEEL_DEMO_USER} / {settings.FLYWHEEL_DEMO_PASSWORD}")
        self.stdout.write(
            f"  database: {health['database']['detail']}; logs: {settings.FLYWHEEL_HOME / 'logs'}"
        )
        self.stdout.write("  stop it with: make down")

    def _wait_healthy(self, url: str, names: list[str]) -> dict:
        """Wait until /healthz says ok, for as long as the services still starting make progress
        (a busy machine's web workers can take minutes to import); give up when one makes none
        for STALL_SECONDS, keeps dying, or the supervisor is gone. Says every REPORT_SECONDS
        which services it waits for."""
        progress = {name: stack.Progress(name) for name in names}
        started = reported = time.monotonic()
        while True:
            health = _probe(url)
            if health is not None and health.get("status") == "ok":
                return health
            now = time.monotonic()
            # Degraded with every service up (the database, say): the web server is the one to watch.
            waiting = [name for name in _not_ready(health, names) if name in progress] or ["web"]
            if stack.pid_of("supervisor") is None:
                raise CommandError(f"the supervisor exited; see {settings.FLYWHEEL_HOME / 'logs'}")
            for name in waiting:
                progress[name].update(now)
                self._give_up_if_stuck(progress[name], now)
            if now - reported >= REPORT_SECONDS:
                reported = now
                detail = ", ".join(f"{name} ({progress[name].cpu:.0f} s of CPU)" for name in waiting)
                self.stdout.write(f"  {now - started:.0f} s: still starting: {detail or 'the health check'}")
            time.sleep(0.5)

    def _give_up_if_stuck(self, progress: stack.Progress, now: float) -> None:
        log = settings.FLYWHEEL_HOME / "logs" / f"{progress.name}.log"
        if progress.restarts >= RESTARTS_BEFORE_GIVING_UP:
            raise CommandError(
                f"{progress.name} keeps dying ({progress.restarts} restarts while starting); see {log}\n"
                "the stack is still running: `make down` stops it"
            )
        if progress.stalled_for(now) >= STALL_SECONDS:
            raise CommandError(
                f"{progress.name} made no progress for {STALL_SECONDS:.0f} s (no CPU time, nothing "
                f"logged); see {log} and /healthz\nthe stack is still running: `make down` stops it"
            )


def _probe(url: str) -> dict | None:
    """/healthz's detail (the operations token asks for it), or None while the server does not answer."""
    headers = {"Authorization": f"Bearer {settings.FLYWHEEL_OPS_TOKEN}"}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(f"{url}/healthz", headers=headers), timeout=5
        ) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:  # 503 while workers are still starting
        try:
            return json.loads(exc.read())
        except ValueError:
            return {}
    except (OSError, ValueError):
        return None


def _not_ready(health: dict | None, names: list[str]) -> list[str]:
    """The services that /healthz says are not ready yet (all that it cannot tell, while the web
    server does not answer)."""
    if health is None:
        return [
            "web",
            *(["redis"] if "redis" in names and not redis_ping(settings.FLYWHEEL_REDIS_PORT) else []),
        ]
    waiting = [] if health.get("redis", {}).get("ok", True) else ["redis"]
    queues = health.get("queues", {})
    waiting += [f"worker-{queue}" for queue, seen in queues.items() if not seen.get("workers")]
    sandboxes = health.get("sandboxes", {})
    if any(check.get("ok") is False for check in sandboxes.values()):
        failed = [worker for worker, check in sandboxes.items() if check.get("ok") is False]
        raise CommandError(
            f"the sandbox check failed on {', '.join(failed)}: see /healthz and `make sandbox-check`"
        )
    if any(check.get("ok") is None for check in sandboxes.values()):  # still checking
        waiting += [f"worker-{queue}" for queue in SAMPLING_QUEUES if f"worker-{queue}" not in waiting]
    return waiting

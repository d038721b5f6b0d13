import time

from django.conf import settings
from django.core.management.base import BaseCommand
from tqdm import tqdm

from runs.demo import DEMO_PROJECT, demo_ensure, demo_run_launch
from runs.models import MetricPoint, Run


class Command(BaseCommand):
    help = "Launch the GRPO demo run on the demo project and follow it to the end (what `make demo` runs)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--no-wait", action="store_true", help="launch and return")

    def handle(self, *args, no_wait: bool, **options) -> None:
        user, project = demo_ensure(
            username=settings.FLYWHEEL_DEMO_USER, password=settings.FLYWHEEL_DEMO_PASSWORD
        )
        run = demo_run_launch(project=project, by=user)
        url = f"http://{settings.FLYWHEEL_BIND}:{settings.PORT}/runs/{run.pk}/"
        self.stdout.write(f"launched run {run.pk} on project {DEMO_PROJECT!r}: {url}")
        if no_wait:
            return
        with tqdm(total=run.max_steps, desc="GRPO demo", unit="step") as bar:
            while not run.is_terminal:
                time.sleep(1)  # following progress for a person, not synchronising anything
                run.refresh_from_db()
                bar.n = run.learner_step
                bar.set_postfix(status=run.status, heldout=_pass_rate(run))
                bar.refresh()
        self.stdout.write(f"run {run.pk} {run.status}; held-out pass rate by step: {_pass_rates(run)}")


def _pass_rate(run: Run) -> str:
    point = MetricPoint.objects.filter(run=run, name="heldout/pass_rate").order_by("-step").first()
    return "-" if point is None else f"{point.value:.2f}"


def _pass_rates(run: Run) -> dict[int, float]:
    points = MetricPoint.objects.filter(run=run, name="heldout/pass_rate").order_by("step")
    return {point.step: round(point.value, 3) for point in points}

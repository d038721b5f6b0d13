import torch
from django.conf import settings
from django.core.management.base import BaseCommand

from runs.models import Run
from workers.run_learner import learner_main
from workers.run_offline import offline_main


class Command(BaseCommand):
    help = "Run the learner of RUN_ID (started and supervised by the learner workers; not by hand)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("run_id", type=int)

    def handle(self, *args, run_id: int, **options) -> None:
        if settings.FLYWHEEL_TORCH_THREADS > 0:
            torch.set_num_threads(settings.FLYWHEEL_TORCH_THREADS)
        method = Run.objects.filter(pk=run_id).values_list("method", flat=True).get()
        main = learner_main if method == Run.Method.GRPO else offline_main
        main(run_id, log=lambda line: self.stdout.write(line, ending="\n") or self.stdout.flush())

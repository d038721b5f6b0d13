import torch
from django.conf import settings
from django.core.management.base import BaseCommand

from workers.reward_model_train import reward_model_train_main


class Command(BaseCommand):
    help = "Train the reward-model version VERSION_ID (started by the learner workers; not by hand)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("version_id", type=int)

    def handle(self, *args, version_id: int, **options) -> None:
        if settings.FLYWHEEL_TORCH_THREADS > 0:
            torch.set_num_threads(settings.FLYWHEEL_TORCH_THREADS)
        reward_model_train_main(
            version_id, log=lambda line: self.stdout.write(line, ending="\n") or self.stdout.flush()
        )

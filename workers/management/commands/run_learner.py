import os
import sys

import torch
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from workers.run_learner import learner_main
from workers.supervisor import learner_log


class Command(BaseCommand):
    help = (
        "Run the learner of RUN_ID (started and supervised by the learner workers; not by hand). With "
        "--wait, load everything first, then read the run id from stdin: a spare learner."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("run_id", type=int, nargs="?")
        parser.add_argument("--wait", action="store_true", help="read RUN_ID from stdin once loaded")

    def handle(self, *args, run_id: int | None, wait: bool, **options) -> None:
        if wait:
            run_id = spare_wait()
            if run_id is None:
                return  # its supervisor went away before it was needed
        if run_id is None:
            raise CommandError("give a RUN_ID, or --wait to read one from stdin")
        if settings.FLYWHEEL_TORCH_THREADS > 0:
            torch.set_num_threads(settings.FLYWHEEL_TORCH_THREADS)
        learner_main(run_id, log=lambda line: self.stdout.write(line, ending="\n") or self.stdout.flush())


def spare_wait() -> int | None:
    """The run id its supervisor writes to stdin, with stdout and stderr then sent to that run's log;
    None at end-of-file."""
    line = sys.stdin.readline().strip()
    if not line.isdigit():
        return None
    run_id = int(line)
    with open(learner_log(run_id), "ab") as log:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
            os.dup2(log.fileno(), stream.fileno())
    return run_id

from django.apps import AppConfig


class EvaluationsConfig(AppConfig):
    name = "evaluations"
    verbose_name = (
        "Evaluation suites: named, versioned sets of held-out task sets with their rules and sampling, "
        "and their evaluations of policies, checkpoints and tiers, kept item by item"
    )

    def ready(self) -> None:
        # A run may name a suite version; runs checks it through this hook, importing nothing of ours.
        from evaluations.services import run_suite_problems
        from runs.lifecycle import REQUEST_CHECKS

        if run_suite_problems not in REQUEST_CHECKS:
            REQUEST_CHECKS.append(run_suite_problems)

from django.apps import AppConfig


class EpisodesConfig(AppConfig):
    name = "episodes"
    verbose_name = "Episodes of agents outside Flywheel, played against a run's current policy on /v1"

    def ready(self) -> None:
        # `run-<id>` answers on /v1/chat/completions with the run's newest policy; runs looks model
        # names up through this hook, importing nothing of ours.
        from episodes.sections import run_episodes_section
        from episodes.selectors import run_policy_model_for, run_policy_models_for
        from episodes.services import turn_keeper_for
        from runs.run_page import run_section_register
        from serving.served_models import MODEL_LISTERS, MODEL_RESOLVERS, TURN_KEEPERS

        if run_policy_model_for not in MODEL_RESOLVERS:
            MODEL_RESOLVERS.append(run_policy_model_for)
        if run_policy_models_for not in MODEL_LISTERS:
            MODEL_LISTERS.append(run_policy_models_for)
        if turn_keeper_for not in TURN_KEEPERS:
            TURN_KEEPERS.append(turn_keeper_for)
        run_section_register(run_episodes_section)

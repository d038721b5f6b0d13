from django.apps import AppConfig


class RewardModelsConfig(AppConfig):
    name = "reward_models"
    verbose_name = "Reward models: learned preferences, trained from pairs and used by reward rules"

    def ready(self) -> None:
        # `reward_model` graders score through our scorer, and the run page shows the versions a run
        # used: both through hooks, so rewards and runs import nothing of ours.
        from reward_models.scoring import reward_models_scorer
        from reward_models.sections import run_reward_models_section
        from rewards.graders.reward_model import scorer_factory_register
        from runs.run_page import run_section_register

        scorer_factory_register(reward_models_scorer)
        run_section_register(run_reward_models_section)

from django.apps import AppConfig


class RewardModelsConfig(AppConfig):
    name = "reward_models"
    verbose_name = "Reward models: learned preferences, trained from pairs and used by reward rules"

from django.apps import AppConfig


class TiersConfig(AppConfig):
    name = "tiers"
    verbose_name = "Tiers and their evaluations"

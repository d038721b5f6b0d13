from django.apps import AppConfig


class TinkerApiConfig(AppConfig):
    name = "tinker_api"
    verbose_name = "The Tinker API: researchers' own training loops, each model a run"

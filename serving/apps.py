from django.apps import AppConfig


class ServingConfig(AppConfig):
    name = "serving"
    verbose_name = "Serving: the OpenAI-compatible endpoint and the playground"

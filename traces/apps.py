from django.apps import AppConfig


class TracesConfig(AppConfig):
    name = "traces"
    verbose_name = "Production traces: what deployed models did, their outcomes and feedback"

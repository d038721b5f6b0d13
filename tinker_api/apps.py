from django.apps import AppConfig


class TinkerApiConfig(AppConfig):
    name = "tinker_api"
    verbose_name = "The Tinker API: researchers' own training loops, each model a run"

    def ready(self) -> None:
        from runs.run_page import run_section_register
        from tinker_api.sections import run_tinker_section

        run_section_register(run_tinker_section)

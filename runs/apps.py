from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Tiers, runs and serving"

    def ready(self) -> None:
        # The project pages show the runs app's parts through the sections it registers, so the
        # projects app, below this one, never imports it (projects/sections.py).
        from projects.sections import home_section_register, project_section_register
        from runs.sections import home_methods_section, project_runs_section

        project_section_register(project_runs_section)
        home_section_register(home_methods_section)

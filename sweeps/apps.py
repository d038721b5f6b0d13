from django.apps import AppConfig


class SweepsConfig(AppConfig):
    name = "sweeps"
    verbose_name = "Sweeps: many runs of one template over varied parameters, searched and stopped early"

    def ready(self) -> None:
        # A trial's run ending, or reporting a held-out figure, advances its sweep: runs calls the
        # listeners it declares, so it imports nothing of ours. The project page links our list.
        from projects.sections import project_section_register
        from runs.listeners import METRIC_LISTENERS, STATUS_LISTENERS, listener_add
        from sweeps.listeners import sweep_metric_reported, sweep_run_changed
        from sweeps.pages import project_sweeps_section

        listener_add(STATUS_LISTENERS, sweep_run_changed)
        listener_add(METRIC_LISTENERS, sweep_metric_reported)
        project_section_register(project_sweeps_section)

from django.apps import AppConfig


class WebappConfig(AppConfig):
    name = "webapp"
    verbose_name = "Flywheel wiring"

    def ready(self) -> None:
        """Point the Django-free sandboxes package at these settings (FLYWHEEL_SANDBOX_*)."""
        from django.conf import settings

        from sandboxes.config import settings_source_set

        settings_source_set(lambda name: getattr(settings, name, None))

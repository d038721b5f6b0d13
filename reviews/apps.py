from django.apps import AppConfig


class ReviewsConfig(AppConfig):
    name = "reviews"
    verbose_name = "Trajectory reviews, preferences and review queues"

    def ready(self) -> None:
        # The trajectory pages' "next" walks a review queue, and a group's cards show preferences,
        # through these hooks; runs imports nothing of ours.
        from reviews.sections import preferences_mark, queue_next_url
        from runs.run_page import group_marker_register, queue_next_register

        queue_next_register(queue_next_url)
        group_marker_register(preferences_mark)

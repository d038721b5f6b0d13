from django.apps import AppConfig


class FinetuningConfig(AppConfig):
    name = "finetuning"
    verbose_name = (
        "OpenAI's fine-tuning API as an adapter: uploaded files, and fine-tuning jobs that are Flywheel runs"
    )

    def ready(self) -> None:
        # A job's fine_tuned_model answers on /v1/models and /v1/chat/completions; runs looks names
        # up through this hook, importing nothing of ours.
        from finetuning.selectors import fine_tuned_model_for, fine_tuned_models_for
        from serving.served_models import MODEL_LISTERS, MODEL_RESOLVERS

        if fine_tuned_model_for not in MODEL_RESOLVERS:
            MODEL_RESOLVERS.append(fine_tuned_model_for)
        if fine_tuned_models_for not in MODEL_LISTERS:
            MODEL_LISTERS.append(fine_tuned_models_for)

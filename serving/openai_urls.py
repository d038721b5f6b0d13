"""The OpenAI-compatible endpoint, included at /v1/ (serving/openai_views.py)."""

from django.urls import path, re_path

from serving import openai_views

urlpatterns = [
    path("models", openai_views.models_list, name="openai-models"),
    re_path(r"^models/(?P<model_id>[^/]+)$", openai_views.model_detail, name="openai-model"),
    path("completions", openai_views.completions, name="openai-completions"),
    path("chat/completions", openai_views.chat_completions, name="openai-chat-completions"),
    path("load_lora_adapter", openai_views.load_lora_adapter, name="openai-load-lora-adapter"),
    path("unload_lora_adapter", openai_views.unload_lora_adapter, name="openai-unload-lora-adapter"),
    re_path(r"^(?P<path>.*)$", openai_views.openai_not_found),
]

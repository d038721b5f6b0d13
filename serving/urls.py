"""Serving's page: the playground (the OpenAI-compatible endpoint's URLs are serving/openai_urls.py)."""

from django.urls import path

from serving import playground_views

urlpatterns = [
    path("playground/", playground_views.playground, name="playground"),
]

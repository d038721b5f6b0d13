"""The episodes REST API, included at /api/v1/ beside the other apps' api_urls."""

from django.urls import path

from episodes import api

urlpatterns = [
    path("runs/<int:id>/episodes", api.EpisodeListView.as_view(), name="api-run-episodes"),
    path("runs/<int:id>/episodes/counts", api.EpisodeCountsView.as_view(), name="api-run-episode-counts"),
    path("runs/<int:id>/episodes/<str:key>", api.EpisodeDetailView.as_view(), name="api-run-episode"),
    path(
        "runs/<int:id>/episodes/<str:key>/outcome",
        api.EpisodeOutcomeView.as_view(),
        name="api-run-episode-outcome",
    ),
]

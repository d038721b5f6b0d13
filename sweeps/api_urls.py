"""The sweeps REST API, included at /api/v1/ beside the other apps' api_urls."""

from django.urls import path

from sweeps import api

urlpatterns = [
    path("projects/<int:id>/sweeps", api.SweepListView.as_view(), name="api-sweeps"),
    path("projects/<int:id>/sweeps/<int:sweep_id>", api.SweepDetailView.as_view(), name="api-sweep"),
    path(
        "projects/<int:id>/sweeps/<int:sweep_id>/cancel",
        api.SweepCancelView.as_view(),
        name="api-sweep-cancel",
    ),
]

"""The operations API, included at /api/v1/."""

from django.urls import path

from ops import api

urlpatterns = [
    path("ops/overview", api.OverviewView.as_view(), name="api-ops-overview"),
]

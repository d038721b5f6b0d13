"""The traces REST API, included at /api/v1/ beside the other apps' api_urls (see shared API.md)."""

from django.urls import path

from traces import api

urlpatterns = [
    path("traces", api.TraceListView.as_view(), name="api-traces"),
    path("traces/promote", api.TracePromoteView.as_view(), name="api-traces-promote"),
    path("traces/<int:id>", api.TraceDetailView.as_view(), name="api-trace"),
]

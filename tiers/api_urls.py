"""The REST API of tiers and tier evaluations, included at /api/v1/ (see shared API.md)."""

from django.urls import path

from tiers import api

urlpatterns = [
    path("tiers", api.TierListView.as_view(), name="api-tiers"),
    path("tiers/<int:id>", api.TierDetailView.as_view(), name="api-tier"),
    path("tiers/<int:id>/evaluate", api.TierEvaluateView.as_view(), name="api-tier-evaluate"),
    path("tier-evaluations/<int:id>", api.TierEvaluationDetailView.as_view(), name="api-tier-evaluation"),
]

"""The costs REST API, included at /api/v1/ beside the other apps' api_urls."""

from django.urls import path

from costs import api

urlpatterns = [
    path("runs/estimate", api.RunEstimateView.as_view(), name="api-run-estimate"),
    path("runs/<int:id>/cost", api.RunCostView.as_view(), name="api-run-cost"),
    path("runs/<int:id>/budget", api.RunBudgetView.as_view(), name="api-run-budget"),
    path("projects/<int:id>/costs", api.ProjectCostView.as_view(), name="api-project-costs"),
    path("projects/<int:id>/budget", api.ProjectBudgetView.as_view(), name="api-project-budget"),
    path("prices", api.PriceListView.as_view(), name="api-prices"),
]

"""The evaluation-suites REST API, included at /api/v1/ beside the other apps' api_urls (API.md)."""

from django.urls import path

from evaluations import api

urlpatterns = [
    path("eval-suites", api.SuiteListView.as_view(), name="api-eval-suites"),
    path("eval-suites/<int:id>", api.SuiteDetailView.as_view(), name="api-eval-suite"),
    path(
        "eval-suites/<int:id>/versions", api.SuiteVersionCreateView.as_view(), name="api-eval-suite-versions"
    ),
    path("eval-suites/<int:id>/evaluate", api.SuiteEvaluateView.as_view(), name="api-eval-suite-evaluate"),
    path("suite-evaluations/<int:id>", api.SuiteEvaluationDetailView.as_view(), name="api-suite-evaluation"),
    path(
        "suite-evaluations/<int:id>/results",
        api.SuiteEvaluationResultsView.as_view(),
        name="api-suite-evaluation-results",
    ),
    path(
        "suite-evaluations/<int:id>/compare",
        api.SuiteEvaluationCompareView.as_view(),
        name="api-suite-evaluation-compare",
    ),
]

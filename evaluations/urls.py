from django.urls import path

from evaluations import views

urlpatterns = [
    path("projects/<int:project_id>/eval-suites/", views.suite_list, name="eval-suite-list"),
    path("projects/<int:project_id>/eval-suites/new/", views.suite_create, name="eval-suite-create"),
    path("eval-suites/<int:suite_id>/", views.suite_detail, name="eval-suite-detail"),
    path(
        "eval-suites/<int:suite_id>/versions/", views.suite_version_create, name="eval-suite-version-create"
    ),
    path("eval-suites/<int:suite_id>/evaluate/", views.suite_evaluate, name="eval-suite-evaluate"),
    path("suite-evaluations/<int:evaluation_id>/", views.evaluation_detail, name="suite-evaluation-detail"),
]

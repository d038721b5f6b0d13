"""The REST API, included at /api/v1/ (see shared API.md)."""

from django.urls import path

from runs.api import views

urlpatterns = [
    path("me", views.MeView.as_view(), name="api-me"),
    path("projects", views.ProjectListView.as_view(), name="api-projects"),
    path("projects/<int:id>", views.ProjectDetailView.as_view(), name="api-project"),
    path("projects/<int:id>/members", views.MemberListView.as_view(), name="api-members"),
    path("projects/<int:id>/members/<int:user_id>", views.MemberDetailView.as_view(), name="api-member"),
    path("task-sets", views.TaskSetListView.as_view(), name="api-task-sets"),
    path("task-sets/<int:id>", views.TaskSetDetailView.as_view(), name="api-task-set"),
    path("task-sets/<int:id>/import", views.TaskSetImportView.as_view(), name="api-task-set-import"),
    path("task-sets/<int:id>/versions", views.VersionListView.as_view(), name="api-versions"),
    path("task-sets/<int:id>/versions/<int:number>", views.VersionDetailView.as_view(), name="api-version"),
    path(
        "task-sets/<int:id>/versions/<int:number>/export",
        views.VersionExportView.as_view(),
        name="api-version-export",
    ),
    path(
        "task-sets/<int:id>/versions/<int:number>/split",
        views.VersionSplitView.as_view(),
        name="api-version-split",
    ),
    path("tasks", views.TaskListView.as_view(), name="api-tasks"),
    path("tasks/<int:id>", views.TaskDetailView.as_view(), name="api-task"),
    path("tiers", views.TierListView.as_view(), name="api-tiers"),
    path("tiers/<int:id>", views.TierDetailView.as_view(), name="api-tier"),
    path("tokens", views.TokenListView.as_view(), name="api-tokens"),
    path("tokens/<int:id>", views.TokenDetailView.as_view(), name="api-token"),
]

"""The REST API of projects, members, tokens and the task library, included at /api/v1/."""

from django.urls import path

from projects import api

urlpatterns = [
    path("me", api.MeView.as_view(), name="api-me"),
    path("projects", api.ProjectListView.as_view(), name="api-projects"),
    path("projects/<int:id>", api.ProjectDetailView.as_view(), name="api-project"),
    path("projects/<int:id>/members", api.MemberListView.as_view(), name="api-members"),
    path("projects/<int:id>/members/<int:user_id>", api.MemberDetailView.as_view(), name="api-member"),
    path("task-sets", api.TaskSetListView.as_view(), name="api-task-sets"),
    path("task-sets/<int:id>", api.TaskSetDetailView.as_view(), name="api-task-set"),
    path("task-sets/<int:id>/import", api.TaskSetImportView.as_view(), name="api-task-set-import"),
    path("task-sets/<int:id>/versions", api.VersionListView.as_view(), name="api-versions"),
    path("task-sets/<int:id>/versions/<int:number>", api.VersionDetailView.as_view(), name="api-version"),
    path(
        "task-sets/<int:id>/versions/<int:number>/verify",
        api.VersionVerifyView.as_view(),
        name="api-version-verify",
    ),
    path(
        "task-sets/<int:id>/versions/<int:number>/export",
        api.VersionExportView.as_view(),
        name="api-version-export",
    ),
    path(
        "task-sets/<int:id>/versions/<int:number>/split",
        api.VersionSplitView.as_view(),
        name="api-version-split",
    ),
    path("tasks", api.TaskListView.as_view(), name="api-tasks"),
    path("tasks/<int:id>", api.TaskDetailView.as_view(), name="api-task"),
    path("tokens", api.TokenListView.as_view(), name="api-tokens"),
    path("tokens/<int:id>", api.TokenDetailView.as_view(), name="api-token"),
]

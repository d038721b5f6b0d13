"""The pages of projects, members, tokens and the task library."""

from django.urls import path

from projects import views

urlpatterns = [
    path("", views.project_list, name="project-list"),
    path("projects/new/", views.project_create, name="project-create"),
    path("projects/<int:project_id>/", views.project_detail, name="project-detail"),
    path("projects/<int:project_id>/members/", views.project_members, name="project-members"),
    path("projects/<int:project_id>/members/<int:user_id>/role/", views.member_role, name="member-role"),
    path(
        "projects/<int:project_id>/members/<int:user_id>/remove/",
        views.member_remove,
        name="member-remove",
    ),
    path("projects/<int:project_id>/task-sets/new/", views.task_set_create, name="task-set-create"),
    path("task-sets/<int:task_set_id>/", views.task_set_detail, name="task-set-detail"),
    path("task-sets/<int:task_set_id>/import/", views.task_set_import, name="task-set-import"),
    path(
        "task-sets/<int:task_set_id>/import/<int:staged_id>/confirm/",
        views.import_confirm,
        name="import-confirm",
    ),
    path(
        "task-sets/<int:task_set_id>/import/<int:staged_id>/cancel/",
        views.import_cancel,
        name="import-cancel",
    ),
    path("task-sets/<int:task_set_id>/versions/<int:number>/", views.version_detail, name="version-detail"),
    path(
        "task-sets/<int:task_set_id>/versions/<int:number>/export.jsonl",
        views.version_export,
        name="version-export",
    ),
    path(
        "task-sets/<int:task_set_id>/versions/<int:number>/resplit/",
        views.version_resplit,
        name="version-resplit",
    ),
    path(
        "task-sets/<int:task_set_id>/versions/<int:number>/verify/",
        views.version_verify,
        name="version-verify",
    ),
    path("tokens/", views.token_list, name="token-list"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke, name="token-revoke"),
]

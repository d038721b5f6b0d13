from django.urls import path

from runs import run_views, views

urlpatterns = [
    path("", views.project_list, name="project-list"),
    path("projects/new/", views.project_create, name="project-create"),
    path("projects/<int:project_id>/", views.project_detail, name="project-detail"),
    path("projects/<int:project_id>/members/", views.project_members, name="project-members"),
    path("projects/<int:project_id>/demo-run/", views.demo_run, name="demo-run"),
    path("projects/<int:project_id>/members/<int:user_id>/role/", views.member_role, name="member-role"),
    path(
        "projects/<int:project_id>/members/<int:user_id>/remove/",
        views.member_remove,
        name="member-remove",
    ),
    path("projects/<int:project_id>/task-sets/new/", views.task_set_create, name="task-set-create"),
    path("projects/<int:project_id>/tiers/new/", views.tier_create, name="tier-create"),
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
    path("tiers/<int:tier_id>/", views.tier_detail, name="tier-detail"),
    path("tiers/<int:tier_id>/edit/", views.tier_edit, name="tier-edit"),
    path("tiers/<int:tier_id>/delete/", views.tier_delete, name="tier-delete"),
    path("projects/<int:project_id>/runs/new/", run_views.run_create, name="run-create"),
    path("runs/<int:run_id>/", run_views.run_detail, name="run-detail"),
    path("runs/<int:run_id>/pause/", run_views.run_pause, name="run-pause"),
    path("runs/<int:run_id>/resume/", run_views.run_resume, name="run-resume"),
    path("runs/<int:run_id>/cancel/", run_views.run_cancel, name="run-cancel"),
    path("runs/<int:run_id>/retry/", run_views.run_retry, name="run-retry"),
    path("runs/<int:run_id>/clone/", run_views.run_clone, name="run-clone"),
    path("checkpoints/<int:checkpoint_id>/fork/", run_views.checkpoint_fork, name="checkpoint-fork"),
    path("trajectories/<int:trajectory_id>/", run_views.trajectory_detail, name="trajectory-detail"),
    path("tokens/", views.token_list, name="token-list"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke, name="token-revoke"),
]

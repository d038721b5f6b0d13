from django.urls import path

from rewards import views

urlpatterns = [
    path("projects/<int:project_id>/reward-rules/", views.reward_rule_list, name="reward-rule-list"),
    path("projects/<int:project_id>/reward-rules/new/", views.reward_rule_create, name="reward-rule-create"),
    path(
        "projects/<int:project_id>/reward-rules/import-openai/",
        views.reward_rule_import,
        name="reward-rule-import",
    ),
    path("reward-rules/<int:rule_id>/", views.reward_rule_detail, name="reward-rule-detail"),
    path("reward-rules/<int:rule_id>/edit/", views.reward_rule_edit, name="reward-rule-edit"),
    path("reward-rules/<int:rule_id>/delete/", views.reward_rule_delete, name="reward-rule-delete"),
    path("reward-rules/<int:rule_id>/diff/", views.reward_rule_diff, name="reward-rule-diff"),
    path("reward-rules/<int:rule_id>/dry-run/", views.reward_rule_dry_run, name="reward-rule-dry-run"),
    path(
        "reward-rules/<int:rule_id>/versions/<int:number>/",
        views.reward_rule_version,
        name="reward-rule-version",
    ),
]

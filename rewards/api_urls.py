"""The reward-rules REST API, included at /api/v1/ beside the other apps' api_urls (see shared API.md)."""

from django.urls import path

from rewards.api import views

urlpatterns = [
    path("reward-rules", views.RewardRuleListView.as_view(), name="api-reward-rules"),
    path("reward-rules/validate", views.RewardRuleValidateView.as_view(), name="api-reward-rule-validate"),
    path(
        "reward-rules/import-openai",
        views.RewardRuleImportOpenAIView.as_view(),
        name="api-reward-rule-import-openai",
    ),
    path("reward-rules/<int:id>", views.RewardRuleDetailView.as_view(), name="api-reward-rule"),
    path(
        "reward-rules/<int:id>/versions",
        views.RewardRuleVersionListView.as_view(),
        name="api-reward-rule-versions",
    ),
    path(
        "reward-rules/<int:id>/versions/<int:number>",
        views.RewardRuleVersionDetailView.as_view(),
        name="api-reward-rule-version",
    ),
    path(
        "reward-rules/<int:id>/versions/<int:number>/openai",
        views.RewardRuleVersionOpenAIView.as_view(),
        name="api-reward-rule-version-openai",
    ),
    path("reward-rules/<int:id>/diff", views.RewardRuleDiffView.as_view(), name="api-reward-rule-diff"),
    path(
        "reward-rules/<int:id>/dry-run", views.RewardRuleDryRunView.as_view(), name="api-reward-rule-dry-run"
    ),
]

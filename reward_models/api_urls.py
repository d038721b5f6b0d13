"""The reward-models REST API, included at /api/v1/ beside the other apps' api_urls (see shared API.md)."""

from django.urls import path

from reward_models import api

urlpatterns = [
    path("reward-models", api.RewardModelListView.as_view(), name="api-reward-models"),
    path("reward-models/<int:id>", api.RewardModelDetailView.as_view(), name="api-reward-model"),
    path(
        "reward-models/<int:id>/versions",
        api.RewardModelVersionListView.as_view(),
        name="api-reward-model-versions",
    ),
    path(
        "reward-models/<int:id>/versions/<int:number>/score",
        api.RewardModelScoreView.as_view(),
        name="api-reward-model-version-score",
    ),
    path("reward-models/<int:id>/train", api.RewardModelTrainView.as_view(), name="api-reward-model-train"),
    path(
        "reward-model-versions/<int:id>",
        api.RewardModelVersionDetailView.as_view(),
        name="api-reward-model-version",
    ),
    path(
        "reward-model-versions/<int:id>/cancel",
        api.RewardModelVersionCancelView.as_view(),
        name="api-reward-model-version-cancel",
    ),
    path("runs/<int:id>/reward-models", api.RunRewardModelsView.as_view(), name="api-run-reward-models"),
]

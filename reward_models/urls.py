from django.urls import path

from reward_models import views

urlpatterns = [
    path("projects/<int:project_id>/reward-models/", views.reward_model_list, name="reward-model-list"),
    path(
        "projects/<int:project_id>/reward-models/new/", views.reward_model_create, name="reward-model-create"
    ),
    path("reward-models/<int:reward_model_id>/", views.reward_model_detail, name="reward-model-detail"),
    path("reward-models/<int:reward_model_id>/train/", views.reward_model_train, name="reward-model-train"),
    path("reward-model-versions/<int:version_id>/", views.reward_model_version, name="reward-model-version"),
    path(
        "reward-model-versions/<int:version_id>/progress",
        views.reward_model_version_progress,
        name="reward-model-version-progress",
    ),
    path(
        "reward-model-versions/<int:version_id>/cancel/",
        views.reward_model_version_cancel,
        name="reward-model-version-cancel",
    ),
]

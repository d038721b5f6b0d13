"""The reviews REST API, included at /api/v1/ beside the other apps' api_urls (see shared API.md)."""

from django.urls import path

from reviews import api

urlpatterns = [
    path("reviews", api.ReviewListView.as_view(), name="api-reviews"),
    path("reviews/export", api.ReviewExportView.as_view(), name="api-review-export"),
    path("reviews/<int:id>", api.ReviewDetailView.as_view(), name="api-review"),
    path("preferences", api.PreferenceListView.as_view(), name="api-preferences"),
    path("review-queues", api.QueueListView.as_view(), name="api-review-queues"),
    path("review-queues/<int:id>", api.QueueDetailView.as_view(), name="api-review-queue"),
    path("review-queues/<int:id>/items", api.QueueItemListView.as_view(), name="api-review-queue-items"),
    path("review-queues/<int:id>/assign", api.QueueAssignView.as_view(), name="api-review-queue-assign"),
    path("review-queues/<int:id>/next", api.QueueNextView.as_view(), name="api-review-queue-next"),
    path("review-trainings/<int:id>", api.ReviewTrainingView.as_view(), name="api-review-training"),
    path("runs/<int:id>/train-on-reviews", api.TrainOnReviewsView.as_view(), name="api-train-on-reviews"),
]

from django.urls import path

from reviews import views

urlpatterns = [
    path("trajectories/<int:trajectory_id>/review/", views.trajectory_review, name="trajectory-review"),
    path("trajectories/<int:trajectory_id>/prefer/", views.trajectory_prefer, name="trajectory-prefer"),
    path("runs/<int:run_id>/review-queues/", views.queue_list, name="review-queue-list"),
    path(
        "runs/<int:run_id>/trajectories/review/", views.trajectory_bulk_review, name="trajectory-bulk-review"
    ),
    path("traces/<int:trace_id>/review/", views.trace_review, name="trace-review"),
    path(
        "projects/<int:project_id>/traces/review-queue/", views.trace_queue_create, name="trace-queue-create"
    ),
    path("review-queues/<int:queue_id>/", views.queue_detail, name="review-queue-detail"),
    path("review-queues/<int:queue_id>/assign/", views.queue_assign, name="review-queue-assign"),
    path("review-queues/<int:queue_id>/next/", views.queue_next, name="review-queue-next"),
    path("runs/<int:run_id>/train-on-reviews/", views.train_on_reviews, name="train-on-reviews"),
    path(
        "runs/<int:run_id>/export/labels.<str:extension>", views.run_labels_export, name="run-labels-export"
    ),
    path("runs/<int:run_id>/export/<str:export_format>.jsonl", views.run_export, name="run-export"),
]

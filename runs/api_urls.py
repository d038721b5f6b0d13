"""The REST API of runs, trajectories and checkpoints, included at /api/v1/ (see shared API.md)."""

from django.urls import path

from runs import backtest_views
from runs.api import quotas, runs

urlpatterns = [
    # A backtest rescores a run: served from runs, under the reward rule's URL.
    path(
        "reward-rules/<int:id>/backtest",
        backtest_views.RewardRuleBacktestView.as_view(),
        name="api-reward-rule-backtest",
    ),
    path("projects/<int:id>/quota", quotas.ProjectQuotaView.as_view(), name="api-project-quota"),
    path("runs", runs.RunListView.as_view(), name="api-runs"),
    path("runs/<int:id>", runs.RunDetailView.as_view(), name="api-run"),
    path("runs/<int:id>/pause", runs.RunPauseView.as_view(), name="api-run-pause"),
    path("runs/<int:id>/resume", runs.RunResumeView.as_view(), name="api-run-resume"),
    path("runs/<int:id>/cancel", runs.RunCancelView.as_view(), name="api-run-cancel"),
    path("runs/<int:id>/retry", runs.RunRetryView.as_view(), name="api-run-retry"),
    path("runs/<int:id>/clone", runs.RunCloneView.as_view(), name="api-run-clone"),
    path("runs/<int:id>/events", runs.RunEventListView.as_view(), name="api-run-events"),
    path("runs/<int:id>/metrics", runs.RunMetricsView.as_view(), name="api-run-metrics"),
    path("runs/<int:id>/heldout-compare", runs.HeldOutCompareView.as_view(), name="api-run-heldout-compare"),
    path("trajectories", runs.TrajectoryListView.as_view(), name="api-trajectories"),
    path("trajectories/<int:id>", runs.TrajectoryDetailView.as_view(), name="api-trajectory"),
    path("trajectories/<int:id>/steps", runs.TrajectoryStepListView.as_view(), name="api-trajectory-steps"),
    path("trajectories/<int:id>/group", runs.TrajectoryGroupView.as_view(), name="api-trajectory-group"),
    path("runs/<int:id>/monitors", runs.RunMonitorsView.as_view(), name="api-run-monitors"),
    path(
        "runs/<int:id>/checkpoints/<int:step>/export",
        runs.CheckpointExportView.as_view(),
        name="api-checkpoint-export",
    ),
    path("checkpoints", runs.CheckpointListView.as_view(), name="api-checkpoints"),
    path("checkpoints/<int:id>", runs.CheckpointDetailView.as_view(), name="api-checkpoint"),
    path("checkpoints/<int:id>/fork", runs.CheckpointForkView.as_view(), name="api-checkpoint-fork"),
]

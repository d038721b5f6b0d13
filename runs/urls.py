from django.urls import path

from runs import backtest_views, run_views

urlpatterns = [
    # A backtest rescores a run: served from runs, under the reward rule's URL.
    path(
        "reward-rules/<int:rule_id>/backtest/",
        backtest_views.reward_rule_backtest,
        name="reward-rule-backtest",
    ),
    path("demo/", run_views.demo_start, name="demo-start"),
    path("projects/<int:project_id>/demo-run/", run_views.demo_run, name="demo-run"),
    path("projects/<int:project_id>/runs/new/", run_views.run_create, name="run-create"),
    path("runs/", run_views.run_list, name="run-list"),
    path("runs/compare/", run_views.run_compare, name="run-compare"),
    path("runs/queue/", run_views.run_queue, name="run-queue"),
    path("runs/<int:run_id>/", run_views.run_detail, name="run-detail"),
    path("runs/<int:run_id>/monitors/", run_views.run_monitors, name="run-monitors"),
    path("runs/<int:run_id>/trajectories/", run_views.trajectory_list, name="trajectory-list"),
    path("runs/<int:run_id>/pause/", run_views.run_pause, name="run-pause"),
    path("runs/<int:run_id>/resume/", run_views.run_resume, name="run-resume"),
    path("runs/<int:run_id>/cancel/", run_views.run_cancel, name="run-cancel"),
    path("runs/<int:run_id>/retry/", run_views.run_retry, name="run-retry"),
    path("runs/<int:run_id>/clone/", run_views.run_clone, name="run-clone"),
    path("checkpoints/<int:checkpoint_id>/fork/", run_views.checkpoint_fork, name="checkpoint-fork"),
    path("trajectories/<int:trajectory_id>/", run_views.trajectory_detail, name="trajectory-detail"),
    path("trajectories/<int:trajectory_id>/group/", run_views.trajectory_group, name="trajectory-group"),
]

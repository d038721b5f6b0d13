from django.urls import path

from runs import backtest_views, docs_views, playground, run_views, tier_views

urlpatterns = [
    # A backtest rescores a run: served from runs, under the reward rule's URL.
    path(
        "reward-rules/<int:rule_id>/backtest/",
        backtest_views.reward_rule_backtest,
        name="reward-rule-backtest",
    ),
    path("playground/", playground.playground, name="playground"),
    path("demo/", run_views.demo_start, name="demo-start"),
    path("readme/", docs_views.readme, name="readme"),
    path("docs/", docs_views.docs_page, name="docs-page"),
    path("docs/assets/<path:name>", docs_views.docs_asset, name="docs-asset"),
    path("docs/<path:name>/", docs_views.docs_page, name="docs-page"),
    path("projects/<int:project_id>/demo-run/", run_views.demo_run, name="demo-run"),
    path("projects/<int:project_id>/tiers/new/", tier_views.tier_create, name="tier-create"),
    path("tiers/<int:tier_id>/", tier_views.tier_detail, name="tier-detail"),
    path("tiers/<int:tier_id>/edit/", tier_views.tier_edit, name="tier-edit"),
    path("tiers/<int:tier_id>/delete/", tier_views.tier_delete, name="tier-delete"),
    path("tiers/<int:tier_id>/evaluate/", tier_views.tier_evaluate, name="tier-evaluate"),
    path(
        "tier-evaluations/<int:evaluation_id>/",
        tier_views.tier_evaluation_detail,
        name="tier-evaluation-detail",
    ),
    path("projects/<int:project_id>/runs/new/", run_views.run_create, name="run-create"),
    path("runs/", run_views.run_list, name="run-list"),
    path("runs/compare/", run_views.run_compare, name="run-compare"),
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

"""The runs app's models: post-training runs with their events, metrics, trajectories and
checkpoints (runs.py), and tiers with their evaluations and served adapters (tiers.py). Projects and
the task library are the projects app's."""

from runs.models.runs import (
    Checkpoint,
    HeldOutResult,
    MetricPoint,
    ProjectQuota,
    RolloutBatch,
    Run,
    RunEvent,
    Trajectory,
    TrajectoryStep,
)
from runs.models.tiers import ServedAdapter, Tier, TierEvaluation

__all__ = [
    "Checkpoint",
    "HeldOutResult",
    "MetricPoint",
    "ProjectQuota",
    "RolloutBatch",
    "Run",
    "RunEvent",
    "ServedAdapter",
    "Tier",
    "TierEvaluation",
    "Trajectory",
    "TrajectoryStep",
]

"""The runs app's models: post-training runs with their events, metrics, trajectories and
checkpoints (runs.py). Projects and the task library are the projects app's, tiers and their
evaluations the tiers app's, served adapters the serving app's."""

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

__all__ = [
    "Checkpoint",
    "HeldOutResult",
    "MetricPoint",
    "ProjectQuota",
    "RolloutBatch",
    "Run",
    "RunEvent",
    "Trajectory",
    "TrajectoryStep",
]

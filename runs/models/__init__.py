"""The runs app's models: the project space and task library (library.py), and post-training
runs with their events, metrics, trajectories and checkpoints (runs.py), and tier evaluations
(tiers.py)."""

from runs.models.library import (
    ApiToken,
    Membership,
    Project,
    StagedImport,
    TaskItem,
    TaskSet,
    TaskSetVersion,
    Tier,
)
from runs.models.runs import (
    Checkpoint,
    HeldOutResult,
    MetricPoint,
    RolloutBatch,
    Run,
    RunEvent,
    Trajectory,
    TrajectoryStep,
)
from runs.models.tiers import ServedAdapter, TierEvaluation

__all__ = [
    "ApiToken",
    "Checkpoint",
    "HeldOutResult",
    "Membership",
    "MetricPoint",
    "Project",
    "RolloutBatch",
    "Run",
    "RunEvent",
    "ServedAdapter",
    "StagedImport",
    "TaskItem",
    "TaskSet",
    "TaskSetVersion",
    "Tier",
    "TierEvaluation",
    "Trajectory",
    "TrajectoryStep",
]

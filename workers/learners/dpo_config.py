"""DPO as a run's method: its hyperparameters, what it needs of the data, its registration
(torch-free). The learner is workers/learners/dpo.py."""

from typing import Any

from django.db.models import QuerySet

from runs.hyperparameters import Param
from runs.learners import Algorithm, algorithm_register
from runs.lifecycle import pair_problems


def dpo_data_problems(items: QuerySet, resolved: dict[str, Any]) -> dict[str, str]:
    return pair_problems(items)


DPO = algorithm_register(
    Algorithm(
        name="dpo",
        label="DPO",
        summary="direct preference optimisation on the train split's chosen / rejected pairs",
        learner="workers.learners.dpo",
        params={"beta": Param(float, 0.1, 0.0, 100.0), "epochs": Param(int, 1, 1, 1000)},
        online=False,
        data_check=dpo_data_problems,
    )
)

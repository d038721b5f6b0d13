"""SFT as a run's method: its hyperparameters, what it needs of the data, its registration
(torch-free). The learner is workers/learners/sft.py."""

from typing import Any

from django.db.models import QuerySet

from runs.hyperparameters import Param
from runs.learners import Algorithm, algorithm_register

SHOWN = 5


def sft_data_problems(items: QuerySet, resolved: dict[str, Any]) -> dict[str, str]:
    """SFT learns each item's reference solution: agent items have none, and a code item without
    one would be an empty target."""
    if items.filter(kind="agent").exists():
        return {"method": "SFT needs reference solutions; agent items have none"}
    missing = [
        external_id
        for external_id, data in items.filter(kind="code").values_list("external_id", "data")
        if not isinstance(solution := data.get("reference_solution"), str) or not solution.strip()
    ]
    if not missing:
        return {}
    listed = ", ".join(missing[:SHOWN]) + (
        f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else ""
    )
    return {
        "method": f"SFT needs a reference solution for every code item; {len(missing)} have none ({listed})"
    }


SFT = algorithm_register(
    Algorithm(
        name="sft",
        label="SFT",
        summary="supervised fine-tuning on the train split's reference solutions",
        learner="workers.learners.sft",
        params={"epochs": Param(int, 1, 1, 1000)},
        online=False,
        data_check=sft_data_problems,
    )
)

"""Reviewed data out: SFT JSONL and DPO pairs, each line ready to be imported as a task set
(task-library JSONL) or used as a run's training data.

- `sft`: trajectories a reviewer labelled good and none labelled otherwise, as answer items:
  `prompt` is the task's prompt, `reference` the completion to imitate.
- `dpo`: preference pairs `{"id", "prompt", "chosen", "rejected", "metadata"}`: every explicit
  preference, then pairs implied by labels (a good and a bad or reward-hack completion of the
  same prompt) that no explicit preference already covers.
- `dpo-task-set`: the same pairs as answer items (`reference` the chosen completion, the rejected
  one in `metadata.rejected`), so they import into the task library.
"""

import json
from collections.abc import Iterator
from typing import Any

from reviews.models import Preference, Review
from runs.models import Run, Trajectory

FORMATS = ("sft", "dpo", "dpo-task-set")
BAD = (Review.Label.BAD, Review.Label.REWARD_HACK)


def _line(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False) + "\n"


def _source(trajectory: Trajectory) -> dict[str, Any]:
    return {
        "run": trajectory.run_id,
        "trajectory": trajectory.pk,
        "policy_version": trajectory.policy_version,
        "reward": trajectory.reward,
    }


def sft_lines(*, run: Run) -> Iterator[str]:
    labels: dict[int, set[str]] = {}
    for trajectory_id, label in Review.objects.filter(trajectory__run=run).values_list(
        "trajectory_id", "label"
    ):
        labels.setdefault(trajectory_id, set()).add(label)
    good = sorted(pk for pk, found in labels.items() if found == {Review.Label.GOOD})
    for trajectory in Trajectory.objects.filter(pk__in=good).select_related("item").order_by("pk").iterator():
        yield _line(
            {
                "kind": "answer",
                "id": f"{trajectory.item.external_id}-t{trajectory.pk}",
                "prompt": trajectory.item.text,
                "reference": trajectory.completion_text,
                "split": "train",
                "metadata": {"source": _source(trajectory), "label": "good"},
            }
        )


def preference_pairs(*, run: Run) -> Iterator[tuple[Trajectory, Trajectory, str]]:
    """(chosen, rejected, source) for every explicit preference, then label-implied ones."""
    seen: set[tuple[int, int]] = set()
    explicit = (
        Preference.objects.filter(run=run).select_related("chosen__item", "rejected__item").order_by("pk")
    )
    for preference in explicit:
        key = (preference.chosen_id, preference.rejected_id)
        if key not in seen:
            seen.add(key)
            yield preference.chosen, preference.rejected, "preference"
    reviews = Review.objects.filter(trajectory__run=run).values_list(
        "trajectory_id", "trajectory__item_id", "label"
    )
    verdicts: dict[int, dict[str, set[int]]] = {}
    for trajectory_id, item_id, label in reviews:
        side = "good" if label == Review.Label.GOOD else "bad" if label in BAD else None
        if side:
            verdicts.setdefault(item_id, {"good": set(), "bad": set()})[side].add(trajectory_id)
    wanted = [
        (good, bad)
        for sides in verdicts.values()
        for good in sorted(sides["good"] - sides["bad"])
        for bad in sorted(sides["bad"] - sides["good"])
        if (good, bad) not in seen
    ]
    rows = Trajectory.objects.select_related("item").in_bulk({pk for pair in wanted for pk in pair})
    for good, bad in wanted:
        yield rows[good], rows[bad], "labels"


def dpo_lines(*, run: Run, as_task_set: bool = False) -> Iterator[str]:
    for chosen, rejected, source in preference_pairs(run=run):
        metadata = {"source": source, "chosen": _source(chosen), "rejected": _source(rejected)}
        pair_id = f"{chosen.item.external_id}-t{chosen.pk}-over-t{rejected.pk}"
        if as_task_set:
            yield _line(
                {
                    "kind": "answer",
                    "id": pair_id,
                    "prompt": chosen.item.text,
                    "reference": chosen.completion_text,
                    "split": "train",
                    "metadata": metadata | {"rejected": rejected.completion_text},
                }
            )
        else:
            yield _line(
                {
                    "id": pair_id,
                    "prompt": chosen.item.text,
                    "chosen": chosen.completion_text,
                    "rejected": rejected.completion_text,
                    "metadata": metadata,
                }
            )


def export_lines(*, run: Run, export_format: str) -> Iterator[str]:
    if export_format == "sft":
        return sft_lines(run=run)
    return dpo_lines(run=run, as_task_set=export_format == "dpo-task-set")

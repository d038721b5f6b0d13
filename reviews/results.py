"""What a Train on reviews achieved: the reviews run's final held-out results against its
control's (the parent's checkpoint continued without the reviews), paired item by item, beside its
own outcome against the parent.

Both runs are evaluated on the same held-out items, but the reviews run's items are copies in its
new task-set version, so the pairing is by the item's external id. The verdict is
`beats_control` or `loses_to_control` only when the paired bootstrap interval excludes 0
(`runs.outcomes`), else `no_difference`; until both runs have finished with a final evaluation it
is `pending` (either still active) or `incomplete` (either ended without one).
"""

from typing import Any

from django.urls import reverse

from reviews.models import ReviewTraining
from runs import outcomes
from runs.models import HeldOutResult, Run

VERDICTS = {"improved": "beats_control", "regressed": "loses_to_control", "unchanged": "no_difference"}


def final_step(run: Run | None) -> int | None:
    """The policy version a finished run's outcome was settled at; None while it has none."""
    if run is None or run.status != Run.Status.SUCCEEDED or not run.outcome_detail:
        return None
    return run.outcome_detail.get("to_step")


def scores_by_external_id(run_id: int, step: int) -> dict[str, float]:
    """Each held-out item's pass (1/0) at a version, keyed by the item's external id (errored
    items left out), so a run on a copy of the items pairs with a run on the originals."""
    rows = HeldOutResult.objects.filter(run_id=run_id, step=step, errored=False)
    return {
        external_id: float(passed) for external_id, passed in rows.values_list("item__external_id", "passed")
    }


def figure(run: Run | None) -> dict[str, Any] | None:
    """A run's own outcome against the checkpoint it started from, as it recorded it."""
    if run is None:
        return None
    detail = run.outcome_detail or {}
    keys = ("before", "after", "delta", "low", "high", "items", "verdict")
    return {
        "run": run.pk,
        "name": run.name,
        "status": run.status,
        "outcome": run.outcome or None,
        **{key: detail.get(key) for key in keys},
        "sentence": outcomes.outcome_sentence(detail) if detail else "",
    }


def _state(run: Run, control: Run | None) -> str:
    if control is None:
        return "incomplete"
    if not (run.is_terminal and control.is_terminal):
        return "pending"
    return "complete" if final_step(run) is not None and final_step(control) is not None else "incomplete"


def lift_over_control(run: Run, control: Run | None) -> dict[str, Any] | None:
    """The paired comparison of the two final evaluations: before = control, after = reviews run;
    None unless both finished with one (the `complete` state)."""
    run_step, control_step = final_step(run), final_step(control)
    if control is None or run_step is None or control_step is None:
        return None
    comparison = outcomes.paired_compare(
        scores_by_external_id(control.pk, control_step), scores_by_external_id(run.pk, run_step)
    )
    detail = comparison.as_dict()
    return detail | {
        "control_step": control_step,
        "run_step": run_step,
        "verdict": VERDICTS[comparison.verdict],
    }


def flags(run: Run, control: Run | None, lift: dict[str, Any] | None) -> list[str]:
    """What a person must not miss, in words: a run worse than its parent, or than its control."""
    said = []
    if run.outcome == Run.Outcome.REGRESSED:
        said.append(f"Regressed against its parent: {outcomes.outcome_sentence(run.outcome_detail)}.")
    if lift is not None and lift["verdict"] == "loses_to_control":
        said.append(
            f"Lost to its control: {lift['after']:.1%} against the control's {lift['before']:.1%} "
            f"on {lift['items']} items; the same steps without the reviews did better."
        )
    if run.is_terminal and run.status != Run.Status.SUCCEEDED:
        said.append(f"The reviews run {run.status}: no final held-out evaluation to compare.")
    if control is not None and control.is_terminal and control.status != Run.Status.SUCCEEDED:
        said.append(f"The control {control.status}: the lift over it cannot be measured.")
    if control is None:
        said.append("The control was deleted: the lift over it cannot be measured.")
    return said


def review_training_result(training: ReviewTraining) -> dict[str, Any]:
    """The result of a Train on reviews as the page and REST show it."""
    run, control = training.run, training.control
    state = _state(run, control)
    lift = lift_over_control(run, control)  # None in every state but complete
    other = control.pk if control else training.parent_id
    return {
        "id": training.pk,
        "created_at": training.created_at,
        "status": state,
        "method": training.method,
        "steps": run.max_steps,
        "parent": training.parent_id,
        "checkpoint": training.checkpoint_id,
        "counts": training.counts,
        "run": figure(run),
        "control": figure(control),
        "lift_over_control": lift,
        "regressed": run.outcome == Run.Outcome.REGRESSED,
        "flags": flags(run, control, lift),
        "compare_url": f"{reverse('run-compare')}?runs={run.pk},{other}",
    }

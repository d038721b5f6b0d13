"""Reviewed data out: SFT JSONL and DPO pairs, each line ready to be imported as a task set
(task-library JSONL) or used as a run's training data.

- `sft`: trajectories a reviewer labelled good and none labelled otherwise, as answer items:
  `prompt` is the task's prompt, `reference` the completion to imitate.
- `dpo`: preference pairs `{"id", "prompt", "chosen", "rejected", "metadata"}` (TRL's format):
  every explicit preference, then pairs implied by labels (a good and a bad or reward-hack
  completion of the same prompt) that no explicit preference already covers.
- `dpo-task-set`: the same pairs as answer items that a DPO run trains on: `reference` and
  `metadata.chosen` the chosen completion, `metadata.rejected` the rejected one.

A multi-step agent episode keeps its whole conversation (system, instructions, each assistant
turn with its `tool_calls`, each `tool` result) in TRL's conversational format, with the item's
tools as JSON schemas: an `sft` line is the agent item with `messages` and `tools`; a `dpo` line
has `prompt` (the system and user messages), `chosen` and `rejected` (each episode's turns after
them) and `tools`; a `dpo-task-set` line is the agent item with the two conversations under
`metadata.chosen` / `metadata.rejected`. All of them import as agent task items.

Every line keeps where it came from under `metadata.provenance` (the run, the trajectories, their
policy versions and rewards, the label or preference), never in a field a learner reads. Lines a
learner could not use are skipped and counted, never written: an empty completion, a pair whose
two completions are the same text, a repeat of a line already written, and (for training on
reviews, which learns from one completion) a multi-step agent episode.
"""

import csv
import io
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from inference.tool_chat import item_tools
from projects.models import TaskItem
from reviews.models import Preference, Review
from runs.models import Run, Trajectory

FORMATS = ("sft", "dpo", "dpo-task-set")
LABELS_FORMAT = "labels"  # every label and comment, JSONL (REST); the pages offer CSV too
BAD = (Review.Label.BAD, Review.Label.REWARD_HACK)
# Why a line was skipped: the keys of `Export.skipped`.
EMPTY, IDENTICAL, DUPLICATE, MULTI_STEP = "empty", "identical", "duplicate", "multi_step"
SKIP_REASONS = (EMPTY, IDENTICAL, DUPLICATE, MULTI_STEP)


@dataclass(frozen=True)
class Pair:
    chosen: Trajectory
    rejected: Trajectory
    source: str  # "preference" (a reviewer chose) or "labels" (good over bad of the same prompt)

    @property
    def pair_id(self) -> str:
        return f"{self.chosen.item.external_id}-t{self.chosen.pk}-over-t{self.rejected.pk}"


@dataclass
class Export:
    """The usable records of a run's reviews, and how many of each reason were skipped."""

    good: list[Trajectory] = field(default_factory=list)
    pairs: list[Pair] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)

    def counts(self) -> dict[str, int]:
        return {reason: self.skipped.get(reason, 0) for reason in SKIP_REASONS}


def _line(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False) + "\n"


def trajectory_provenance(trajectory: Trajectory) -> dict[str, Any]:
    return {
        "run": trajectory.run_id,
        "trajectory": trajectory.pk,
        "item": trajectory.item.external_id,
        "policy_version": trajectory.policy_version,
        "reward": trajectory.reward,
    }


def pair_provenance(pair: Pair) -> dict[str, Any]:
    return {
        "source": pair.source,
        "chosen": trajectory_provenance(pair.chosen),
        "rejected": trajectory_provenance(pair.rejected),
    }


def _labels_by_trajectory(run: Run) -> dict[int, set[str]]:
    labels: dict[int, set[str]] = {}
    rows = Review.objects.filter(trajectory__run=run).values_list("trajectory_id", "label")
    for trajectory_id, label in rows:
        labels.setdefault(trajectory_id, set()).add(label)
    return labels


def _single_turn(trajectory: Trajectory, skipped: Counter, conversations: bool = False) -> bool:
    """Whether one completion is the whole episode (not an agent's multi-step one), or the
    caller takes whole conversations."""
    if trajectory.item.kind == TaskItem.Kind.AGENT and not conversations:
        skipped[MULTI_STEP] += 1
        return False
    return True


def good_trajectories(run: Run, skipped: Counter, conversations: bool = False) -> list[Trajectory]:
    """Trajectories every reviewer labelled good, oldest first, one per distinct (prompt, text)."""
    good = sorted(pk for pk, found in _labels_by_trajectory(run).items() if found == {Review.Label.GOOD})
    kept, seen = [], set()
    for trajectory in Trajectory.objects.filter(pk__in=good).select_related("item").order_by("pk"):
        if not _single_turn(trajectory, skipped, conversations):
            continue
        if not trajectory.completion_text.strip() and trajectory.item.kind != TaskItem.Kind.AGENT:
            skipped[EMPTY] += 1
            continue
        key = (trajectory.item_id, trajectory.completion_text)
        if key in seen:
            skipped[DUPLICATE] += 1
            continue
        seen.add(key)
        kept.append(trajectory)
    return kept


def _candidate_pairs(run: Run) -> Iterator[Pair]:
    """Every explicit preference, then label-implied ones no preference already covers."""
    seen: set[tuple[int, int]] = set()
    explicit = (
        Preference.objects.filter(run=run).select_related("chosen__item", "rejected__item").order_by("pk")
    )
    for preference in explicit:
        key = (preference.chosen_id, preference.rejected_id)
        if key not in seen:
            seen.add(key)
            yield Pair(preference.chosen, preference.rejected, "preference")
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
        yield Pair(rows[good], rows[bad], "labels")


def preference_pairs(run: Run, skipped: Counter, conversations: bool = False) -> list[Pair]:
    """The pairs a DPO learner can learn from: two non-empty, different texts, each pair once."""
    kept, seen = [], set()
    for pair in _candidate_pairs(run):
        if not _single_turn(pair.chosen, skipped, conversations):
            continue
        chosen, rejected = pair_texts(pair)
        if not chosen.strip() or not rejected.strip():
            skipped[EMPTY] += 1
        elif chosen == rejected:
            skipped[IDENTICAL] += 1
        elif (key := (pair.chosen.item_id, chosen, rejected)) in seen:
            skipped[DUPLICATE] += 1
        else:
            seen.add(key)
            kept.append(pair)
    return kept


def pair_texts(pair: Pair) -> tuple[str, str]:
    """What a pair compares: the completions, or for agent episodes their whole conversations."""
    if pair.chosen.item.kind == TaskItem.Kind.AGENT:
        return json.dumps(conversation(pair.chosen)[2:]), json.dumps(conversation(pair.rejected)[2:])
    return pair.chosen.completion_text, pair.rejected.completion_text


def reviewed(run: Run, *, good: bool = True, pairs: bool = True, conversations: bool = False) -> Export:
    """What the run's reviews give to learn from, with every skipped record counted;
    `conversations` keeps agent episodes (as whole conversations) instead of skipping them."""
    export = Export()
    if good:
        export.good = good_trajectories(run, export.skipped, conversations)
    if pairs:
        export.pairs = preference_pairs(run, export.skipped, conversations)
    return export


INTERNAL = ("error_observation", "raw")  # kept by the episode for itself, not part of the format


def conversation(trajectory: Trajectory) -> list[dict]:
    """An agent episode's messages, rebuilt from its steps: each step's new messages (what it
    was shown) and its reply."""
    messages: list[dict] = []
    for step in trajectory.steps.order_by("index"):
        data = step.data()
        for message in [*(data.get("messages") or []), *([data["reply"]] if "reply" in data else [])]:
            messages.append({key: value for key, value in message.items() if key not in INTERNAL})
    return messages


def agent_item(trajectory: Trajectory) -> dict[str, Any]:
    """The episode's item as a task line's fields, its tools as JSON schemas."""
    data = {key: value for key, value in trajectory.item.data.items() if key != "metadata"}
    return data | {"tools": item_tools(trajectory.item.data)}


# --- lines ---------------------------------------------------------------------------------


def _item_prompt(item: TaskItem) -> dict[str, Any]:
    """An item's prompt as an export line holds it: its conversation when it has one (TRL's
    conversational format), else its prompt text."""
    messages = (item.data or {}).get("messages")
    return {"messages": messages} if messages else {"prompt": item.text}


def sft_line(trajectory: Trajectory) -> str:
    if trajectory.item.kind == TaskItem.Kind.AGENT:
        return _line(
            {"kind": "agent", "id": f"{trajectory.item.external_id}-t{trajectory.pk}"}
            | agent_item(trajectory)
            | {
                "messages": conversation(trajectory),
                "split": "train",
                "metadata": {"provenance": trajectory_provenance(trajectory) | {"label": "good"}},
            }
        )
    return _line(
        {
            "kind": "answer",
            "id": f"{trajectory.item.external_id}-t{trajectory.pk}",
            **_item_prompt(trajectory.item),
            "reference": trajectory.completion_text,
            "split": "train",
            "metadata": {"provenance": trajectory_provenance(trajectory) | {"label": "good"}},
        }
    )


def dpo_line(pair: Pair, *, as_task_set: bool) -> str:
    if pair.chosen.item.kind == TaskItem.Kind.AGENT:
        return agent_dpo_line(pair, as_task_set=as_task_set)
    chosen, rejected = pair.chosen.completion_text, pair.rejected.completion_text
    provenance = pair_provenance(pair)
    if not as_task_set:
        return _line(
            {
                "id": pair.pair_id,
                "prompt": (pair.chosen.item.data or {}).get("messages") or pair.chosen.item.text,
                "chosen": chosen,
                "rejected": rejected,
                "metadata": {"provenance": provenance},
            }
        )
    return _line(
        {
            "kind": "answer",
            "id": pair.pair_id,
            **_item_prompt(pair.chosen.item),
            "reference": chosen,
            "split": "train",
            "metadata": {"chosen": chosen, "rejected": rejected, "provenance": provenance},
        }
    )


def agent_dpo_line(pair: Pair, *, as_task_set: bool) -> str:
    """Two episodes of one agent item: the shared prompt (system and user), then each one's turns."""
    chosen, rejected = conversation(pair.chosen), conversation(pair.rejected)
    provenance = pair_provenance(pair)
    item = agent_item(pair.chosen)
    if not as_task_set:
        return _line(
            {
                "id": pair.pair_id,
                "prompt": chosen[:2],
                "chosen": chosen[2:],
                "rejected": rejected[2:],
                "tools": item["tools"],
                "metadata": {"provenance": provenance},
            }
        )
    metadata = {"chosen": chosen, "rejected": rejected, "provenance": provenance}
    return _line({"kind": "agent", "id": pair.pair_id} | item | {"split": "train", "metadata": metadata})


def export_build(*, run: Run, export_format: str) -> tuple[list[str], Export]:
    """The export's lines and what was skipped. Reviews are made by people, so a run's reviewed
    records fit in memory; building them first lets the answer carry the counts."""
    if export_format not in FORMATS:
        raise ValueError(f"unknown export format {export_format!r}; known: {', '.join(FORMATS)}")
    if export_format == "sft":
        export = reviewed(run, pairs=False, conversations=True)
        return [sft_line(trajectory) for trajectory in export.good], export
    export = reviewed(run, good=False, conversations=True)
    as_task_set = export_format == "dpo-task-set"
    return [dpo_line(pair, as_task_set=as_task_set) for pair in export.pairs], export


def empty_reason(*, run: Run, export_format: str) -> str:
    """Why the run's `export_format` export would hold no line, in words; "" when it has lines."""
    if export_format == "sft":
        export = reviewed(run, pairs=False, conversations=True)
        if export.good:
            return ""
        labelled = Review.objects.filter(trajectory__run=run, label=Review.Label.GOOD).count()
        why = "no trajectory of this run is labelled good" if not labelled else f"{labelled} labelled good"
        return f"No SFT examples to export: {why}{_skipped_text(export)}."
    export = reviewed(run, good=False, conversations=True)
    if export.pairs:
        return ""
    preferences = Preference.objects.filter(run=run).count()
    return (
        "No DPO pairs to export: a pair is a reviewer's choice between two completions of a prompt, "
        "or a completion labelled good and one labelled bad (or reward hack) for the same prompt; "
        f"this run has {preferences} choice{'s' if preferences != 1 else ''} and no such labelled pair"
        f"{_skipped_text(export)}."
    )


def _skipped_text(export: Export) -> str:
    skipped = [f"{count} {reason.replace('_', '-')}" for reason, count in export.counts().items() if count]
    return f" ({', '.join(skipped)} skipped)" if skipped else ""


# --- labels and comments, as reviewers wrote them ----------------------------------------

REVIEW_COLUMNS = (
    "trajectory",
    "item",
    "reviewer",
    "label",
    "comment",
    "reward",
    "outcome",
    "policy_version",
    "created_at",
    "updated_at",
)


def review_rows(run: Run) -> list[dict[str, Any]]:
    """Every label and comment on the run's trajectories, oldest first: what reviewers said, for
    analysis outside Flywheel (not a training file)."""
    reviews = (
        Review.objects.filter(trajectory__run=run)
        .select_related("trajectory__item", "reviewer")
        .order_by("created_at", "pk")
    )
    rows = []
    for review in reviews:
        trajectory = review.trajectory
        assert trajectory is not None  # the query is over the run's trajectories' reviews
        rows.append(
            {
                "trajectory": trajectory.pk,
                "item": trajectory.item.external_id,
                "reviewer": review.reviewer.get_username(),
                "label": review.label,
                "comment": review.comment,
                "reward": trajectory.reward,
                "outcome": trajectory.outcome,
                "policy_version": trajectory.policy_version,
                "created_at": review.created_at.isoformat(),
                "updated_at": review.updated_at.isoformat(),
            }
        )
    return rows


def review_jsonl(rows: list[dict[str, Any]]) -> list[str]:
    return [_line(row) for row in rows]


def review_csv(rows: list[dict[str, Any]]) -> list[str]:
    """CSV lines with a header; cells a spreadsheet would run as a formula are quoted as text."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(REVIEW_COLUMNS)
    for row in rows:
        writer.writerow([_cell(row[column]) for column in REVIEW_COLUMNS])
    return buffer.getvalue().splitlines(keepends=True)


def _cell(value: Any) -> Any:
    """A reviewer's comment starting with = + - @ would be a formula in a spreadsheet: kept as text.

    >>> _cell("=HYPERLINK(1)"), _cell("fine"), _cell(None), _cell(-0.5)
    ("'=HYPERLINK(1)", 'fine', '', -0.5)
    """
    if value is None:
        return ""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value

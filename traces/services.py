"""Writes of traces besides ingestion (traces.ingest): deleting them, and promoting a selection to
training data, a new version of a task set with each item's provenance.

Promotion turns each selected trace into what it can teach:

- a correction becomes an `answer` item whose reference is the correction; when the trace was
  also judged bad (thumbs down, a bad label, or a failure), the item carries a preference pair:
  the correction chosen over the completion (`metadata.chosen` / `metadata.rejected`, as DPO
  runs read them);
- without a correction, a trace judged good (thumbs up, a good label, or a success) becomes an
  `answer` item whose reference is its completion;
- anything else holds no right answer to learn from and is skipped, and counted.

The new version keeps the task set's latest items and adds the promoted ones (an item of the same
id is replaced), in the training split unless asked otherwise, and says in `metadata.provenance` which trace
each item came from.
"""

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction

from projects import services as project_services
from projects.models import Project, TaskSet, TaskSetVersion
from traces.models import Trace

PROMOTE_MAX = 10_000
GOOD_LABELS = {"good"}
BAD_LABELS = {"bad", "reward_hack"}
ID_UNSAFE = re.compile(r"[^A-Za-z0-9._:-]+")


@dataclass
class Promotion:
    version: TaskSetVersion
    created: bool
    counts: dict[str, Any] = field(default_factory=dict)


def trace_delete(*, trace: Trace) -> None:
    trace.delete()


def _verdict(trace: Trace, labels: set[str]) -> str | None:
    """ "good", "bad" or None (no judgement), from the user's thumbs, the reviewers' labels and
    the reported outcome, in that order of trust."""
    if trace.thumbs:
        return "good" if trace.thumbs == Trace.Thumbs.UP else "bad"
    if labels & BAD_LABELS:
        return "bad"
    if labels & GOOD_LABELS:
        return "good"
    if trace.success is not None:
        return "good" if trace.success else "bad"
    return None


def item_id(trace: Trace) -> str:
    return ("trace-" + ID_UNSAFE.sub("-", trace.external_id))[:200]


def provenance(trace: Trace, verdict: str | None) -> dict[str, Any]:
    return {
        "trace": trace.pk,
        "trace_id": trace.external_id,
        "project": trace.project_id,
        "model": trace.model,
        "tier": trace.tier_id,
        "score": trace.score,
        "success": trace.success,
        "thumbs": trace.thumbs or None,
        "verdict": verdict,
        "occurred_at": trace.occurred_at.isoformat(),
    }


def trace_item(
    trace: Trace, labels: set[str], skipped: Counter, split: str = "train"
) -> dict[str, Any] | None:
    """The task item a trace teaches, or None (the reason counted in `skipped`)."""
    if not trace.prompt.strip():
        skipped["no_prompt"] += 1
        return None
    verdict = _verdict(trace, labels)
    metadata: dict[str, Any] = {"provenance": provenance(trace, verdict)}
    if trace.has_correction:
        reference = trace.correction
        if verdict == "bad" and trace.completion.strip() and trace.completion != trace.correction:
            metadata |= {"chosen": trace.correction, "rejected": trace.completion}
    elif verdict == "good" and trace.completion.strip():
        reference = trace.completion
    else:
        skipped["no_reference"] += 1
        return None
    if trace.messages:  # the conversation whole, tool calls and results kept, for chat training
        metadata["messages"] = trace.messages
    item = {
        "kind": "answer",
        "id": item_id(trace),
        "prompt": trace.prompt,
        "reference": reference,
        "metadata": metadata,
    }
    return item if split == "auto" else item | {"split": split}


def _labels(traces: list[Trace]) -> dict[int, set[str]]:
    labels: dict[int, set[str]] = {}
    for trace in traces:
        labels[trace.pk] = {review.label for review in trace.reviews.all()}
    return labels


def _latest_lines(task_set: TaskSet, replaced: set[str]) -> list[dict[str, Any]]:
    latest = task_set.versions.first()
    if latest is None:
        return []
    return [
        {"kind": item.kind, "id": item.external_id, "split": item.split} | item.data
        for item in latest.items.order_by("position").iterator()
        if item.external_id not in replaced
    ]


@transaction.atomic
def traces_promote(
    *,
    project: Project,
    traces: list[Trace],
    by: User,
    task_set: TaskSet | None = None,
    task_set_name: str = "",
    split: str = "train",
) -> Promotion:
    """A new version of `task_set` (or of the project's task set named `task_set_name`, made if
    missing) holding its latest items and what the traces teach. Refused whole when no trace
    teaches anything. Promoted items land in `split` (train, heldout, or "auto": the set's seeded
    rule); corrections are training data, so train unless asked otherwise."""
    if split not in ("train", "heldout", "auto"):
        raise ValidationError({"split": f"must be train, heldout or auto; got {split!r}"})
    if len(traces) > PROMOTE_MAX:
        raise ValidationError({"traces": f"promote at most {PROMOTE_MAX} traces at once; got {len(traces)}"})
    skipped: Counter = Counter()
    labels = _labels(traces)
    items = [item for trace in traces if (item := trace_item(trace, labels[trace.pk], skipped, split))]
    pairs = sum("chosen" in item["metadata"] for item in items)
    counts = {
        "traces": len(traces),
        "answer_items": len(items),
        "preference_pairs": pairs,
        "skipped": {reason: skipped.get(reason, 0) for reason in ("no_prompt", "no_reference")},
    }
    if not items:
        raise ValidationError(
            {"traces": "no trace here teaches anything: promote ones with a correction, or judged good"}
        )
    if task_set is None:
        name = task_set_name.strip() or "traces"
        task_set = TaskSet.objects.filter(
            project=project, name=name
        ).first() or project_services.task_set_create(
            project=project, name=name, by=by, description="Promoted from production traces"
        )
    kept = _latest_lines(task_set, {item["id"] for item in items})
    counts["kept_items"] = len(kept)
    report = project_services.task_set_import(
        task_set=task_set,
        stream=[(json.dumps(line, ensure_ascii=False) + "\n").encode() for line in kept + items],
        file_format="jsonl",
        by=by,
        source_name=f"{len(items)} promoted traces",
    )
    if not report.ok or report.version is None:
        raise ValidationError({"traces": "; ".join(str(error) for error in report.errors)})
    return Promotion(version=report.version, created=report.created, counts=counts)

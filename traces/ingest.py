"""Trace ingestion: a batch of reports becomes traces, created or updated by the client's trace id.

Reporting a trace is idempotent: the same report again changes nothing, and a later report of the
same id (feedback that came afterwards, say) updates only the fields it carries. A batch is
checked whole before anything is written: one bad trace refuses the batch, naming each bad field
as `traces[i].field`, and leaves nothing half-written.
"""

from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from projects.models import Project
from tiers.models import Tier
from traces.models import Trace

# Report fields and the Trace columns they fill; feedback's are nested in the report.
SCALARS = ("prompt", "messages", "completion", "model", "score", "success", "latency_ms", "metadata")
FEEDBACK = {"thumbs": "thumbs", "correction": "correction", "comment": "feedback_comment"}
INSERT_ATTEMPTS = 3


@dataclass
class IngestResult:
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    traces: list[dict[str, Any]] = field(default_factory=list)

    @property
    def received(self) -> int:
        return self.created + self.updated + self.unchanged


def storable(text: str) -> str:
    """PostgreSQL text refuses NUL characters; model output may hold them."""
    return text.replace("\x00", "\ufffd")


def message_text(content: Any) -> str:
    """A message's text: a string, or the text parts of OpenAI's list-of-parts content (null: none)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def message_line(message: dict) -> str:
    """A message as one transcript line; tool calls are written out so a search finds them."""
    text = message_text(message.get("content"))
    calls = [
        f"{(call.get('function') or {}).get('name', '')}({(call.get('function') or {}).get('arguments', '')})"
        for call in message.get("tool_calls") or []
        if isinstance(call, dict)
    ]
    role = message["role"] + (f" {message['name']}" if message.get("name") else "")
    return f"{role}: {' '.join(filter(None, [text, *(f'[call {c}]' for c in calls)]))}"


def conversation_split(messages: list[dict]) -> tuple[str, str | None]:
    """(the prompt as text, the final assistant message's text or None).

    One user message (after any system message) is the prompt itself; a longer conversation is
    its transcript, a `role: text` line per message. A trailing assistant message is the answer.

    >>> conversation_split([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}])
    ('2+2?', None)
    >>> conversation_split([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    ('hi', 'hello')
    """
    answer = None
    if messages and messages[-1].get("role") == "assistant" and not messages[-1].get("tool_calls"):
        answer, messages = message_text(messages[-1]["content"]), messages[:-1]
    turns = [m for m in messages if m.get("role") != "system"]
    if len(turns) == 1 and turns[0].get("role") == "user":
        return message_text(turns[0]["content"]), answer
    return "\n".join(message_line(m) for m in messages), answer


def _columns(report: dict[str, Any]) -> dict[str, Any]:
    """The Trace columns a validated report sets (only the fields it carries)."""
    columns = {name: report[name] for name in SCALARS if name in report}
    for name, column in FEEDBACK.items():
        if name in report.get("feedback", {}):
            value = report["feedback"][name]
            columns[column] = "" if value is None else value
    if "tier" in report:
        columns["tier_id"] = report["tier"]
    if "timestamp" in report:
        columns["occurred_at"] = report["timestamp"]
    if "messages" in report:
        prompt, answer = conversation_split(report["messages"])
        columns["prompt"] = prompt
        if answer is not None and "completion" not in report:
            columns["completion"] = answer
    for name in ("prompt", "completion", "correction", "feedback_comment", "model"):
        if isinstance(columns.get(name), str):
            columns[name] = storable(columns[name])
    return columns


def _merged(reports: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """One report per trace id, in first-seen order; a later report of an id updates the earlier."""
    merged: dict[str, dict[str, Any]] = {}
    for report in reports:
        previous = merged.get(report["id"], {})
        feedback = previous.get("feedback", {}) | report.get("feedback", {})
        merged[report["id"]] = previous | report | ({"feedback": feedback} if feedback else {})
    return merged


def _problems(project: Project, reports: list[dict[str, Any]], known: set[str]) -> dict[str, str]:
    tier_ids = {report["tier"] for report in reports if report.get("tier") is not None}
    tiers = set(Tier.objects.filter(project=project, pk__in=tier_ids).values_list("pk", flat=True))
    problems = {}
    for index, report in enumerate(reports):
        where = f"traces[{index}]"
        if report.get("tier") is not None and report["tier"] not in tiers:
            problems[f"{where}.tier"] = f"no tier {report['tier']} in project {project.name}"
        if "prompt" in report and "messages" in report:
            problems[f"{where}.messages"] = "give prompt or messages, not both"
        new = report["id"] not in known
        known.add(report["id"])  # a later report of the same id in this batch updates this one
        if new and not report.get("prompt") and not report.get("messages"):
            problems[f"{where}.prompt"] = (
                f"trace {report['id']!r} is new: it needs a prompt or messages (a later report of "
                "a known trace may carry only what changed)"
            )
    return problems


def traces_ingest(*, project: Project, reports: list[dict[str, Any]]) -> IngestResult:
    """Create or update a trace per report (validated fields, as the API's serializer gives them)."""
    for attempt in range(INSERT_ATTEMPTS):
        try:
            return _ingest(project, reports)
        except IntegrityError:  # another batch created one of these ids meanwhile: now an update
            if attempt == INSERT_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


@transaction.atomic
def _ingest(project: Project, reports: list[dict[str, Any]]) -> IngestResult:
    ids = list(dict.fromkeys(report["id"] for report in reports))
    existing = {t.external_id: t for t in Trace.objects.filter(project=project, external_id__in=ids)}
    if problems := _problems(project, reports, set(existing)):
        raise ValidationError(problems)
    now, result = timezone.now(), IngestResult()
    new, changed, changed_fields = [], [], set()
    for trace_id, report in _merged(reports).items():
        columns = _columns(report)
        trace = existing.get(trace_id)
        if trace is None:
            trace = Trace(project=project, external_id=trace_id, created_at=now, updated_at=now, **columns)
            new.append(trace)
            result.created += 1
            result.traces.append({"trace_id": trace_id, "result": "created", "trace": trace})
            continue
        differs = {name for name, value in columns.items() if getattr(trace, name) != value}
        for name in differs:
            setattr(trace, name, columns[name])
        if differs:
            trace.updated_at = now
            changed.append(trace)
            changed_fields |= differs | {"updated_at"}
            result.updated += 1
        else:
            result.unchanged += 1
        result.traces.append(
            {"trace_id": trace_id, "result": "updated" if differs else "unchanged", "trace": trace}
        )
    Trace.objects.bulk_create(new)
    if changed:
        Trace.objects.bulk_update(changed, sorted(changed_fields))
    if new and new[0].pk is None:  # databases that do not return ids from a bulk insert
        pks = dict(
            Trace.objects.filter(project=project, external_id__in=[t.external_id for t in new]).values_list(
                "external_id", "pk"
            )
        )
        for trace in new:
            trace.pk = pks[trace.external_id]
    result.traces = [{"id": row.pop("trace").pk} | row for row in result.traces]
    return result

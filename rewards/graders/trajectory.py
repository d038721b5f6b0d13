"""Trajectory checks: counts over the episode's steps, for a formula to weigh (e.g. `- 0.2 * invalid`).

They return raw counts, not rates: a formula divides by `steps` where a rate is wanted. `kinds`
restricts a count to some kinds of step ("tool_call", "code", "command", "message").
"""

from typing import Any

from rewards.graders.base import Field, grader

KINDS = ("tool_call", "code", "command", "message")


def check_kinds(spec: dict) -> list[tuple[str, str]]:
    kinds = spec.get("kinds")
    if isinstance(kinds, list) and not set(kinds) <= set(KINDS):
        unknown = sorted(str(kind) for kind in set(kinds) - set(KINDS))
        return [("kinds", f"unknown step kinds {unknown}: use {', '.join(KINDS)}")]
    return []


def selected(steps: list[dict], kinds: list[str] | None) -> list[dict]:
    return steps if not kinds else [step for step in steps if step.get("kind") in kinds]


@grader("invalid_actions", check=check_kinds, kinds=Field(list, required=False))
def invalid_actions(context: Any, kinds: list[str] | None = None) -> float:
    """The number of steps whose action was invalid (`"valid": false`).

    >>> from rewards.graders.base import Context, Sample
    >>> steps = [{"kind": "command", "valid": False}, {"kind": "command", "valid": True}, {"kind": "code"}]
    >>> invalid_actions(Context({}, Sample(steps=steps)))
    1.0
    """
    return float(sum(step.get("valid") is False for step in selected(context.sample.steps, kinds)))


@grader("format_errors", check=check_kinds, kinds=Field(list, required=False))
def format_errors(context: Any, kinds: list[str] | None = None) -> float:
    """The number of steps whose output broke the expected format (`"format_ok": false`).

    >>> from rewards.graders.base import Context, Sample
    >>> format_errors(Context({}, Sample(steps=[{"format_ok": False}, {"format_ok": False}, {}])))
    2.0
    """
    return float(sum(step.get("format_ok") is False for step in selected(context.sample.steps, kinds)))


@grader("steps", check=check_kinds, kinds=Field(list, required=False))
def steps_taken(context: Any, kinds: list[str] | None = None) -> float:
    """The number of steps the episode took.

    >>> from rewards.graders.base import Context, Sample
    >>> steps_taken(Context({}, Sample(steps=[{"kind": "code"}, {"kind": "message"}])), kinds=["code"])
    1.0
    """
    return float(len(selected(context.sample.steps, kinds)))


@grader("tokens_used")
def tokens_used(context: Any) -> float:
    """The tokens the model generated: the sample's count, else the sum over its steps.

    >>> from rewards.graders.base import Context, Sample
    >>> steps = [{"tokens": 5}] * 3
    >>> tokens_used(Context({}, Sample(tokens=120))), tokens_used(Context({}, Sample(steps=steps)))
    (120.0, 15.0)
    """
    sample = context.sample
    if sample.tokens:
        return float(sample.tokens)
    return float(sum(int(step.get("tokens") or 0) for step in sample.steps))

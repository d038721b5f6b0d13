"""Model graders: a judge (a tier) reads templated chat messages and answers with a score or a label.

The judge is a callable `judge(tier_ref, messages, sampling_params) -> str`. The engine renders the
message templates, then appends one system message that states the expected answer ("a number
from 0 to 1", "one of: good, bad") so that any tier, however small, knows the format. The reply may
be JSON (`{"result": 0.8}` as OpenAI's graders answer) or plain text; the last number, or the label,
in it counts. No judge configured, or a judge that fails, is an infrastructure problem: the sample
is errored, never scored.
"""

import json
import re
from typing import Any

from rewards.graders.base import MESSAGES, Field, GradingError, as_number, grader

ROLES = ("system", "developer", "user", "assistant")
SAMPLING_KEYS = ("temperature", "top_p", "seed", "max_completions_tokens", "max_tokens", "reasoning_effort")
NUMBER = re.compile(r"[-+]?\d*\.?\d+(?:[eE][-+]?\d+)?")


def check_messages(spec: dict) -> list[tuple[str, str]]:
    problems = []
    messages = spec.get("input")
    if not isinstance(messages, list):
        return []
    if not messages:
        problems.append(("input", "needs at least one message"))
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            problems.append((f"input.{index}", "must be an object with role and content"))
            continue
        if message.get("role") not in ROLES:
            problems.append((f"input.{index}.role", f"must be one of {', '.join(ROLES)}"))
        if not isinstance(message.get("content"), (str, list, dict)):
            problems.append((f"input.{index}.content", "is required: text, or a list of content parts"))
        for key in sorted(set(message) - {"role", "content", "type"}):
            problems.append((f"input.{index}.{key}", "unknown field for a message"))
    params = spec.get("sampling_params")
    if isinstance(params, dict):
        for key in sorted(set(params) - set(SAMPLING_KEYS)):
            problems.append(
                (f"sampling_params.{key}", f"unknown sampling parameter: use {', '.join(SAMPLING_KEYS)}")
            )
    return problems


def check_score_model(spec: dict) -> list[tuple[str, str]]:
    problems = check_messages(spec)
    span = spec.get("range")
    if span is not None and not (
        isinstance(span, list)
        and len(span) == 2
        and all(as_number(v) is not None for v in span)
        and span[0] < span[1]
    ):
        problems.append(("range", "must be two numbers [low, high] with low < high"))
    return problems


def check_label_model(spec: dict) -> list[tuple[str, str]]:
    problems = check_messages(spec)
    labels, passing = spec.get("labels"), spec.get("passing_labels")
    if isinstance(labels, list):
        if not labels or not all(isinstance(label, str) and label for label in labels):
            problems.append(("labels", "must be a non-empty list of non-empty strings"))
        if isinstance(passing, list) and not set(passing) <= set(labels):
            unknown = sorted(str(label) for label in set(passing) - set(labels))
            problems.append(("passing_labels", f"{unknown} are not among labels {labels}"))
    return problems


def ask(context: Any, model: str, messages: list[dict], params: dict, expected: str) -> str:
    if context.judge is None:
        raise GradingError("judge_error", "no judge configured", errored=True)
    prompt = [*messages, {"role": "system", "content": expected}]
    try:
        reply = context.judge(model, prompt, dict(params or {}))
    except Exception as exc:  # noqa: BLE001  (whatever the tier raised: the sample is errored, not scored)
        message = f"the judge {model!r} failed: {type(exc).__name__}: {exc}"
        raise GradingError("judge_error", message, errored=True) from None
    if not isinstance(reply, str):
        raise GradingError("invalid_output", f"the judge answered {type(reply).__name__}, not text")
    return reply


def reply_result(reply: str) -> Any:
    """The `result` of a JSON reply, else the text itself."""
    try:
        parsed = json.loads(reply)
    except ValueError:
        return reply.strip()
    if isinstance(parsed, dict):
        for key in ("result", "score", "label"):
            if key in parsed:
                return parsed[key]
    return parsed


def parse_score(reply: str, low: float, high: float) -> float:
    """The score a judge's reply states, inside [low, high].

    >>> parse_score('{"result": 0.8}', 0, 1), parse_score("Steps... so the score is 7", 0, 10)
    (0.8, 7.0)
    """
    result = reply_result(reply)
    number = as_number(result) if not isinstance(result, str) else None
    if number is None and isinstance(result, str):
        found = NUMBER.findall(result)
        number = float(found[-1]) if found else None
    if number is None:
        raise GradingError("invalid_output", f"the judge's reply states no score: {reply[:200]!r}")
    if not low <= number <= high:
        raise GradingError(
            "invalid_output", f"the judge's score {number:g} is outside the range [{low:g}, {high:g}]"
        )
    return number


@grader(
    "score_model",
    check=check_score_model,
    openai=True,
    uses_judge=True,
    input=Field(list, form=MESSAGES),
    model=Field(str),
    range=Field(list, required=False),
    sampling_params=Field(dict, required=False),
)
def score_model(
    context: Any,
    input: list[dict],
    model: str,
    range: list[float] | None = None,
    sampling_params: dict | None = None,
) -> float:
    """The score the judge gives, in `range` (default [0, 1]).

    >>> from rewards.graders.base import Context, Sample
    >>> judge = lambda tier, messages, params: '{"result": 0.25}'
    >>> messages = [{"role": "user", "content": "Rate it"}]
    >>> score_model(Context({}, Sample(), judge=judge), messages, "judge-tier")
    0.25
    """
    low, high = (float(range[0]), float(range[1])) if range else (0.0, 1.0)
    expected = f'Reply with JSON {{"result": <a number from {low:g} to {high:g}>}}.'
    return parse_score(ask(context, model, input, sampling_params or {}, expected), low, high)


def parse_label(reply: str, labels: list[str]) -> str:
    """The label a judge's reply names (case and surrounding punctuation ignored).

    >>> labels = ["correct", "incorrect"]
    >>> parse_label('{"result": "Correct"}', labels), parse_label("incorrect.", labels)
    ('correct', 'incorrect')
    """
    result = reply_result(reply)
    text = str(result).strip().strip(".!\"'`").casefold()
    by_fold = {label.casefold(): label for label in labels}
    if text in by_fold:
        return by_fold[text]
    raise GradingError(
        "invalid_output", f"the judge's reply names none of the labels {labels}: {reply[:200]!r}"
    )


@grader(
    "label_model",
    check=check_label_model,
    openai=True,
    uses_judge=True,
    input=Field(list, form=MESSAGES),
    model=Field(str),
    labels=Field(list),
    passing_labels=Field(list),
    sampling_params=Field(dict, required=False),
)
def label_model(
    context: Any,
    input: list[dict],
    model: str,
    labels: list[str],
    passing_labels: list[str],
    sampling_params: dict | None = None,
) -> float:
    """1.0 when the judge's label is one of passing_labels, else 0.0.

    >>> from rewards.graders.base import Context, Sample
    >>> judge = lambda tier, messages, params: "incorrect"
    >>> messages = [{"role": "user", "content": "?"}]
    >>> label_model(Context({}, Sample(), judge=judge), messages, "t", ["correct", "incorrect"], ["correct"])
    0.0
    """
    expected = f'Reply with JSON {{"result": <one of: {", ".join(labels)}>}}.'
    label = parse_label(ask(context, model, input, sampling_params or {}, expected), labels)
    return float(label in passing_labels)

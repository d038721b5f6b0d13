"""Small formatting filters for run pages."""

import re
from datetime import timedelta
from typing import Any

from django import template

from runs.outcomes import outcome_sentence

register = template.Library()


@register.filter
def duration(value: timedelta | None) -> str:
    """A run's duration the way people say it: 42s, 3m 05s, 2h 07m, 3d 4h; a dash when unknown.

    >>> duration(timedelta(seconds=185)), duration(timedelta(hours=2, minutes=7)), duration(None)
    ('3m 05s', '2h 07m', '—')
    """
    if value is None:
        return "—"
    seconds = max(0, int(value.total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {seconds:02d}s"
    return f"{seconds}s"


@register.filter
def outcome_text(detail: dict | None) -> str:
    """A run's outcome in words (runs/outcomes.py), for its header and the runs table's tooltip."""
    return outcome_sentence(detail)


@register.filter
def skip_prefix(text: str, skip: int) -> str:
    """`text` past its first `skip` characters, an ellipsis marking the cut: a trajectory's prompt
    preview skips the instruction every prompt of the page shares.

    >>> skip_prefix("Solve this. What is 1 + 1?", 12), skip_prefix("What is 2 + 2?", 0)
    ('…What is 1 + 1?', 'What is 2 + 2?')
    """
    return f"…{text[skip:]}" if skip else text


@register.filter
def figure(value: float | int | None, places: int = 4) -> str:
    """A measured number the way people read it: whole values as integers, others to `places`
    decimals without trailing zeros; a dash when missing.

    >>> figure(16.0), figure(0.25), figure(0.123456), figure(None), figure(1e6)
    ('16', '0.25', '0.1235', '—', '1000000')
    """
    if value is None:
        return "—"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    if number != number or number in (float("inf"), float("-inf")):
        return str(number)
    if number.is_integer():
        return str(int(number))
    text = f"{number:.{int(places)}f}".rstrip("0").rstrip(".")
    return text if text not in ("-0", "") else "0"


@register.filter
def flag_label(flag: Any) -> dict[str, str]:
    """A reward-hacking flag as a person reads it: its detector as words, its evidence and its
    note (a note marks a flag that raises no alert).

    >>> flag_label({"detector": "early_exit", "evidence": "sys.exit(0)", "note": ""})["label"]
    'Early exit'
    >>> flag_label("odd")["label"]
    'odd'
    """
    if not isinstance(flag, dict):
        return {"label": str(flag), "evidence": "", "note": ""}
    detector = str(flag.get("detector") or "flag")
    return {
        "label": detector.replace("_", " ").replace("-", " ").capitalize(),
        "detector": detector,
        "evidence": str(flag.get("evidence") or ""),
        "note": str(flag.get("note") or ""),
    }


# A progress bar's redraw: "45%|████▌     | 9/20 [00:01<00:01, 8.1it/s]" and the like.
PROGRESS = re.compile(r"\d+%\|.*\|\s*\d+/\d+|\d+/\d+ \[\d+:\d+")


@register.filter
def error_reason(message: str | None) -> str:
    """A failed run's reason: the first line of its error (the learner's log follows it).

    >>> error_reason("the learner exited with 1\\nTraceback ...")
    'the learner exited with 1'
    """
    return (message or "").split("\n", 1)[0].strip()


@register.filter
def error_log(message: str | None) -> str:
    """The learner's log after a failed run's reason, its lines kept, progress-bar redraws gone.

    >>> error_log("failed\\nloading\\r 10%|#    | 1/10\\r100%|#####| 10/10\\nTraceback (last call):")
    'loading\\nTraceback (last call):'
    """
    rest = (message or "").split("\n", 1)[1:] or [""]
    kept = []
    for line in rest[0].replace("\r\n", "\n").split("\n"):
        if "\r" in line:
            # What a terminal would have shown: the first write, unless it is itself a bar.
            line = next((part for part in line.split("\r") if part.strip() and not PROGRESS.search(part)), "")
        if line and PROGRESS.search(line):
            continue
        if line.strip():
            kept.append(line)
    return "\n".join(kept)


@register.filter
def column_title(name: str) -> str:
    """A machine name (a sub-reward, a setting) as a column heading.

    >>> column_title("hacking_floor"), column_title("tests"), column_title("judge.score")
    ('Hacking floor', 'Tests', 'Judge.score')
    """
    text = str(name).replace("_", " ").strip()
    return text[:1].upper() + text[1:]

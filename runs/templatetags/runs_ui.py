"""Small formatting filters for run pages."""

from datetime import timedelta

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

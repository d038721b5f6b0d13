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

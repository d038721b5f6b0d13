"""Reads of traces, through the caller's role in their project (runs.selectors), and the filters
the traces page, REST and review queues share."""

import re
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db.models import Q, QuerySet
from django.http import Http404

from core.roles import Permission
from projects import selectors as project_selectors
from traces.models import Trace

FILTERS = (
    "q",
    "trace_id",
    "model",
    "tier",
    "thumbs",
    "success",
    "has_correction",
    "min_score",
    "max_score",
    "since",
    "until",
    "label",
    "meta",
)
META_KEY = re.compile(r"[A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*")


def traces_for(*, user: User) -> QuerySet[Trace]:
    return Trace.objects.filter(project_id__in=project_selectors.visible_project_ids(user=user))


def trace_for(*, user: User, trace_id: int, permission: str = Permission.VIEW) -> Trace:
    trace = Trace.objects.select_related("project", "tier").filter(pk=trace_id).first()
    if trace is None:
        raise Http404("no such trace")
    project_selectors.require(user=user, project_id=trace.project_id, permission=permission)
    return trace


def traces_filtered(traces: QuerySet[Trace], **filters: Any) -> QuerySet[Trace]:
    """`traces` narrowed by the filters given (None or "" means not filtered).

    q: words found in the prompt, the completion or the correction; thumbs: up, down or none;
    label: a review label or unreviewed; meta: `key:value`, a metadata value as text.
    """
    given = {name: value for name, value in filters.items() if value not in (None, "")}
    if q := given.get("q"):
        for word in str(q).split()[:10]:
            traces = traces.filter(
                Q(prompt__icontains=word) | Q(completion__icontains=word) | Q(correction__icontains=word)
            )
    simple = {"trace_id": "external_id", "model": "model", "tier": "tier_id", "success": "success"}
    traces = traces.filter(**{column: given[name] for name, column in simple.items() if name in given})
    if "thumbs" in given:
        traces = traces.filter(thumbs="" if given["thumbs"] == "none" else given["thumbs"])
    if "has_correction" in given:
        with_correction = ~Q(correction="")
        traces = traces.filter(with_correction if given["has_correction"] else ~with_correction)
    if "min_score" in given:
        traces = traces.filter(score__gte=given["min_score"])
    if "max_score" in given:
        traces = traces.filter(score__lte=given["max_score"])
    if "since" in given:
        traces = traces.filter(occurred_at__gte=given["since"])
    if "until" in given:
        traces = traces.filter(occurred_at__lt=given["until"])
    if label := given.get("label"):
        traces = (
            traces.filter(reviews__isnull=True)
            if label == "unreviewed"
            else traces.filter(reviews__label=label)
        ).distinct()
    if meta := given.get("meta"):
        key, value = meta_filter(str(meta))
        traces = traces.filter(**{f"metadata__{key}": value})
    return traces


def meta_filter(text: str) -> tuple[str, str]:
    """(key, value) of a `key:value` metadata filter; the key is a plain name, never a lookup.

    >>> meta_filter("customer: acme")
    ('customer', 'acme')
    """
    key, separator, value = text.partition(":")
    key = key.strip()
    if not separator or not META_KEY.fullmatch(key):
        raise ValidationError({"meta": "must be key:value, the key made of letters, digits, - and single _"})
    return key, value.strip()


def models_of(*, project_id: int) -> list[str]:
    """The model names a project's traces report, for the page's filter."""
    names = Trace.objects.filter(project_id=project_id).exclude(model="").values_list("model", flat=True)
    return sorted(set(names.distinct()[:200]))

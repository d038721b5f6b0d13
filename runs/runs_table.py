"""The runs table (project page and the runs page): each run with the numbers people compare runs
by, annotated in SQL so the table sorts and filters over every run, not just the page shown."""

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, TypedDict

from django.db.models import F, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce, Now

from runs.learners import algorithm_choices, algorithm_names
from runs.models import MetricPoint, Run

REWARD = "reward/mean"
HELDOUT = "heldout/pass_rate"
# What the run had spent by its last step, written by the learner (costs/ computes it): a metric,
# so the table sorts and filters by cost in SQL without importing the app above runs.
COST = "cost/total"
# Column key -> the annotation or field it sorts by (descending with a leading "-").
SORTS = {
    "name": "name",
    "project": "project__name",
    "status": "status",
    "method": "method",
    "model": "model",
    "steps": "learner_step",
    "reward": "last_reward",
    "heldout": "heldout_pass_rate",
    "duration": "duration",
    "cpu": "sandbox_cpu_seconds",
    "cost": "cost",
    "created": "created_at",
}
DEFAULT_SORT = "-created"


@dataclass(frozen=True)
class RunQuery:
    """What the table's controls ask for; every field is optional."""

    q: str = ""
    status: str = ""
    method: str = ""
    cost_min: float | None = None
    sort: str = DEFAULT_SORT

    @classmethod
    def from_params(cls, params) -> "RunQuery":
        sort = params.get("sort", DEFAULT_SORT)
        status = params.get("status", "")
        method = params.get("method", "")
        try:
            cost_min: float | None = float(params.get("cost_min", ""))
        except ValueError:  # empty or not a number: no cost filter
            cost_min = None
        return cls(
            cost_min=cost_min,
            q=params.get("q", "").strip()[:200],
            status=status if status in Run.Status.values else "",
            method=method if method in algorithm_names() else "",
            sort=sort if sort.removeprefix("-") in SORTS else DEFAULT_SORT,
        )

    def sort_link(self, column: str) -> str:
        """The sort a column header links to: its own column flips direction."""
        if self.sort == column:
            return f"-{column}"
        if self.sort == f"-{column}":
            return column
        return (
            f"-{column}"
            if column in ("reward", "heldout", "steps", "cpu", "cost", "duration", "created")
            else column
        )


def _latest(name: str) -> Subquery:
    points = MetricPoint.objects.filter(run=OuterRef("pk"), name=name).order_by("-step", "-pk")
    return Subquery(points.values("value")[:1])


class RunColumns(TypedDict):
    """What runs_table annotates each run with in SQL."""

    last_reward: float | None
    heldout_pass_rate: float | None
    cost: float | None
    duration: timedelta | None
    model: str | None


if TYPE_CHECKING:  # django-stubs' type of an annotated model; not subscriptable like this at run time
    from django_stubs_ext import WithAnnotations

    TableRun = WithAnnotations[Run, RunColumns]


@dataclass(frozen=True)
class TableRow:
    """A row of the table: the run, and what the page adds to it beside the SQL columns."""

    run: "TableRun"
    queue_position: int | None
    model_short: str  # the part of the model path that tells the rows apart


def runs_table(runs: QuerySet[Run], query: RunQuery) -> "QuerySet[TableRun]":
    """`runs` with last_reward, heldout_pass_rate, duration and model, filtered and sorted."""
    runs = runs.select_related("project", "tier").annotate(
        last_reward=_latest(REWARD),
        heldout_pass_rate=_latest(HELDOUT),
        cost=_latest(COST),
        duration=Coalesce(F("finished_at"), Now()) - F("started_at"),
        model=F("tier_config__base_model"),
    )
    if query.status:
        runs = runs.filter(status=query.status)
    if query.method:
        runs = runs.filter(method=query.method)
    if query.cost_min is not None:
        runs = runs.filter(cost__gte=query.cost_min)
    if query.q:
        runs = runs.filter(
            Q(name__icontains=query.q)
            | Q(tier_config__base_model__icontains=query.q)
            | Q(tier_config__name__icontains=query.q)
            | Q(project__name__icontains=query.q)
        )
    key = SORTS[query.sort.removeprefix("-")]
    descending = query.sort.startswith("-")
    order = F(key).desc(nulls_last=True) if descending else F(key).asc(nulls_last=True)
    return runs.order_by(order, "-pk")


def _shared_folder(paths: list[str]) -> int:
    """How many leading path parts every path shares (0 when fewer than two paths).

    >>> _shared_folder(["/srv/models/a/final", "/srv/models/b/final"]), _shared_folder(["/x/y"])
    (3, 0)
    """
    if len(paths) < 2:
        return 0
    parts = [path.rstrip("/").split("/") for path in paths]
    shared = 0
    for column in zip(*parts, strict=False):
        if len(set(column)) > 1:
            break
        shared += 1
    return shared


def _model_tail(path: str | None, shared: int) -> str:
    """The part of a model path that tells the rows apart: what follows the folders every row
    shares (the last two parts when nothing is shared), with an ellipsis for what was cut.

    >>> _model_tail("/srv/models/a/final", 3), _model_tail("/srv/models/base", 0), _model_tail("gpt2", 0)
    ('…/a/final', '…/models/base', 'gpt2')
    """
    if not path:
        return ""
    parts = path.rstrip("/").split("/")
    # Nothing shared (one row, or paths from different roots): the last two parts name it best.
    keep = min(max(len(parts) - shared, 2) if shared else 2, len(parts))
    tail = "/".join(parts[-keep:])
    return tail if keep == len(parts) else f"…/{tail}"


COLUMNS = [
    ("name", "Name", ""),
    ("project", "Project", ""),
    ("status", "Status", ""),
    ("method", "Method", ""),
    ("model", "Model", ""),
    ("steps", "Steps", "num"),
    ("reward", "Last reward", "num"),
    ("heldout", "Held-out pass rate", "num"),
    ("duration", "Duration", "num"),
    ("cpu", "Sandbox CPU-s", "num"),
    ("cost", "Cost", "num"),
    ("created", "Created", ""),
]


def table_context(
    runs: QuerySet[Run], params, *, action: str, show_project: bool, limit: int, positions: dict[int, int]
) -> dict:
    """What templates/runs/_runs_table.html draws: the rows (at most `limit`), the columns with
    their sort links, and the filter controls as the query string set them."""
    query = RunQuery.from_params(params)
    found = list(runs_table(runs, query)[: limit + 1])
    more = len(found) > limit
    found = found[:limit]
    shared = _shared_folder([run.model for run in found if run.model])
    rows = [TableRow(run, positions.get(run.pk), _model_tail(run.model, shared)) for run in found]
    kept = params.copy()
    for name in ("sort", "page"):
        kept.pop(name, None)
    base = kept.urlencode()
    current = query.sort.removeprefix("-")
    columns = [
        {
            "key": key,
            "label": label,
            "class": css,
            "link": query.sort_link(key),
            "sorted": ("descending" if query.sort.startswith("-") else "ascending") if key == current else "",
        }
        for key, label, css in COLUMNS
        if show_project or key != "project"
    ]
    return {
        "rows": rows,
        "columns": columns,
        "query": query,
        "base": f"{base}&" if base else "",
        "action": action,
        "hidden": [("project", params["project"])] if params.get("project", "").isdigit() else [],
        "show_project": show_project,
        "filtered": bool(query.q or query.status or query.method or query.cost_min is not None),
        "statuses": Run.Status.choices,
        "methods": algorithm_choices(),
        "more": f"The first {limit} runs shown; narrow them with the search or filters." if more else "",
    }

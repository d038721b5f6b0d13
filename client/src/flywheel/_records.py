"""Typed answers: every JSON object the API returns is a `Record`, a dict that also reads its keys
as attributes (`run.status` as well as `run["status"]`), nested objects included, so code written
for plain dicts keeps working and json.dumps writes it as it came."""

from __future__ import annotations

from typing import Any


class Record(dict[str, Any]):
    """A JSON object of the API. Keys that are also dict methods (`items`, `keys`, `values`, ...)
    read as the method; index those (`record["items"]`).

    >>> run = Record.wrap({"id": 7, "progress": {"learner_step": 3}, "tags": [{"n": 1}]})
    >>> run.id, run.progress.learner_step, run["progress"]["learner_step"], run.tags[0].n
    (7, 3, 3, 1)
    >>> run.missing
    Traceback (most recent call last):
    ...
    AttributeError: this Record has no field 'missing'; its fields: id, progress, tags
    """

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(
                f"this Record has no field {name!r}; its fields: {', '.join(self) or 'none'}"
            ) from None

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | {key for key in self if key.isidentifier()})

    @classmethod
    def wrap(cls, value: Any) -> Any:
        """The JSON value with every object in it a Record (lists and scalars as they are)."""
        if isinstance(value, dict):
            return cls((key, cls.wrap(item)) for key, item in value.items())
        if isinstance(value, list):
            return [cls.wrap(item) for item in value]
        return value


# The API's main objects, typed for editors and type checkers: the annotations name the fields the
# server's serializers send (a Record reads any other field too). At run time each is a Record.


class Project(Record):
    __slots__ = ()
    id: int
    name: str
    description: str
    created_by: int | None
    created_at: str


class TaskSet(Record):
    __slots__ = ()
    id: int
    project: int
    name: str
    description: str
    created_by: int | None
    created_at: str


class TaskSetVersion(Record):
    """A task set's version: `id` is what a run takes (`task_set_version=`), `number` its place."""

    __slots__ = ()
    id: int
    task_set: int
    number: int
    content_hash: str
    item_count: int
    kind_counts: Record
    split_counts: Record
    split_seed: int
    heldout_fraction: float
    source_name: str
    created_by: int | None
    created_at: str


class Tier(Record):
    __slots__ = ()
    id: int
    project: int
    name: str
    description: str
    base_model: str
    engine: str
    precision: str
    temperature: float
    max_new_tokens: int
    created_at: str
    updated_at: str


class RewardRuleVersion(Record):
    """A reward rule's version: `id` is what a run takes (`reward_rule_version=`)."""

    __slots__ = ()
    id: int
    rule: int
    number: int
    spec: Record
    content_hash: str
    note: str
    is_used: bool
    used_at: str | None
    created_by: int | None
    created_at: str


class RewardRule(Record):
    __slots__ = ()
    id: int
    project: int
    name: str
    description: str
    version_count: int
    latest_version: Record
    created_by: int | None
    created_at: str


class Run(Record):
    """A run; `progress` (learner_step, max_steps, ...), `error` (message, where) and `outcome`
    are Records; the detail (`runs.get`) adds `resolved`, `hyperparameters`, `best_checkpoint`."""

    __slots__ = ()
    id: int
    project: int
    name: str
    status: str
    error: Record | None
    method: str
    task_set_version: int
    reward_rule_version: int
    tier: int
    priority: int
    queue_position: int | None
    progress: Record
    outcome: Record | None
    parent: int | None
    parent_checkpoint: int | None
    created_by: int | None
    created_at: str
    updated_at: str


class RunEvent(Record):
    __slots__ = ()
    id: int
    run: int
    level: str
    kind: str
    message: str
    data: Record
    created_at: str


class Checkpoint(Record):
    __slots__ = ()
    id: int
    run: int
    step: int
    policy_version: int
    path: str
    metrics: Record
    heldout: Record
    heldout_pass_rate: float | None
    heldout_reward: float | None
    best: bool
    created_at: str


def shaped(value: Any, shape: type[Record]) -> Any:
    """A wrapped answer as `shape`: an object, or each object of a list."""
    if shape is Record:
        return value
    if isinstance(value, dict):
        return shape(value)
    if isinstance(value, list):
        return [shape(item) if isinstance(item, dict) else item for item in value]
    return value

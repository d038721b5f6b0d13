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

"""Exceptions every app raises and the API core answers in its one error shape."""


class StateError(Exception):
    """The object's current state does not allow this change (answers 409)."""

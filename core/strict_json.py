"""JSON from users, strictly: what Python's json module accepts but a JSON column, a database or a
recursive walk later chokes on is refused up front with a message that says what.

- `NaN`, `Infinity`, `-Infinity` (not JSON) and numbers that overflow a float (`1e999`);
- integers of more than MAX_INTEGER_DIGITS digits;
- nesting deeper than MAX_DEPTH arrays and objects (10,000 levels would crash the parser itself).

Used for request bodies (the REST parser), each line of an import, and JSON typed into forms.
"""

import json
import math
from collections.abc import Iterable
from typing import Any

MAX_DEPTH = 100
MAX_INTEGER_DIGITS = 100


class JsonInputError(ValueError):
    """The text is not JSON this application accepts; the message says why and where.

    `reason` is the message without the place; `lineno` and `colno` the place, when known.
    """

    def __init__(self, reason: str, lineno: int | None = None, colno: int | None = None) -> None:
        where = f" at line {lineno} column {colno}" if lineno is not None else ""
        super().__init__(f"{reason}{where}")
        self.reason, self.lineno, self.colno = reason, lineno, colno


def _decode_reason(exc: json.JSONDecodeError) -> str:
    """The json module's message without its dangling " at" (the place is added after it), and a
    raw control character named, since it is invisible in the text."""
    reason = exc.msg.removesuffix(" at")
    if reason == "Invalid control character" and exc.pos < len(exc.doc):
        char = exc.doc[exc.pos]
        escaped = json.dumps(char)[1:-1]
        reason = f"raw control character {char!r} inside a string: write it escaped, as {escaped}"
    return reason


def _refuse_constant(name: str) -> Any:
    raise JsonInputError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonInputError(f"{text} is out of range for a number")
    return value


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INTEGER_DIGITS:
        raise JsonInputError(f"an integer of {digits} digits is too long (at most {MAX_INTEGER_DIGITS})")
    return int(text)


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """The decoded value, or JsonInputError.

    >>> loads('{"a": [1, 2.5, "x"]}')
    {'a': [1, 2.5, 'x']}
    >>> loads('[NaN]')
    Traceback (most recent call last):
    ...
    core.strict_json.JsonInputError: NaN is not a JSON number
    >>> loads('[' * 200 + ']' * 200)
    Traceback (most recent call last):
    ...
    core.strict_json.JsonInputError: nested deeper than 100 levels
    """
    try:
        value = json.loads(
            text, parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_bounded_int
        )
    except JsonInputError:
        raise
    except json.JSONDecodeError as exc:
        raise JsonInputError(f"not valid JSON: {_decode_reason(exc)}", exc.lineno, exc.colno) from None
    except RecursionError:
        raise JsonInputError(f"nested deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise JsonInputError(f"not valid JSON: {exc}") from None
    if _may_be_deep(text, max_depth) and depth(value) > max_depth:
        raise JsonInputError(f"nested deeper than {max_depth} levels")
    return value


def _may_be_deep(text: str | bytes, max_depth: int) -> bool:
    # Counting brackets is C-fast; only text with enough of them can nest that deep.
    if isinstance(text, bytes):
        return text.count(b"[") + text.count(b"{") > max_depth
    return text.count("[") + text.count("{") > max_depth


def depth(value: Any) -> int:
    """How deeply arrays and objects nest in a decoded value (a scalar is 0), without recursion.

    >>> depth(1), depth([]), depth({"a": [1, {"b": []}]})
    (0, 1, 4)
    """
    deepest = 0
    stack = [(value, 1)]
    children: Iterable[Any]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest

"""The demo task family: write a one-line Python function from its description, graded by unit tests.

Every item is a task-library `code` item (see projects/task_format.py). A task applies one operation
(add, sub, mul) with a constant to its argument; the description names the operation with one of
four phrases ("x plus 3", "x increased by 3", "the sum of x and 3", "3 more than x"). Two kinds:

- `scalar`: `f(x)` returns the operation applied to x (`return x + 3`);
- `map`: `f(xs)` returns the operation applied to each element (`return [v + 3 for v in xs]`).

The pretraining corpus (workers/base_model.py) gets the constant wrong (off by one) for most
phrases much of the time, so the base model "half-knows" the family; the RL demo trains on scalar
items only and measures whether the lift carries over to the map kind it never saw during RL.

>>> sets = demo_task_sets(seed=7, train_size=4, heldout_size=2)
>>> [len(sets["train"]), len(sets["heldout"])]
[4, 2]
>>> sorted(sets["train"][0]) == sorted(ITEM_FIELDS)
True
"""

import random
from dataclasses import dataclass

OPS = {"add": "+", "sub": "-", "mul": "*"}
# Each operation's phrases, clearest first. `{x}` is the operand, `{n}` the constant.
PHRASES = {
    "add": ("{x} plus {n}", "{x} increased by {n}", "the sum of {x} and {n}", "{n} more than {x}"),
    "sub": ("{x} minus {n}", "{x} decreased by {n}", "the difference of {x} and {n}", "{n} less than {x}"),
    "mul": ("{x} times {n}", "{x} multiplied by {n}", "the product of {x} and {n}", "{x} scaled by {n}"),
}
KINDS = ("scalar", "map")
FUNCTION_NAMES = ("f", "g", "h", "calc", "solve", "apply")
ARGUMENTS = {"scalar": ("x", "n", "a", "value"), "map": ("xs", "items", "nums")}
CONSTANTS = tuple(range(2, 10))
TEST_INPUTS = (5, 11, -4)  # chosen so that no two operations agree on all of them for any constant
ITEM_FIELDS = ("id", "kind", "split", "prompt", "tests", "entry_point", "reference_solution", "metadata")


@dataclass(frozen=True)
class TaskSpec:
    """One task of the family, before it is rendered to text."""

    kind: str  # scalar or map
    op: str  # add, sub or mul
    phrase: int  # index into PHRASES[op]
    constant: int
    name: str
    argument: str

    @property
    def key(self) -> str:
        return f"{self.kind}-{self.op}-p{self.phrase}-{self.constant}-{self.name}-{self.argument}"


def apply_op(op: str, value: int, constant: int) -> int:
    """The operation's result: the ground truth that the tests encode.

    >>> apply_op("sub", 5, 3)
    2
    """
    return {"add": value + constant, "sub": value - constant, "mul": value * constant}[op]


def describe(spec: TaskSpec) -> str:
    """The task's description, as the prompt states it (the tests' inputs are not shown).

    >>> describe(TaskSpec("scalar", "sub", 3, 4, "g", "n"))
    'Write a Python function `g(n)` that returns 4 less than n.'
    """
    operand = spec.argument if spec.kind == "scalar" else f"each element of {spec.argument}"
    phrase = PHRASES[spec.op][spec.phrase].format(x=operand, n=spec.constant)
    suffix = "" if spec.kind == "scalar" else ", as a list"
    return f"Write a Python function `{spec.name}({spec.argument})` that returns {phrase}{suffix}."


def solution(spec: TaskSpec, op: str | None = None) -> str:
    """The function's source with the given operator (the task's own by default).

    >>> print(solution(TaskSpec("map", "add", 0, 3, "f", "xs")), end="")
    def f(xs):
        return [v + 3 for v in xs]
    """
    symbol = OPS[op or spec.op]
    if spec.kind == "scalar":
        body = f"{spec.argument} {symbol} {spec.constant}"
    else:
        body = f"[v {symbol} {spec.constant} for v in {spec.argument}]"
    return f"def {spec.name}({spec.argument}):\n    return {body}\n"


def tests(spec: TaskSpec) -> str:
    """Top-level asserts (each one a test for the sandbox) on inputs the example does not show."""
    lines = [f"from solution import {spec.name}", ""]
    if spec.kind == "scalar":
        for value in TEST_INPUTS:
            lines.append(f"assert {spec.name}({value}) == {apply_op(spec.op, value, spec.constant)}")
    else:
        for start in TEST_INPUTS:
            values = [start, start + 2]
            lines.append(
                f"assert {spec.name}({values}) == {[apply_op(spec.op, v, spec.constant) for v in values]}"
            )
    return "\n".join(lines) + "\n"


def item_from_spec(spec: TaskSpec) -> dict:
    return {
        "id": spec.key,
        "kind": "code",
        "prompt": describe(spec),
        "tests": tests(spec),
        "entry_point": spec.name,
        "reference_solution": solution(spec),
        "metadata": {"family": spec.kind, "op": spec.op, "phrase": spec.phrase},
    }


def all_specs() -> list[TaskSpec]:
    """Every task of the family, in a fixed order (the seed only shuffles it)."""
    return [
        TaskSpec(kind, op, phrase, constant, name, argument)
        for kind in KINDS
        for op in OPS
        for phrase in range(len(PHRASES[op]))
        for constant in CONSTANTS
        for name in FUNCTION_NAMES
        for argument in ARGUMENTS[kind]
    ]


def demo_split(seed: int, heldout_size: int) -> tuple[list[TaskSpec], list[TaskSpec]]:
    """(train, heldout) task specs: a seeded shuffle, held-out items balanced over both kinds."""
    rng = random.Random(seed)
    by_kind = {kind: [spec for spec in all_specs() if spec.kind == kind] for kind in KINDS}
    heldout: list[TaskSpec] = []
    train: list[TaskSpec] = []
    for index, kind in enumerate(KINDS):
        specs = by_kind[kind]
        rng.shuffle(specs)
        take = heldout_size // len(KINDS) + (index < heldout_size % len(KINDS))
        heldout += specs[:take]
        train += specs[take:]
    rng.shuffle(train)
    return train, heldout


def demo_task_sets(
    *, seed: int, train_size: int, heldout_size: int, kinds: tuple[str, ...] = KINDS
) -> dict[str, list[dict]]:
    """Task-library items split into `train` and `heldout`; `kinds` restricts the train split only.

    The held-out split depends on the seed and its size alone, so restricting the train kinds (the
    RL demo trains on scalar items) never changes what is evaluated.
    """
    train, heldout = demo_split(seed, heldout_size)
    train = [spec for spec in train if spec.kind in kinds][:train_size]
    return {
        "train": [item_from_spec(spec) | {"split": "train"} for spec in train],
        "heldout": [item_from_spec(spec) | {"split": "heldout"} for spec in heldout],
    }


def item_kind(item: dict) -> str:
    """The sub-family an item is reported under: `scalar-add`, `map-mul`, ..."""
    metadata = item.get("metadata") or {}
    return f"{metadata.get('family', 'other')}-{metadata.get('op', 'other')}"

"""The grader registry: a rule's `"type"` -> its GraderKind (fields, function, what it needs).

Each module registers its graders with `@grader(...)` when imported; importing this package
imports them all. `multi` is not a registry entry: the engine composes it from the others.
"""

from rewards.graders import judge, reward_model, sandboxed, text, trajectory  # noqa: F401  (they register themselves)
from rewards.graders.base import REGISTRY, GraderKind

MULTI = "multi"


def grader_types() -> list[str]:
    """Every type a rule may name, multi included.

    >>> "string_check" in grader_types() and "unit_tests" in grader_types() and "multi" in grader_types()
    True
    """
    return sorted([*REGISTRY, MULTI])


def grader_kind(type_name: str) -> GraderKind | None:
    return REGISTRY.get(type_name)


def openai_types() -> list[str]:
    """The types of OpenAI's grader JSON.

    >>> openai_types()
    ['label_model', 'multi', 'python', 'score_model', 'string_check', 'text_similarity']
    """
    return sorted([name for name, kind in REGISTRY.items() if kind.openai] + [MULTI])

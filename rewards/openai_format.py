"""OpenAI grader JSON in and out, unchanged.

Flywheel's rule format is a superset of OpenAI's grader JSON with the same field names, so an
OpenAI grader (string_check, text_similarity, score_model, label_model, python, multi) is already
a Flywheel rule: importing checks that it uses only OpenAI's types and copies it; exporting checks
the same of a Flywheel rule. `to_openai(from_openai(x)) == x` for every OpenAI grader, and both
score the same. A rule that uses Flywheel's own types (unit_tests, numeric, ...) or its own fields
(hacking_penalty) has no OpenAI form: exporting it names each place that stands in the way.
"""

import copy

from rewards.graders import MULTI, grader_kind, openai_types

FLYWHEEL_ONLY_FIELDS = {"python": {"timeout"}, "score_model": set(), "label_model": {"sampling_params"}}
RULE_ONLY_FIELDS = {"hacking_penalty", "hacking_floor", "hacking_opt_out"}


class OpenAIFormatError(ValueError):
    """The JSON is not an OpenAI grader (importing) or the rule has no OpenAI form (exporting)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{path or 'grader'}: {message}" for path, message in problems))
        self.problems = problems


def from_openai(grader_json: dict) -> dict:
    """A Flywheel rule from an OpenAI grader: the same JSON, once its types are known to be OpenAI's.

    >>> grader = {"type": "string_check", "name": "exact", "input": "{{ sample.output_text }}",
    ...           "reference": "{{ item.reference }}", "operation": "eq"}
    >>> from_openai(grader) == grader
    True
    """
    problems = non_openai_places(grader_json, "", exporting=False)
    if problems:
        raise OpenAIFormatError(problems)
    return copy.deepcopy(grader_json)


def to_openai(spec: dict) -> dict:
    """The OpenAI grader JSON of a rule that uses only OpenAI's types and fields.

    >>> to_openai({"type": "numeric", "input": "{{ sample.output_text }}", "reference": "4"})
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
      ...
    rewards.openai_format.OpenAIFormatError: type: numeric graders are Flywheel's own; OpenAI's types are ...
    """
    problems = [
        (name, "is Flywheel's own (hacking penalties have no OpenAI form)")
        for name in RULE_ONLY_FIELDS & set(spec)
    ]
    problems += non_openai_places(
        {k: v for k, v in spec.items() if k not in RULE_ONLY_FIELDS}, "", exporting=True
    )
    if problems:
        raise OpenAIFormatError(problems)
    return copy.deepcopy(spec)


def non_openai_places(grader: object, path: str, *, exporting: bool) -> list[tuple[str, str]]:
    def at(name: str) -> str:
        return f"{path}.{name}" if path else name

    if not isinstance(grader, dict):
        return [(path, "must be a grader object with a type")]
    type_name = grader.get("type")
    if type_name not in openai_types():
        owner = "Flywheel's own" if grader_kind(str(type_name)) is not None else "not a grader type"
        return [
            (at("type"), f"{type_name} graders are {owner}; OpenAI's types are {', '.join(openai_types())}")
        ]
    if type_name == MULTI:
        graders = grader.get("graders")
        if not isinstance(graders, dict):
            return [(at("graders"), "must be an object of named graders")]
        return [
            place
            for key, sub in graders.items()
            for place in non_openai_places(sub, at(f"graders.{key}"), exporting=exporting)
        ]
    if exporting:
        own = FLYWHEEL_ONLY_FIELDS.get(type_name, set()) & set(grader)
        return [(at(name), f"is Flywheel's own field of {type_name} graders") for name in sorted(own)]
    return []

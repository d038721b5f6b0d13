"""OpenAI's grader endpoints (`/v1/fine_tuning/alpha/graders/validate` and `/run`) over Flywheel's
reward engine: a grader is a reward rule spec (OpenAI's grader JSON is one: rewards/openai_format.py),
checked as a rule and scored by the same engine a run scores with.

Two things differ from OpenAI's: a `score_model` or `label_model` grader's `model` names one of the
project's tiers (by name; a local tier or an engine tier), since no OpenAI model is here; and
Flywheel's own grader types (`unit_tests`, `numeric`, ...) are accepted beside OpenAI's, an
extension a script written for OpenAI never meets."""

import json
import time
from typing import Any

from django.contrib.auth.models import User

from core.roles import Permission
from finetuning import formats
from finetuning.errors import ApiError
from projects import selectors as project_selectors
from projects.models import Project
from rewards import engine
from rewards.graders import MULTI, openai_types
from rewards.graders.base import Sample
from rewards.services import project_judge
from tiers.models import Tier

# Flywheel's error kinds in OpenAI's metadata.errors flags, where OpenAI has one.
OPENAI_ERROR_FLAGS = {
    "bad_template": "invalid_variable_error",
    "grader_exception": "python_grader_runtime_error",
    "sandbox_timeout": "truncated_observation_error",
    "sandbox_error": "python_grader_server_error",
    "judge_error": "model_grader_server_error",
    "invalid_output": "model_grader_parse_error",
    "unsupported": "unresponsive_reward_error",
}
JUDGED = ("score_model", "label_model")  # graders whose `model` names the tier that judges


def grader_checked(grader: Any, *, project: Project | None = None, param: str = "grader") -> dict:
    """The grader as a Flywheel rule spec, once it validates as a rule and (with `project`) each
    model grader's `model` names one of the project's tiers; ApiError naming the place
    (`<param>.<path>`) otherwise."""
    if not isinstance(grader, dict):
        raise ApiError(400, f"{param} is required: a grader object with a type", param, "invalid_value")
    if problems := engine.validate_rule(grader):
        text = "; ".join(f"{p.path or param}: {p.message}" for p in problems)
        raise ApiError(400, text, _at(param, problems[0].path), "invalid_grader")
    if project is not None:
        judges_check(grader, project=project, param=param)
    return grader


def _at(param: str, path: str) -> str:
    return f"{param}.{path}" if path else param


def judges_check(grader: dict, *, project: Project, param: str = "grader") -> None:
    """Refuse a model grader (also inside a `multi`) whose `model` names no tier of the project."""
    tiers = set(Tier.objects.filter(project=project).values_list("name", flat=True))
    for path, model in judge_models(grader):
        if model not in tiers:
            known = ", ".join(sorted(tiers)[:10]) or "none yet"
            raise ApiError(
                400,
                f"{_at(param, path)}: no tier named {model!r} in this project to judge with (a model "
                f"grader's model names a tier of the project: {known})",
                _at(param, path),
                "model_not_found",
            )


def judge_models(grader: dict, path: str = "") -> list[tuple[str, str]]:
    """(place of `model`, the tier it names) for each model grader, a multi's graders included.

    >>> judge = {"type": "score_model", "name": "s", "model": "judge", "input": []}
    >>> judge_models({"type": "multi", "graders": {"q": judge, "e": {"type": "string_check"}}})
    [('graders.q.model', 'judge')]
    """
    if grader.get("type") in JUDGED:
        return [(f"{path}model", str(grader.get("model")))]
    if grader.get("type") == MULTI and isinstance(grader.get("graders"), dict):
        return [
            found
            for name, inner in grader["graders"].items()
            if isinstance(inner, dict)
            for found in judge_models(inner, f"{path}graders.{name}.")
        ]
    return []


def uses_openai_types_only(grader: dict) -> bool:
    """Whether every grader type in it is OpenAI's (else it uses Flywheel's own: the extension).

    >>> uses_openai_types_only({"type": "multi", "graders": {"t": {"type": "unit_tests"}}})
    False
    """
    if grader.get("type") == MULTI:
        return all(
            isinstance(inner, dict) and uses_openai_types_only(inner)
            for inner in (grader.get("graders") or {}).values()
        )
    return grader.get("type") in openai_types()


def _code_item(item: dict) -> dict:
    """An item with tests as a job's code item holds it: its code fields checked and kept as the
    task library keeps them (a list of tests as one text)."""
    fields, problems = formats.code_fields(0, item)
    if problems:
        place = f"item.{problems[0].field}" if problems[0].field else "item"
        raise ApiError(400, f"{place}: {problems[0].message}", place, "invalid_value")
    return item | fields | {"kind": "code"}


def grader_run(*, project: Project, by: User, grader: Any, model_sample: Any, item: Any) -> dict:
    """Score `model_sample` for `item` with the grader; the answer in OpenAI's shape."""
    spec = grader_checked(grader, project=project)
    # It runs code in sandboxes and models on the project's tiers: a launcher's.
    project_selectors.require(user=by, project_id=project.pk, permission=Permission.EDIT)
    if not isinstance(model_sample, str):
        raise ApiError(
            400, "model_sample must be a string: the model's output", "model_sample", "invalid_value"
        )
    if item is not None and not isinstance(item, dict):
        raise ApiError(400, "item must be an object", "item", "invalid_value")
    try:
        output_json = json.loads(model_sample)
    except ValueError:
        output_json = None
    if item is not None and "kind" not in item and formats.is_code_line(item):
        item = _code_item(item)  # as a job's line with tests is a code item
    started = time.monotonic()
    result = engine.score(
        spec,
        item or {},
        Sample(output_text=model_sample, output_json=output_json),
        judge=project_judge(project),
    )
    flags: dict[str, bool | str | None] = {flag: False for flag in OPENAI_ERROR_FLAGS.values()}
    for error in result.errors:
        flags[OPENAI_ERROR_FLAGS.get(error.kind, "other_error")] = True
    details = "; ".join(f"{e.grader}: {e.message}" for e in result.errors)
    flags |= {"python_grader_runtime_error_details": details or None, "sample_parse_error": False}
    return {
        "reward": result.total if result.total is not None else 0.0,
        "metadata": {
            "name": grader.get("name", ""),
            "type": grader["type"],
            "errors": flags,
            "execution_time": time.monotonic() - started,
            "scores": dict(result.components),
            "token_usage": None,
            "sampled_model_name": next((model for _, model in judge_models(spec)), None),
        },
        "sub_rewards": dict(result.components) if grader["type"] == "multi" else {},
        "model_grader_token_usage_per_model": {},
    }

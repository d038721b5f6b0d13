"""OpenAI's grader endpoints (`/v1/fine_tuning/alpha/graders/validate` and `/run`) over Flywheel's
reward engine: a grader is an OpenAI grader JSON (rewards/openai_format.py), checked as a rule and
scored by the same engine a run scores with; `score_model` and `label_model` graders name one of
the project's tiers as their `model`."""

import json
import time
from typing import Any

from django.contrib.auth.models import AbstractBaseUser

from core.roles import Permission
from finetuning.errors import ApiError
from projects import selectors as project_selectors
from projects.models import Project
from rewards import engine, openai_format
from rewards.graders.base import Sample
from rewards.services import project_judge

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


def grader_checked(grader: Any) -> dict:
    """The grader as a Flywheel rule, once it is an OpenAI grader that validates; ApiError naming the
    place (`grader.<path>`) otherwise."""
    if not isinstance(grader, dict):
        raise ApiError(
            400, "grader is required: an OpenAI grader object with a type", "grader", "invalid_value"
        )
    try:
        spec = openai_format.from_openai(grader)
    except openai_format.OpenAIFormatError as exc:
        path, message = exc.problems[0]
        raise ApiError(
            400, f"{path or 'grader'}: {message}", f"grader.{path}".rstrip("."), "invalid_grader"
        ) from None
    if problems := engine.validate_rule(spec):
        text = "; ".join(f"{p.path or 'grader'}: {p.message}" for p in problems)
        raise ApiError(400, text, f"grader.{problems[0].path}".rstrip("."), "invalid_grader")
    return spec


def grader_run(*, project: Project, by: AbstractBaseUser, grader: Any, model_sample: Any, item: Any) -> dict:
    """Score `model_sample` for `item` with the grader; the answer in OpenAI's shape."""
    spec = grader_checked(grader)
    project_selectors.require(
        user=by, project_id=project.pk, permission=Permission.EDIT
    )  # it runs code in sandboxes
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
    started = time.monotonic()
    result = engine.score(
        spec,
        item or {},
        Sample(output_text=model_sample, output_json=output_json),
        judge=project_judge(project),
    )
    flags = {flag: False for flag in OPENAI_ERROR_FLAGS.values()}
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
            "sampled_model_name": None,
        },
        "sub_rewards": dict(result.components) if grader["type"] == "multi" else {},
        "model_grader_token_usage_per_model": {},
    }

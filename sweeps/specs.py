"""What a sweep asks for, checked before anything is written: its run template, the parameters it
varies and its search, stopping and budget settings. Every problem is named by its field path
(`template.tier`, `parameters.1.values`), all at once; a template or a value that would make a run
fail at its first step is refused here, through the same checks a launch goes through.
"""

from decimal import Decimal
from typing import Any

from django.core.exceptions import ValidationError

from projects.models import Project
from rewards.models import RewardRuleVersion
from runs.api.runs import references
from runs.learners import params_of
from runs.lifecycle import RunRequest, run_problems
from sweeps import search
from sweeps.models import Sweep
from tiers.models import Tier

# The run request fields a template may set; ids name the project's versions and tier.
TEMPLATE_FIELDS = (
    "task_set_version",
    "reward_rule_version",
    "tier",
    "method",
    "hyperparameters",
    "max_steps",
    "max_wall_seconds",
    "max_sandbox_cpu_seconds",
    "budget_money",
    "budget_device_hours",
    "priority",
    "train_split",
    "eval_split",
    "monitors",
    "monitor_actions",
)
REQUIRED = ("task_set_version", "reward_rule_version", "tier")
HYPER = "hyperparameters."
NAMES = ("tier", "base_model", "reward_rule_version")
MAX_GRID = 1000
MAX_RUNS = 1000
SCALARS = (str, int, float, bool)


def template_request(project: Project, template: dict[str, Any], *, name: str, **changes: Any) -> RunRequest:
    """The run request of a (checked) template, with `changes` applied over it (objects or ids)."""
    fields = {key: template[key] for key in TEMPLATE_FIELDS if key in template}
    fields |= changes
    if fields.get("budget_money") is not None:
        fields["budget_money"] = Decimal(str(fields["budget_money"]))
    return RunRequest(project=project, name=name, **references(project, fields))


def request_for(sweep: Sweep, params: dict[str, Any], *, name: str) -> RunRequest:
    """The run request of one trial: the template with the trial's values put in."""
    return template_request(sweep.project, sweep.template, name=name, **changes_of(sweep, params))


def changes_of(sweep: Sweep, params: dict[str, Any]) -> dict[str, Any]:
    """The request fields a trial's params change: hyperparameters merge over the template's."""
    changes: dict[str, Any] = {}
    hyper = dict(sweep.template.get("hyperparameters") or {})
    for name, value in params.items():
        if name.startswith(HYPER):
            hyper[name.removeprefix(HYPER)] = value
        elif name == "base_model":
            changes["tier"] = sweep.base_model_tiers[str(value)]
        else:
            changes[name] = value
    return changes | {"hyperparameters": hyper}


def template_problems(project: Project, template: Any) -> dict[str, str]:
    if not isinstance(template, dict):
        return {"template": "must be an object of run fields"}
    problems = {f"template.{key}": "not a field of a run" for key in template if key not in TEMPLATE_FIELDS}
    problems |= {f"template.{key}": "is required" for key in REQUIRED if template.get(key) is None}
    if problems:
        return problems
    try:
        request = template_request(project, template, name="template")
    except ValidationError as refused:
        return {f"template.{key}": " ".join(m) for key, m in refused.message_dict.items()}
    _, found = run_problems(request)
    return {f"template.{key}": message for key, message in found.items()}


def parameter_problems(
    project: Project, template: dict[str, Any], parameters: Any, search_kind: str
) -> dict[str, str]:
    """The shape of each parameter, its name, and its values against what it names."""
    if not isinstance(parameters, list) or not parameters:
        return {"parameters": "must be a non-empty list of {name, values} or {name, low, high}"}
    problems: dict[str, str] = {}
    seen: dict[str, int] = {}
    method = str(template.get("method") or "grpo")
    for index, parameter in enumerate(parameters):
        where = f"parameters.{index}"
        if not isinstance(parameter, dict):
            problems[where] = "must be an object: {name, values} or {name, low, high[, log]}"
            continue
        problems |= _shape_problems(where, parameter, search_kind)
        name = parameter.get("name")
        if name in seen:
            problems[f"{where}.name"] = f"{name} is varied twice (parameters.{seen[name]} too)"
        elif isinstance(name, str):
            seen[name] = index
        if f"{where}.name" not in problems:
            problems |= _name_problems(project, method, where, parameter)
    if "tier" in seen and "base_model" in seen:
        problems[f"parameters.{seen['base_model']}.name"] = (
            "vary the tier or the base model, not both: a base model runs under the template's tier settings"
        )
    if search_kind == Sweep.Search.GRID and not problems:
        size = search.grid_size(parameters)
        if size > MAX_GRID:
            problems["parameters"] = f"the grid has {size} points; at most {MAX_GRID}"
    return problems


def _shape_problems(where: str, parameter: dict[str, Any], search_kind: str) -> dict[str, str]:
    problems: dict[str, str] = {}
    unknown = set(parameter) - {"name", "values", "choices", "low", "high", "log", "float"}
    problems |= {f"{where}.{key}": "not a parameter setting" for key in sorted(unknown)}
    listed = [key for key in ("values", "choices") if key in parameter]
    ranged = "low" in parameter or "high" in parameter
    if not isinstance(parameter.get("name"), str) or not parameter.get("name"):
        problems[f"{where}.name"] = (
            "is required: hyperparameters.<key>, tier, base_model or reward_rule_version"
        )
    if len(listed) + ranged != 1:
        problems[where] = "give exactly one of values, choices, or low and high"
        return problems
    if listed:
        key = listed[0]
        values = parameter[key]
        if not isinstance(values, list) or not values:
            problems[f"{where}.{key}"] = "must be a non-empty list"
        elif not all(isinstance(value, SCALARS) for value in values):
            problems[f"{where}.{key}"] = "each value must be a string, a number or a boolean"
        elif len({repr(value) for value in values}) != len(values):
            problems[f"{where}.{key}"] = "lists a value twice"
        return problems
    if search_kind == Sweep.Search.GRID:
        problems[where] = "a grid search takes a list of values, not a range (low, high)"
        return problems
    low, high = parameter.get("low"), parameter.get("high")
    for end, value in (("low", low), ("high", high)):
        if not isinstance(value, int | float) or isinstance(value, bool):
            problems[f"{where}.{end}"] = "must be a number"
    if problems:
        return problems
    low, high = parameter["low"], parameter["high"]
    if low >= high:
        problems[f"{where}.high"] = f"must be above low ({low:g})"
    if parameter.get("log") and low <= 0:
        problems[f"{where}.low"] = "must be above 0 for a log scale"
    return problems


def _name_problems(project: Project, method: str, where: str, parameter: dict[str, Any]) -> dict[str, str]:
    name = parameter["name"]
    listed = search.values_of(parameter)
    values_key = f"{where}.{'values' if 'values' in parameter else 'choices'}"
    if name.startswith(HYPER):
        return _hyperparameter_problems(method, where, values_key, parameter, listed)
    if name not in NAMES:
        return {f"{where}.name": "must be hyperparameters.<key>, tier, base_model or reward_rule_version"}
    if listed is None:
        return {f"{where}.low": f"{name} takes a list of values, not a range"}
    if name == "base_model":
        bad = [value for value in listed if not isinstance(value, str) or not value.strip()]
        return {values_key: "each base model must be a local folder or a hub id"} if bad else {}
    model = Tier if name == "tier" else RewardRuleVersion
    owner = "project" if name == "tier" else "rule__project"
    ids = [value for value in listed if isinstance(value, int) and not isinstance(value, bool)]
    found = set(model.objects.filter(pk__in=ids, **{owner: project}).values_list("pk", flat=True))
    missing = [value for value in listed if value not in found]
    if missing:
        label = name.replace("_", " ")
        return {values_key: f"no {label} {', '.join(map(repr, missing))} in project {project.name} (ids)"}
    return {}


def _hyperparameter_problems(
    method: str, where: str, values_key: str, parameter: dict[str, Any], listed: list[Any] | None
) -> dict[str, str]:
    key = parameter["name"].removeprefix(HYPER)
    param = params_of(method).get(key)
    if param is None:
        return {f"{where}.name": f"{key} is not a hyperparameter of {method}"}
    if listed is not None:
        bad = [f"{value!r} {problem}" for value in listed if (problem := param.check(value))]
        return {values_key: "; ".join(bad)} if bad else {}
    if param.kind not in (int, float) or param.choices or param.pattern:
        return {f"{where}.low": f"{key} is not numeric: give its values as a list"}
    problems = {}
    for end in ("low", "high"):
        value = parameter[end]
        if param.kind is int and not isinstance(value, int):
            problems[f"{where}.{end}"] = f"{key} is an integer"
        elif problem := param.check(float(value) if param.kind is float else value):
            problems[f"{where}.{end}"] = problem
    return problems


def value_problems(
    project: Project, template: dict[str, Any], parameters: list[dict[str, Any]], tiers: dict[str, int]
) -> dict[str, str]:
    """Each listed value in the template, through the launch checks: one that would make its run
    fail at the first step is named (a greedy tier for GRPO, a rule that cannot score the items)."""
    problems = {}
    holder = Sweep(project=project, template=template, base_model_tiers=tiers)
    for index, parameter in enumerate(parameters):
        listed = search.values_of(parameter)
        if listed is None:
            continue
        values_key = f"parameters.{index}.{'values' if 'values' in parameter else 'choices'}"
        bad = []
        for value in listed:
            request = request_for(holder, {parameter["name"]: value}, name="check")
            _, found = run_problems(request)
            if found:
                field, message = next(iter(sorted(found.items())))
                bad.append(f"{value!r}: {field} {message}")
        if bad:
            problems[values_key] = "; ".join(bad)
    return problems


def setting_problems(values: dict[str, Any], template: dict[str, Any]) -> dict[str, str]:
    """The search, stopping and budget settings."""
    problems = {}
    if not str(values.get("name") or "").strip():
        problems["name"] = "is required"
    metric = values.get("metric", "heldout/pass_rate")
    if not isinstance(metric, str) or not metric.startswith("heldout/"):
        problems["metric"] = (
            "must be a held-out figure the run's evaluations write: heldout/pass_rate, heldout/reward, "
            "heldout/pass_rate/<family> or heldout/reward/<grader>"
        )
    if values.get("max_runs") is not None and not 1 <= values["max_runs"] <= MAX_RUNS:
        problems["max_runs"] = f"must be between 1 and {MAX_RUNS}"
    if values.get("concurrency", 1) < 1:
        problems["concurrency"] = "must be at least 1"
    if values.get("min_steps", 1) < 1:
        problems["min_steps"] = "must be at least 1"
    stopping = values.get("early_stopping", Sweep.EarlyStopping.NONE)
    if stopping == Sweep.EarlyStopping.ASHA and values.get("reduction_factor", 3) < 2:
        problems["reduction_factor"] = "must be at least 2"
    for key in ("max_money", "max_device_hours"):
        if values.get(key) is not None and values[key] <= 0:
            problems[key] = "must be more than 0"
    every = (template.get("hyperparameters") or {}).get("eval_every")
    steps = template.get("max_steps", 20)
    if stopping != Sweep.EarlyStopping.NONE and isinstance(every, int) and every >= steps:
        problems["early_stopping"] = (
            f"needs held-out evaluations before a run ends: template.hyperparameters.eval_every ({every}) "
            f"must be below template.max_steps ({steps})"
        )
    return problems

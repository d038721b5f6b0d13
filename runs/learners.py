"""The learner registry: every training method a run can name, as graders have theirs.

An algorithm is registered once, by a torch-free module that says what it is (its name, the
hyperparameters it takes besides the common ones, whether it learns from the run's own rollouts or
from the task set's examples, what it needs of the data) and names its learner module, which the
learner process imports (workers/learners/: `grpo_config.py` registers and `grpo.py` learns).
Hyperparameter validation, the launch form, the REST serializers, the lifecycle's checks, the run
learner, the supervisor and the commands read it here; nothing else lists methods.

The modules named by the FLYWHEEL_LEARNERS setting register when the registry is first read, so a
third party adds an algorithm by naming its module there (every process, web and workers, reads the
same settings).
"""

import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import QuerySet

from runs import hyperparameters
from runs.hyperparameters import COMMON, Param

# (the train split's items, the resolved hyperparameters) -> problems by field, before launch
DataCheck = Callable[[QuerySet, dict[str, Any]], dict[str, str]]


@dataclass(frozen=True)
class Algorithm:
    name: str  # what a run's `method` says
    label: str
    summary: str
    learner: str  # the module the learner process imports (see workers/run_learner.py)
    params: Mapping[str, Param] = field(default_factory=dict)  # besides runs.hyperparameters.COMMON
    online: bool = True  # learns from groups the run samples (rollout workers); else from examples
    distributed: bool = False  # may run on several learner processes (accelerate launch, DDP)
    # Who plays an online algorithm's episodes: Flywheel's rollout workers, or "external" agents
    # that take them from the run's episodes endpoint and call its policy on /v1 (episodes/).
    rollouts: str = "workers"
    data_check: DataCheck | None = None
    # Learns from the run's task set and reward rule. False: the data comes from elsewhere (a
    # Tinker client's own loop sends every batch), so neither is checked at launch.
    data: bool = True
    # Offered by the launch form and POST /runs. False: its runs start through their own API.
    launchable: bool = True


_REGISTRY: dict[str, Algorithm] = {}
_REGISTERED_BY: dict[str, str] = {}  # name -> the module that registered it
_loaded = False


def algorithm_register(algorithm: Algorithm) -> Algorithm:
    """Add (or replace, for a module imported again) an algorithm under its name."""
    caller = inspect.currentframe()
    module = caller.f_back.f_globals.get("__name__", "") if caller and caller.f_back else ""
    _REGISTRY[algorithm.name] = algorithm
    _REGISTERED_BY[algorithm.name] = module
    return algorithm


def algorithm_unregister(name: str) -> None:
    _REGISTRY.pop(name, None)
    _REGISTERED_BY.pop(name, None)


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for module in settings.FLYWHEEL_LEARNERS:
            importlib.import_module(module)


def algorithms() -> list[Algorithm]:
    """Every algorithm, in the order FLYWHEEL_LEARNERS names their modules (then the others), so
    that forms and pages list them the same way whatever imported one first."""
    _load()
    modules = list(settings.FLYWHEEL_LEARNERS)

    def rank(name: str) -> int:
        module = _REGISTERED_BY.get(name, "")
        return modules.index(module) if module in modules else len(modules)

    return [_REGISTRY[name] for name in sorted(_REGISTRY, key=rank)]


def algorithm_get(name: str) -> Algorithm | None:
    _load()
    return _REGISTRY.get(name)


def plays_external(method: str) -> bool:
    """Whether agents outside Flywheel play a run of `method`'s episodes (episodes/), not rollout
    workers."""
    algorithm = algorithm_get(method)
    return algorithm is not None and algorithm.rollouts == "external"


def algorithm_names() -> list[str]:
    return [algorithm.name for algorithm in algorithms()]


def algorithm_choices() -> list[tuple[str, str]]:
    """(name, label) of every algorithm, for forms and serializers."""
    return [(algorithm.name, algorithm.label) for algorithm in algorithms()]


def launch_choices() -> list[tuple[str, str]]:
    """(name, label) of the algorithms a launch may name (the form's and POST /runs' choices)."""
    return [(algorithm.name, algorithm.label) for algorithm in algorithms() if algorithm.launchable]


def method_problem(name: str) -> str | None:
    """Why `name` is no method a run can name, or None."""
    if algorithm_get(name) is not None:
        return None
    return f"must be one of {', '.join(algorithm_names())}"


def params_of(method: str) -> dict[str, Param]:
    """Every hyperparameter a method takes: the common ones and its algorithm's own."""
    algorithm = algorithm_get(method)
    return COMMON | dict(algorithm.params) if algorithm is not None else {}


def hyperparameters_resolve(method: str, submitted: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(resolved values, problems by field) for a registered method."""
    return hyperparameters.resolve(method, params_of(method), submitted)


def hyperparameter_table() -> dict[str, tuple[Param, list[str]]]:
    """Every hyperparameter of any method, with the methods that take it (the launch form's rows)."""
    table: dict[str, tuple[Param, list[str]]] = {}
    for algorithm in algorithms():
        if not algorithm.launchable:
            continue
        for name, param in params_of(algorithm.name).items():
            table.setdefault(name, (param, []))[1].append(algorithm.name)
    return table

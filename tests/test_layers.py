"""The import graph keeps the layers: imports go down (wiring, workers, domain apps, the Django-free
bottom), never up, and no import cycle joins two packages except through a Celery task module
(a task beside its service imports the code that runs its body, which enqueues it again).

Read from the source with `ast`, so a late import inside a function counts as much as one at the top.
"""

import ast
import functools
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from django.conf import settings

from tests.run_fixtures import ANSWER_RULE

ROOT = Path(settings.BASE_DIR)
# Bottom to top: a package imports only its own layer or lower ones (task modules aside).
LAYERS = (
    ("inference", "sandboxes"),
    ("core",),
    ("docs_pages",),
    ("projects",),
    ("tiers",),
    ("rewards",),
    ("runs",),
    ("serving",),
    (
        "reviews",
        "traces",
        "reward_models",
        "evaluations",
        "webhooks",
        "finetuning",
        "ops",
        "costs",
        "episodes",
        "tinker_api",
        "sweeps",
    ),
    ("workers",),
    ("webapp",),
)
APPLICATIONS = tuple(package for layer in LAYERS for package in layer)
BOTTOM = ("inference", "sandboxes")
DOMAIN = (
    "docs_pages",
    "projects",
    "tiers",
    "runs",
    "serving",
    "rewards",
    "reviews",
    "traces",
    "webhooks",
    "reward_models",
    "evaluations",
    "finetuning",
    "ops",
    "costs",
    "episodes",
    "tinker_api",
    "sweeps",
)
FRAMEWORKS = ("django", "rest_framework", "drf_spectacular", "channels", "celery")


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(module: str, path: Path, tree: ast.AST) -> set[str]:
    """Every module name the file imports, wherever the import statement is."""
    names: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from runs import tasks` imports runs.tasks; `from runs.models import Run`, runs.models.
            names |= {f"{base}.{alias.name}" if base else alias.name for alias in node.names}
    return names


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (`from runs import tasks` names runs.tasks)."""
    files = {
        module_name(root, path): path
        for package in packages
        for path in (root / package).rglob("*.py")
        if "migrations" not in path.parts
    }
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        targets = set()
        for name in imported(module, path, ast.parse(path.read_text(), filename=str(path))):
            while name and name not in files:  # `from runs.models import Run` names the module
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def imports_of(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> every top-level name it imports, project or not."""
    out = {}
    for path in (root / package).rglob("*.py"):
        module = module_name(root, path)
        tree = ast.parse(path.read_text(), filename=str(path))
        out[module] = {name.split(".")[0] for name in imported(module, path, tree) if name}
    return out


def app(module: str) -> str:
    return module.split(".")[0]


def is_task_module(module: str) -> bool:
    return module.rpartition(".")[2] == "tasks"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def bottom_violations(root: Path, packages: tuple[str, ...]) -> list[str]:
    """Imports by a bottom package of another Flywheel package or of a web framework."""
    forbidden = set(packages) | set(FRAMEWORKS)
    out = []
    for package in BOTTOM:
        if not (root / package).is_dir():
            continue
        for module, names in sorted(imports_of(root, package).items()):
            out += [f"{module} imports {name}" for name in sorted(names & (forbidden - {package}))]
    return out


def upward_violations(graph: dict[str, set[str]]) -> list[str]:
    """Domain modules that import workers/ (only a task module may: its body runs worker code)."""
    return [
        f"{module} imports {target}"
        for module, targets in sorted(graph.items())
        if app(module) in DOMAIN and not is_task_module(module)
        for target in sorted(targets)
        if app(target) == "workers"
    ]


def core_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports by the API core of any other Flywheel package: every app builds on it, so it builds on none."""
    return [
        f"{module} imports {target}"
        for module, targets in sorted(graph.items())
        if app(module) == "core"
        for target in sorted(targets)
        if app(target) != "core"
    ]


def wiring_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports of webapp/ (settings, URLs, ASGI, the Celery app) from anywhere else: it wires the
    apps together, so nothing below may reach up into it."""
    return [
        f"{module} imports {target}"
        for module, targets in sorted(graph.items())
        if app(module) != "webapp"
        for target in sorted(targets)
        if app(target) == "webapp"
    ]


def cross_package_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles that join packages once task modules are set aside (a task and its service
    import each other on purpose)."""
    without_tasks = {
        module: {target for target in targets if not is_task_module(target)}
        for module, targets in graph.items()
        if not is_task_module(module)
    }
    return [component for component in cycles(without_tasks) if len({app(m) for m in component}) > 1]


@functools.cache
def project_graph() -> dict[str, set[str]]:
    """The project's import graph, read once for all the tests that check it (callers only read it)."""
    return import_graph(ROOT, APPLICATIONS)


def test_inference_and_sandboxes_import_no_other_package_and_no_django():
    assert bottom_violations(ROOT, APPLICATIONS) == []


def test_the_api_core_imports_no_other_package():
    assert core_violations(project_graph()) == []


def test_nothing_imports_the_wiring():
    assert wiring_violations(project_graph()) == []


def test_domain_apps_reach_workers_only_from_their_task_modules():
    graph = project_graph()
    assert upward_violations(graph) == []
    # The exception is used, and only there: runs' tasks run the supervisor's and evaluation's code,
    # tiers' the tier-evaluation driver, reward models' the reward-model learner's, evaluations' the
    # suite driver's, the Tinker API's the sampling on rollout workers.
    reaching = {
        m for m, targets in graph.items() if app(m) in DOMAIN and "workers" in {app(t) for t in targets}
    }
    assert reaching == {
        "runs.tasks",
        "tiers.tasks",
        "reward_models.tasks",
        "evaluations.tasks",
        "tinker_api.tasks",
    }


def test_no_import_cycle_joins_two_packages_except_through_a_task():
    graph = project_graph()
    assert cross_package_cycles(graph) == []
    # Task and service pairs do form cycles, which is why they are set aside above.
    assert ["webhooks.services", "webhooks.tasks"] in cycles(graph)


# The packages bottom to top; a package imports its own layer's or lower ones (only task modules
# reach workers). The apps built on runs hook into it through the registries runs declares
# (runs.listeners, runs.run_page) or serving does (serving.served_models), runs into tiers through
# tiers.run_policies, rewards through its grader's scorer registry.


def layer_violations(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...]) -> list[str]:
    rank = {package: index for index, layer in enumerate(layers) for package in layer}
    return [
        f"{module} imports {target}"
        for module, targets in sorted(graph.items())
        if not is_task_module(module)
        for target in sorted(targets)
        if rank[app(target)] > rank[app(module)]
    ]


def package_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles of the package graph (an edge when any module imports another package's), task
    modules set aside."""
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if not is_task_module(module):
            packages.setdefault(app(module), set()).update(
                app(t) for t in targets if not is_task_module(t) and app(t) != app(module)
            )
    return cycles(packages)


def test_every_package_has_a_layer():
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"tests"}
    assert sorted(packages - set(APPLICATIONS)) == []


def test_mypy_checks_every_package():
    """A new app is type-checked from its first commit: `[tool.mypy] files` names every package
    (three were left out once, and collected errors unseen)."""
    checked = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"])
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"tests"}
    assert sorted(packages - checked) == []


def test_the_suite_runs_the_doctests_of_every_package():
    """`testpaths` with `--doctest-modules` names every package but the wiring (`webapp`: settings,
    URLs, ASGI and the Celery app, with no doctest). Twelve packages were left out once, and 57
    doctests never ran."""
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"tests", "webapp"}
    assert "--doctest-modules" in ini["addopts"]
    assert sorted(packages - set(ini["testpaths"])) == []


def test_packages_import_only_their_layer_or_lower_ones():
    graph = project_graph()
    assert layer_violations(graph, LAYERS) == []
    assert package_cycles(graph) == []


def test_the_layer_check_names_an_import_up_from_runs_and_the_cycle_it_makes():
    graph = {
        "runs.lifecycle": {"webhooks.services", "runs.models"},
        "runs.models": set(),
        "runs.tasks": {"workers.driver"},
        "webhooks.services": {"runs.models"},
        "workers.driver": set(),
    }
    layers = (("runs",), ("webhooks",), ("workers",))
    assert layer_violations(graph, layers) == ["runs.lifecycle imports webhooks.services"]
    assert package_cycles(graph) == [["runs", "webhooks"]]


def test_every_celery_task_module_sits_beside_a_service_or_drives_runs():
    graph = project_graph()
    assert sorted(m for m in graph if is_task_module(m)) == [
        "evaluations.tasks",
        "finetuning.tasks",
        "reward_models.tasks",
        "runs.tasks",
        "sweeps.tasks",
        "tiers.tasks",
        "tinker_api.tasks",
        "webhooks.tasks",
        "workers.tasks",
    ]
    assert "workers.tasks" not in {t for m, targets in graph.items() if app(m) in DOMAIN for t in targets}


# An import inside a function hides an edge of the graph from a reader, and once hid cycles. It is
# kept where it is the idiom (an AppConfig's ready(), which registers once models are loaded; a
# Celery task's body, which loads what it runs so that the enqueuing process does not; the Celery
# app's process signals) and elsewhere only where its line says why (a heavy import deferred).
LATE_IMPORT_PLACES = ("ready",)


def unexplained_late_imports(root: Path, packages: tuple[str, ...]) -> list[str]:
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            module = module_name(root, path)
            if "migrations" in path.parts or is_task_module(module) or module == "webapp.celery":
                continue
            lines = path.read_text().splitlines()
            for function in ast.walk(ast.parse("\n".join(lines), filename=str(path))):
                if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                if function.name in LATE_IMPORT_PLACES:
                    continue
                for node in ast.walk(function):
                    if not isinstance(node, ast.Import | ast.ImportFrom) or getattr(node, "level", 0):
                        continue
                    names = (
                        [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                    )
                    ours = sorted({app(name) for name in names if name and app(name) in packages})
                    end = lines[(node.end_lineno or node.lineno) - 1]
                    if ours and "#" not in end and "#" not in lines[node.lineno - 1]:
                        relative = path.relative_to(root)
                        found.append(f"{relative}:{node.lineno} in {function.name}(): {', '.join(ours)}")
    return found


def test_every_late_import_of_a_project_module_is_an_idiom_or_says_why():
    assert unexplained_late_imports(ROOT, APPLICATIONS) == []


# The checks themselves, on a small tree that breaks each rule once.
BROKEN_TREE = {
    "inference/__init__.py": "",
    "inference/decoding.py": "from django.conf import settings\nimport runs.models\n",
    "sandboxes/__init__.py": "",
    "sandboxes/pool.py": "def f():\n    from inference import decoding\n",
    "runs/__init__.py": "",
    "runs/models.py": "",
    "runs/services.py": "from runs import tasks\nfrom rewards.services import score\n",
    "runs/tasks.py": "def t():\n    from workers.driver import go\n",
    "runs/views.py": "from workers import driver\n",
    "rewards/__init__.py": "",
    "rewards/services.py": "def score():\n    from runs import services\n",
    "inference/lazy.py": "def f():\n    from inference import decoding  # loads torch\n",
    "runs/apps.py": "class A:\n    def ready(self):\n        from runs import services\n",
    "workers/__init__.py": "",
    "workers/driver.py": "from runs.services import x\n",
    "core/__init__.py": "",
    "core/api.py": "from runs.models import Project\n",
    "webapp/__init__.py": "",
    "webapp/celery.py": "from core import api\n",
    "webapp/settings.py": "",
    "runs/urls.py": "from webapp.settings import DEBUG\n",
}


@pytest.fixture
def broken_tree(tmp_path) -> Path:
    for name, source in BROKEN_TREE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source)
    return tmp_path


def test_the_checks_name_each_broken_rule(broken_tree):
    packages = ("inference", "sandboxes", "runs", "rewards", "workers", "core", "webapp")
    graph = import_graph(broken_tree, packages)
    assert core_violations(graph) == ["core.api imports runs.models"]
    assert wiring_violations(graph) == ["runs.urls imports webapp.settings"]
    assert bottom_violations(broken_tree, packages) == [
        "inference.decoding imports django",
        "inference.decoding imports runs",
        "sandboxes.pool imports inference",
    ]
    assert upward_violations(graph) == ["runs.views imports workers.driver"]
    # runs.services <-> rewards.services is a cycle; runs.services -> runs.tasks -> workers.driver
    # -> runs.services goes through a task and is allowed.
    assert cross_package_cycles(graph) == [["rewards.services", "runs.services"]]
    # The late imports of a task, a ready() and one that says why pass; the others do not.
    assert unexplained_late_imports(broken_tree, packages) == [
        "sandboxes/pool.py:2 in f(): inference",
        "rewards/services.py:2 in score(): runs",
    ]


def test_a_reward_dry_run_without_a_model_grader_never_imports_torch(transactional_db, team, tmp_path):
    """The web process scores dry-runs: building the project's judge must not load torch, which
    only a model grader's first judgement needs. Checked in a fresh interpreter (this one has
    imported torch for other tests) on the test database."""
    from rewards import services as reward_services
    from tests.run_harness import database_url
    from tiers import services as tier_services

    owner, project = team["owner"], team["project"]
    tier_services.tier_create(project=project, by=owner, name="judge", base_model="./no-such-model")
    rule = reward_services.reward_rule_create(project=project, name="exact", spec=ANSWER_RULE, by=owner)
    script = f"""
import json, sys
import django
django.setup()
from rewards.models import RewardRuleVersion
from rewards.services import reward_rule_dry_run
version = RewardRuleVersion.objects.get(pk={rule.versions.get().pk})
items = [{{"id": "a", "prompt": "2+2?", "reference": "4"}}, {{"id": "b", "prompt": "3+3?", "reference": "6"}}]
samples = [{{"item_id": "a", "output_text": "4"}}, {{"item_id": "b", "output_text": "7"}}]
dry = reward_rule_dry_run(version=version, items=items, samples=samples)
before = sorted(name for name in ("torch", "transformers") if name in sys.modules)
import inference.decoding  # what a model grader's first judgement loads
after = "torch" in sys.modules
print(json.dumps({{"totals": [p.result["total"] for p in dry.pairs], "before": before, "after": after}}))
"""
    env = os.environ | {
        "DJANGO_SETTINGS_MODULE": "webapp.settings",
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "FLYWHEEL_HOME": str(settings.FLYWHEEL_HOME),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == '{"totals": [1.0, 0.0], "before": [], "after": true}'

"""The demo account and project that `make up` creates: a small task set and two tiers."""

import json
import random

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction

from core.roles import Permission, Role, role_allows
from projects import services as project_services
from projects.demo_tasks import demo_task_sets
from projects.models import Membership, Project, TaskSet
from rewards import services as reward_services
from runs import services
from runs.lifecycle import RunRequest, run_create
from runs.models import Run
from tiers import services as tier_services
from tiers.models import Tier

DEMO_PROJECT = "Demo"
DEMO_TASK_SET = "arithmetic-and-code"
DEMO_FUNCTIONS = "demo-functions"
DEMO_SEED = 1234
# The RL demo: GRPO on scalar function-writing tasks, evaluated on the held-out split of both
# kinds (map functions are never trained on: they measure transfer).
DEMO_RUN_HYPERPARAMETERS = {
    "group_size": 8,
    "batch_size": 16,
    "staleness": 1,
    "learning_rate": 3e-4,
    "lr_scheduler": "linear",
    "checkpoint_every": 10,
    "eval_every": 10,
    "eval_items": 0,
}
DEMO_RUN_STEPS = 40
DEMO_RUN_WALL_SECONDS = 540


def demo_task_lines(seed: int = DEMO_SEED) -> list[bytes]:
    """A few answer items (arithmetic) and code items (small functions with tests)."""
    rng = random.Random(seed)
    lines = []
    for index in range(24):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        item = {
            "id": f"add-{index:02d}",
            "kind": "answer",
            "prompt": f"What is {a} + {b}?",
            "reference": str(a + b),
        }
        lines.append(item)
    functions: list[tuple[str, str, str, list[tuple[int, int | bool]]]] = [
        ("double", "Return twice x.", "x * 2", [(3, 6), (-1, -2)]),
        ("square", "Return x squared.", "x * x", [(4, 16), (0, 0)]),
        ("negate", "Return -x.", "-x", [(5, -5), (-7, 7)]),
        ("increment", "Return x plus one.", "x + 1", [(1, 2), (41, 42)]),
        ("halve", "Return x divided by two with integer division.", "x // 2", [(9, 4), (10, 5)]),
        ("is_even", "Return True when x is even.", "x % 2 == 0", [(4, True), (7, False)]),
    ]
    for name, doc, body, cases in functions:
        asserts = "".join(f"assert {name}({arg!r}) == {want!r}\n" for arg, want in cases)
        lines.append(
            {
                "id": f"fn-{name}",
                "kind": "code",
                "prompt": f"Write a Python function `{name}(x)`. {doc}",
                "tests": f"from solution import {name}\n\n{asserts}",
                "entry_point": name,
                "reference_solution": f"def {name}(x):\n    return {body}\n",
            }
        )
    return [(json.dumps(item) + "\n").encode() for item in lines]


def demo_tiers() -> list[dict]:
    base = str(settings.FLYWHEEL_HOME / "models" / "tiny-base")
    return [
        {
            "name": "capability",
            "description": "Full precision, greedy decoding, batched.",
            "base_model": base,
            "precision": "fp32",
            "temperature": 0.0,
            "max_new_tokens": 128,
            "batch_size": 8,
        },
        {
            "name": "rollout",
            "description": "Sampling for RL: temperature 1, batched.",
            "base_model": base,
            "precision": "fp32",
            "temperature": 1.0,
            "max_new_tokens": 32,
            "batch_size": 64,
        },
        {
            "name": "speed",
            "description": "int8 weights and prompt-lookup speculative decoding.",
            "base_model": base,
            "device": "cpu",
            "precision": "int8",
            "speculation": "prompt_lookup",
            "speculative_tokens": 4,
            "temperature": 0.0,
            "max_new_tokens": 128,
            "batch_size": 1,
        },
    ]


def demo_reward_rules() -> list[dict]:
    """One rule per kind of demo item: exact answers, and the unit tests for code."""
    return [
        {
            "name": "exact-answer",
            "description": "1 when the completion equals the reference answer.",
            "spec": {
                "type": "string_check",
                "name": "exact",
                "input": "{{ sample.output_text }}",
                "reference": "{{ item.reference }}",
                "operation": "eq",
            },
        },
        {
            "name": "unit-tests",
            "description": "The pass rate of the item's tests, run in a sandbox.",
            "spec": {"type": "unit_tests", "name": "tests"},
        },
    ]


@transaction.atomic
def demo_ensure(*, username: str, password: str) -> tuple[User, Project]:
    """Create what is missing of the demo; running it again changes nothing."""
    user = services.demo_user_ensure(username=username, password=password)
    project = Project.objects.filter(name=DEMO_PROJECT).first()
    if project is None:
        project = project_services.project_create(name=DEMO_PROJECT, by=user, description="A sample project.")
    Membership.objects.get_or_create(project=project, user=user, defaults={"role": Role.OWNER})
    _demo_contents_ensure(project, user)
    return user, project


@transaction.atomic
def demo_project_for(*, user: User) -> Project:
    """The demo project a user launches the demo in from the home page: the shared one when they
    may launch runs there, else their own copy (made the first time, set up like the shared one)."""
    shared = Project.objects.filter(name=DEMO_PROJECT).first()
    if shared is not None and role_allows(
        Membership.objects.filter(project=shared, user=user).values_list("role", flat=True).first(),
        Permission.EDIT,
    ):
        project = shared
    else:
        project = _demo_copy_ensure(user)
    _demo_contents_ensure(project, user)
    return project


def _demo_copy_ensure(user: User) -> Project:
    """The user's own copy of the demo project, made the first time."""
    name = f"{DEMO_PROJECT} ({user.get_username()})"[:100]
    project = Project.objects.filter(name=name, memberships__user=user).first()
    if project is None:
        project = project_services.project_create(
            name=name, by=user, description="Your copy of the demo project."
        )
    return project


def _demo_contents_ensure(project: Project, user: User) -> None:
    """The demo's task sets, tiers and reward rules in `project`, those missing created."""
    task_set = TaskSet.objects.filter(project=project, name=DEMO_TASK_SET).first()
    if task_set is None:
        task_set = project_services.task_set_create(
            project=project,
            name=DEMO_TASK_SET,
            by=user,
            description="Arithmetic answers and small functions.",
        )
    if not task_set.versions.exists():
        project_services.task_set_import(
            task_set=task_set, stream=demo_task_lines(), file_format="jsonl", by=user, source_name="demo"
        )
    for tier in demo_tiers():
        if not Tier.objects.filter(project=project, name=tier["name"]).exists():
            tier_services.tier_create(project=project, by=user, **tier)
    for rule in demo_reward_rules():
        if not project.reward_rules.filter(name=rule["name"]).exists():
            reward_services.reward_rule_create(project=project, by=user, **rule)
    _demo_functions_ensure(project, user)


def demo_function_lines() -> list[bytes]:

    sets = demo_task_sets(seed=0, train_size=100_000, heldout_size=160, kinds=("scalar",))
    return [(json.dumps(item) + "\n").encode() for item in sets["train"] + sets["heldout"]]


def _demo_functions_ensure(project: Project, user: User) -> None:
    task_set = TaskSet.objects.filter(project=project, name=DEMO_FUNCTIONS).first()
    if task_set is None:
        task_set = project_services.task_set_create(
            project=project,
            name=DEMO_FUNCTIONS,
            by=user,
            description="Write a one-line function from its description; graded by unit tests in a sandbox.",
        )
    if not task_set.versions.exists():
        project_services.task_set_import(
            task_set=task_set, stream=demo_function_lines(), file_format="jsonl", by=user, source_name="demo"
        )


def demo_run_launch(*, project: Project, by: User) -> Run:
    """The one-click demo: GRPO of the tiny base model on the demo functions, unit-test rewards."""

    task_set = TaskSet.objects.filter(project=project, name=DEMO_FUNCTIONS).first()
    rule = project.reward_rules.filter(name="unit-tests").first()
    tier = Tier.objects.filter(project=project, name="rollout").first()
    version = task_set.versions.first() if task_set is not None else None
    rule_version = rule.versions.order_by("-number").first() if rule is not None else None
    if version is None or rule_version is None or tier is None:
        raise ValidationError("this project has no demo set-up; run `python manage.py seed_demo`")
    request = RunRequest(
        project=project,
        name="GRPO demo",
        task_set_version=version,
        reward_rule_version=rule_version,
        tier=tier,
        method="grpo",
        hyperparameters=dict(DEMO_RUN_HYPERPARAMETERS),
        max_steps=DEMO_RUN_STEPS,
        max_wall_seconds=DEMO_RUN_WALL_SECONDS,
    )
    return run_create(request=request, by=by)

# The fixtures imported from sandbox_fixtures are test parameters here, not redefinitions:
# ruff: noqa: F811
"""Code items in the field's five test formats: each imports, scores in the sandbox on every backend
with per-test results (name, passed, the failing assertion's message, expected and actual), and an
item whose tests hold no test in any format is refused at import with its line and field."""

import dataclasses
import json

import pytest
from sandbox_fixtures import backend  # noqa: F401

from projects import services as project_services
from projects.models import TaskItem, TaskSetVersion
from projects.task_format import validate_item
from rewards.engine import Sample, score
from sandboxes.config import sandbox_settings
from sandboxes.pool import SandboxPool
from tests.conftest import make_project, make_user

PYTEST_TESTS = (
    "from solution import add\n\n\ndef test_small():\n    assert add(1, 2) == 3\n\n\n"
    "def test_equal():\n    assert add(2, 2) == 4\n"
)
# One line of each format, as a user's file holds it (the README shows the same lines).
LINES = {
    "flywheel": {"tests": "from solution import add\n\nassert add(1, 2) == 3\nassert add(2, 2) == 4\n"},
    "candidate": {
        "tests": (
            "METADATA = {}\n\n\ndef check(candidate):\n    assert candidate(1, 2) == 3\n"
            "    assert candidate(2, 2) == 4\n\n\ncheck(add)\n"
        ),
        "entry_point": "add",
    },
    "namespace": {
        "tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"],
        "test_setup_code": "import math",
    },
    "io": {"io_tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "2 2\n", "output": "4\n"}]},
    "pytest": {"setup_files": {"test_add.py": PYTEST_TESTS}},
}
FIRST_TEST = {
    "flywheel": "line 3",
    "candidate": "check line 5",
    "namespace": "line 1",
    "io": "case 1",
    "pytest": "test_add.py::test_small",
}
HONEST = (
    "def add(a, b):\n    return a + b\n\n\nif __name__ == '__main__':\n"
    "    a, b = map(int, input().split())\n    print(add(a, b))\n"
)
WRONG = HONEST.replace("a + b", "a * b")  # add(1, 2) == 2: the first test fails, the second passes
RULE = {"type": "unit_tests", "name": "tests", "score": "pass_rate"}  # per-test credit, to see each test


def code_item(test_format: str, backend: str = "bubblewrap") -> dict:
    raw = {"id": f"add-{test_format}", "kind": "code", "prompt": "Write add(a, b).", **LINES[test_format]}
    if test_format == "pytest" and backend == "docker":
        raw["sandbox"] = {"image": "flywheel-sandbox:pytest"}
    parsed, errors = validate_item(1, raw)
    assert errors == []
    return {**parsed.data, "id": parsed.external_id, "kind": "code"}


@pytest.fixture(scope="module")
def backend_pool(backend):
    pool = SandboxPool(
        settings=dataclasses.replace(sandbox_settings(), backend=backend), max_sandboxes=2, warm=0
    )
    yield pool
    pool.close()


@pytest.mark.parametrize("test_format", list(LINES))
def test_each_format_is_recognised_from_its_tests(test_format):
    from sandboxes.formats import item_format

    assert item_format(code_item(test_format)) == test_format


@pytest.mark.parametrize("test_format", list(LINES))
def test_each_format_scores_in_the_sandbox_with_per_test_results(backend, backend_pool, test_format):
    item = code_item(test_format, backend)
    honest = score(RULE, item, Sample(files={"solution.py": HONEST}), pool=backend_pool)
    assert (honest.total, honest.errors, honest.flags, honest.stop_reason) == (1.0, [], [], "exited")
    assert [test["passed"] for test in honest.tests] == [True, True]
    wrong = score(RULE, item, Sample(files={"solution.py": WRONG}), pool=backend_pool)
    assert (wrong.total, wrong.flags) == (0.5, [])
    failed, passed = wrong.tests
    assert (failed["name"], failed["passed"], failed["outcome"]) == (FIRST_TEST[test_format], False, "fail")
    assert passed["passed"] is True
    if test_format == "io":
        assert (failed["expected"], failed["actual"]) == ("3\n", "2\n")
    else:
        assert (failed["expected"], failed["actual"]) == ("3", "2")
        assert failed["message"].endswith("(1, 2) == 3")
    all_pass = score(
        RULE | {"score": "all_pass"}, item, Sample(files={"solution.py": WRONG}), pool=backend_pool
    )
    assert all_pass.total == 0.0
    # without a `score`, the benchmark formats score as their benchmarks do: every test, or nothing
    default = score({"type": "unit_tests"}, item, Sample(files={"solution.py": WRONG}), pool=backend_pool)
    assert default.total == (0.5 if test_format in ("flywheel", "pytest") else 0.0)


def test_candidate_tests_that_call_check_themselves_run_once_per_test(backend_pool):
    item = code_item("candidate")
    assert item["tests"].rstrip().endswith("check(add)")
    counting = (
        "CALLS = []\n\ndef add(a, b):\n    CALLS.append(1)\n"
        "    assert len(CALLS) <= 2, 'called again'\n    return a + b\n"
    )
    result = score(RULE, item, Sample(files={"solution.py": counting}), pool=backend_pool)
    assert result.total == 1.0 and [test["name"] for test in result.tests] == ["check line 5", "check line 6"]


def test_a_missing_entry_point_fails_every_candidate_test(backend_pool):
    result = score(
        RULE,
        code_item("candidate"),
        Sample(files={"solution.py": "def plus(a, b):\n    return a + b\n"}),
        pool=backend_pool,
    )
    assert result.total == 0.0
    assert {test["message"] for test in result.tests} == {"the solution defines no function 'add'"}


@pytest.mark.parametrize(
    ("mode", "output", "passed"),
    [
        ("exact", "3\n", True),
        ("exact", "3 \n", False),
        ("whitespace", " 3 \n\n", True),
        ("whitespace", "3.0\n", False),
        ("float", "3.0000001\n", True),
        ("float", "3.01\n", False),
    ],
)
def test_io_outputs_compare_exactly_by_whitespace_or_within_a_float_tolerance(
    backend_pool, mode, output, passed
):
    item = code_item("io") | {"io_compare": mode, "io_tests": [{"input": "", "output": "3\n"}]}
    program = f"print({output!r}, end='')\n"
    result = score(RULE, item, Sample(files={"solution.py": program}), pool=backend_pool)
    assert result.total == (1.0 if passed else 0.0)


def test_an_io_case_past_its_time_limit_fails_alone(backend_pool):
    cases = [{"input": "1\n", "output": "1\n", "time_limit": 0.5}, {"input": "2\n", "output": "2\n"}]
    item = code_item("io") | {"io_tests": cases}
    program = "import time\nn = int(input())\nif n == 1:\n    time.sleep(5)\nprint(n)\n"
    result = score(RULE, item, Sample(files={"solution.py": program}), pool=backend_pool)
    assert result.total == 0.5
    assert [(test["outcome"], test["message"]) for test in result.tests] == [
        ("timeout", "ran past its 0.5 s limit"),
        ("pass", ""),
    ]


@pytest.mark.parametrize(
    ("raw", "field", "message"),
    [
        ({"tests": "x = 1\n", "entry_point": "f"}, "tests", "holds no test in any format"),
        (
            {"tests": "x = 1\n", "test_format": "candidate", "entry_point": "f"},
            "tests",
            "must define check(candidate)",
        ),
        (
            {"tests": "def check(candidate):\n    assert candidate(1)\n"},
            "entry_point",
            "is required for candidate-style",
        ),
        ({"test_format": "io", "io_tests": [{"input": "1"}]}, "io_tests.0.output", "is required"),
        (
            {"setup_files": {"test_a.py": "x = 1\n"}, "test_format": "pytest"},
            "setup_files",
            "holds no test_*.py",
        ),
        ({"tests": "assert f(1) ==\n"}, "tests", "holds no test in any format"),
        ({"tests": "assert f(1)\n", "test_format": "nope"}, "test_format", "must be one of flywheel"),
    ],
)
def test_a_code_item_without_a_test_in_its_format_is_refused_naming_the_field(raw, field, message):
    parsed, errors = validate_item(7, {"kind": "code", "prompt": "p", **raw})
    assert parsed is None
    assert [(error.line, error.field) for error in errors] == [(7, field)]
    assert message in errors[0].message


@pytest.mark.django_db
def test_a_file_with_a_test_less_code_item_imports_nothing_and_names_its_line():
    user = make_user("formats")
    task_set = project_services.task_set_create(project=make_project(user), name="formats", by=user)
    lines = [code_item(name) | {"id": name} for name in LINES]
    lines.insert(3, {"id": "broken", "kind": "code", "prompt": "p", "tests": "print('no test here')\n"})
    stream = [(json.dumps({key: value for key, value in line.items()}) + "\n").encode() for line in lines]
    report = project_services.task_set_import(task_set=task_set, stream=stream, file_format="jsonl", by=user)
    assert [(error.line, error.field) for error in report.errors] == [(4, "tests")]
    assert TaskSetVersion.objects.count() == 0 and TaskItem.objects.count() == 0
    del lines[3]
    stream = [(json.dumps(line) + "\n").encode() for line in lines]
    report = project_services.task_set_import(task_set=task_set, stream=stream, file_format="jsonl", by=user)
    assert report.ok and report.version.item_count == 5


@pytest.mark.django_db
def test_a_dry_run_shows_each_formats_per_test_results_and_matches_the_schema():
    from rewards import services as reward_services
    from tests.conftest import api_client_for
    from tests.test_api_schema import assert_matches_schema

    owner = make_user("dry-runner")
    project = make_project(owner, name="dry-run formats")
    rule = reward_services.reward_rule_create(project=project, name="tests", spec=RULE, by=owner)
    items = [code_item(name) for name in LINES]
    samples = [{"files": {"solution.py": WRONG}, "item_id": item["id"]} for item in items]
    path = f"/api/v1/reward-rules/{rule.pk}/dry-run"
    response = api_client_for(owner).post(path, {"items": items, "samples": samples}, format="json")
    assert response.status_code == 200, response.json()
    schema = json.loads(api_client_for(owner).get("/api/v1/schema/", {"format": "json"}).content)
    assert_matches_schema(schema, response, "post", "/api/v1/reward-rules/{id}/dry-run")
    results = [entry["result"] for entry in response.json()["results"]]
    assert [result["total"] for result in results] == [0.5] * len(LINES)
    assert [result["tests"][0]["name"] for result in results] == list(FIRST_TEST.values())
    assert {result["stop_reason"] for result in results} == {"exited"}

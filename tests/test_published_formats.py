# The fixtures imported from sandbox_fixtures are test parameters here, not redefinitions:
# ruff: noqa: F811
"""The field's task files as they ship: HumanEval, MBPP (original and sanitized), APPS-style and
LiveCodeBench-style lines import unchanged (five small problems of our own in each layout, under
tests/data/published/), recognised by their fields or forced by a format preset, with provenance;
in the real sandbox (bubblewrap: the hostile suite holds Docker to the same) each canonical
solution scores 1.0 and a `pass` body 0.0 on every item. A bad line is refused naming its line
and published field, and a failed import leaves nothing behind."""

import ast
import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.core.management.base import CommandError
from sandbox_fixtures import bubblewrap_pool  # noqa: F401  (a fixture)

from projects import selectors as project_selectors
from projects import services as project_services
from projects.models import TaskItem, TaskSet, TaskSetVersion
from projects.published_formats import recognise_line
from projects.task_format import read_jsonl, validate_item
from rewards.engine import Sample, score
from tests.conftest import api_client_for

DATA = Path(__file__).resolve().parent / "data" / "published"
FILES = {
    "humaneval": "humaneval.jsonl",
    "mbpp": "mbpp.jsonl",
    "mbpp-sanitized": "mbpp_sanitized.jsonl",
    "apps": "apps.jsonl",
    "codecontests": "codecontests.jsonl",
    "livecodebench": "livecodebench.jsonl",
}
SOURCE = {name: name.removesuffix("-sanitized") for name in FILES}
TEST_FORMATS = {
    "humaneval": ["candidate"] * 5,
    "mbpp": ["namespace"] * 5,
    "mbpp-sanitized": ["namespace"] * 5,
    "apps": ["io", "io", "io", "io", "namespace"],  # the last is call-based (fn_name)
    "codecontests": ["io"] * 5,
    "livecodebench": ["io", "io", "io", "namespace", "namespace"],  # stdin, then functional
}
# The benchmarks' own scoring: an item counts only when all its tests pass.
ALL_PASS = {"type": "unit_tests", "name": "tests", "score": "all_pass"}
PASS_RATE = {"type": "unit_tests", "name": "tests"}


def raw_lines(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / FILES[name]).read_text().splitlines()]


def file_bytes(name: str) -> list[bytes]:
    return (DATA / FILES[name]).read_bytes().splitlines(keepends=True)


def canonical(name: str, raw: dict, item: dict) -> str:
    """The line's own solution: HumanEval's prompt + canonical_solution, MBPP's code, APPS's first
    solution, CodeContests's first Python 3 one; LiveCodeBench ships none, so ours sit beside the file."""
    if name == "livecodebench":
        return json.loads((DATA / "livecodebench_solutions.json").read_text())[raw["question_id"]]
    return item["reference_solution"]


def pass_body(solution: str) -> str:
    """The solution with every function's body replaced by `pass` (a program: just `pass`)."""
    tree = ast.parse(solution)
    functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]
    if not functions:
        return "pass\n"
    for function in functions:
        function.body = [ast.Pass()]
    return ast.unparse(tree) + "\n"


@pytest.fixture
def owner(team):
    return team["owner"]


def import_file(team, name: str, **options) -> project_services.ImportReport:
    task_set = project_services.task_set_create(project=team["project"], name=name, by=team["owner"])
    return project_services.task_set_import(
        task_set=task_set, stream=file_bytes(name), file_format="jsonl", by=team["owner"], **options
    )


@pytest.mark.parametrize("name", list(FILES))
def test_each_published_line_is_recognised_by_its_fields(name):
    assert [recognise_line(raw) for raw in raw_lines(name)] == [SOURCE[name]] * 5


@pytest.mark.parametrize("name", list(FILES))
@pytest.mark.parametrize("preset", ["auto", "forced"])
def test_each_published_file_imports_unchanged_with_provenance(team, name, preset):
    report = import_file(team, name, preset=SOURCE[name] if preset == "forced" else "auto")
    assert report.ok, [str(error) for error in report.errors]
    assert (report.created, report.item_count, report.kind_counts) == (True, 5, {"code": 5})
    items = project_selectors.grading_items_of(version=report.version)
    id_field = {
        "humaneval": "task_id",
        "mbpp": "task_id",
        "apps": "problem_id",
        "codecontests": "name",
        "livecodebench": "question_id",
    }
    originals = [raw[id_field[SOURCE[name]]] for raw in raw_lines(name)]
    assert [item["id"] for item in items] == [str(original) for original in originals]
    assert [item["metadata"]["source"] for item in items] == [SOURCE[name]] * 5
    assert [item["metadata"]["task_id"] for item in items] == originals
    assert [item["test_format"] for item in items] == TEST_FORMATS[name]


def test_a_humaneval_line_maps_onto_candidate_tests():
    raw = raw_lines("humaneval")[0]
    parsed, errors = validate_item(1, raw)
    assert errors == []
    assert parsed.data == {
        "prompt": raw["prompt"],
        "tests": raw["test"],
        "entry_point": "add",
        "test_format": "candidate",
        "reference_solution": raw["prompt"] + raw["canonical_solution"],
        "metadata": {"source": "humaneval", "task_id": "Flywheel/0"},
    }


def test_an_mbpp_line_maps_onto_namespace_tests_and_its_prompt_shows_the_tests():
    raw = raw_lines("mbpp")[4]
    parsed, _ = validate_item(1, raw)
    assert parsed.data["tests"] == "\n".join(raw["test_list"]) + "\n"
    assert (parsed.data["test_setup_code"], parsed.data["entry_point"]) == ("import math", "greatest_divisor")
    assert parsed.data["prompt"].startswith(raw["text"] + "\nYour code should pass these tests:\n\n")
    assert parsed.data["metadata"] == {"source": "mbpp", "task_id": 605, "challenge_test_list": []}


def test_apps_codecontests_and_livecodebench_cases_map_onto_io_tests_and_call_asserts():
    apps = [validate_item(1, raw)[0].data for raw in raw_lines("apps")]
    assert apps[3]["io_tests"] == [{"input": "3\n", "output": "1\n2\n3\n"}, {"input": "1\n", "output": "1\n"}]
    assert apps[3]["io_compare"] == "whitespace"
    assert (
        apps[4]["tests"]
        == "assert digit_sum(123) == 6\nassert digit_sum(0) == 0\nassert digit_sum(9999) == 36\n"
    )
    contest = validate_item(1, raw_lines("codecontests")[1])[0].data
    assert contest["io_tests"] == [  # public, private and generated tests, with the problem's limit
        {"input": "abc\n", "output": "ABC\n", "time_limit": 2.0},
        {"input": "Zq\n", "output": "ZQ\n", "time_limit": 2.0},
    ]
    assert contest["reference_solution"] == "print(input().upper())\n"  # the first Python 3 one
    assert "incorrect_solutions" not in contest["metadata"] and contest["metadata"]["cf_rating"] == 800
    lcb = [validate_item(1, raw)[0].data for raw in raw_lines("livecodebench")]
    assert lcb[0]["io_tests"][0] == {"input": "1 2 3\n", "output": "6\n"} and len(lcb[0]["io_tests"]) == 3
    assert lcb[3]["tests"].splitlines()[0] == "assert Solution().countPairs([1, 2, 3, 4], 5) == 2"
    assert lcb[3]["metadata"]["func_name"] == "countPairs" and lcb[3]["metadata"]["platform"] == "leetcode"


@pytest.mark.parametrize("name", list(FILES))
def test_canonical_solutions_score_one_and_pass_bodies_zero_in_the_sandbox(team, bubblewrap_pool, name):
    report = import_file(team, name)
    items = project_selectors.grading_items_of(version=report.version)
    canonical_totals, stub_totals, stub_rates = [], [], []
    for raw, item in zip(raw_lines(name), items, strict=True):
        solution = canonical(name, raw, item)
        honest = score(ALL_PASS, item, Sample(files={"solution.py": solution}), pool=bubblewrap_pool)
        assert honest.errors == [] and honest.flags == [], (item["id"], honest.tests)
        canonical_totals.append(honest.total)
        stub = Sample(files={"solution.py": pass_body(solution)})
        stub_totals.append(score(ALL_PASS, item, stub, pool=bubblewrap_pool).total)
        stub_rates.append(score(PASS_RATE, item, stub, pool=bubblewrap_pool).total)
    assert canonical_totals == [1.0] * 5
    assert stub_totals == [0.0] * 5
    assert stub_rates == [0.0] * 5  # no test of ours is one a stub passes, so even partial credit pays 0


# --- bad lines --------------------------------------------------------------------------------


def errors_of(lines: list[dict], preset: str = "auto") -> list[tuple[int, str | None, str]]:
    found = []
    for _, errors in read_jsonl([json.dumps(line) for line in lines], preset):
        found += [(error.line, error.field, error.message) for error in errors]
    return found


def test_a_bad_published_line_is_refused_naming_its_line_and_field():
    humaneval, mbpp = raw_lines("humaneval")[0], raw_lines("mbpp")[0]
    apps, lcb = raw_lines("apps")[0], raw_lines("livecodebench")[0]
    lines = [
        humaneval,
        {key: value for key, value in humaneval.items() if key != "test"},
        mbpp | {"test_list": "assert f(1) == 2"},
        apps | {"input_output": "{not json"},
        lcb | {"private_test_cases": "eJzLSM3JyVcozy/KSQEAGgQEXQ=="},
        lcb | {"public_test_cases": json.dumps([{"input": "1\n", "testtype": "stdin"}])},
        humaneval | {"test": "x = 1\n"},
    ]
    assert errors_of(lines) == [
        (2, "test", "is required (HumanEval line)"),
        (3, "test_list", "must be a list of strings (MBPP line)"),
        (
            4,
            "input_output",
            "must be JSON (Expecting property name enclosed in double quotes at column 2) (APPS line)",
        ),
        (
            5,
            "private_test_cases",
            "must be JSON (LiveCodeBench's compressed release: decode it to JSON first) (LiveCodeBench line)",
        ),
        (6, "public_test_cases.0.output", "must be a string (LiveCodeBench line)"),
        (7, "test", "candidate-style tests must define check(candidate) (HumanEval line)"),
    ]


def test_a_forced_preset_reads_every_line_in_that_format():
    flywheel = {"kind": "code", "prompt": "p", "tests": "assert f(1) == 1\n"}
    assert errors_of([flywheel], "flywheel") == []
    assert [(line, field) for line, field, _ in errors_of([flywheel], "humaneval")] == [
        (1, "canonical_solution")
    ]
    assert errors_of([raw_lines("mbpp")[0]], "flywheel")[0][1] == "challenge_test_list"


# --- nothing left behind ------------------------------------------------------------------------


def bad_file(tmp_path: Path) -> Path:
    lines = raw_lines("humaneval")
    del lines[3]["canonical_solution"]
    path = tmp_path / "humaneval.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_failed_command_import_leaves_no_task_set_and_no_version(team, tmp_path):
    project, user = team["project"], team["launcher"]
    with pytest.raises(CommandError, match="1 errors; nothing was imported"):
        call_command("import_tasks", project.name, "he", str(bad_file(tmp_path)), user=user.username)
    assert not TaskSet.objects.filter(name="he").exists()
    assert TaskSetVersion.all_objects.count() == 0 and TaskItem.objects.count() == 0
    out = StringIO()
    call_command(
        "import_tasks",
        project.name,
        "he",
        str(DATA / FILES["humaneval"]),
        user=user.username,
        verify_references=True,
        stdout=out,
        stderr=StringIO(),
    )
    version = TaskSet.objects.get(name="he").versions.get()
    assert (version.number, version.item_count) == (1, 5)
    assert "5 references checked, 5 pass, 0 broken" in out.getvalue()


def test_the_command_forces_a_format_with_its_format_preset(team, tmp_path):
    path = tmp_path / "mbpp.txt"
    path.write_bytes((DATA / FILES["mbpp"]).read_bytes())
    user = team["launcher"].username
    call_command("import_tasks", team["project"].name, "mbpp", str(path), user=user, format="mbpp")
    items = TaskSet.objects.get(name="mbpp").versions.get().items.order_by("position")
    assert [item.data["metadata"]["source"] for item in items] == ["mbpp"] * 5


def test_a_new_set_whose_import_fails_anyway_is_deleted_again(team, monkeypatch):
    def failing_import(**kwargs):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(project_services, "task_set_import", failing_import)
    with pytest.raises(RuntimeError):
        project_services.task_set_create_with_import(
            project=team["project"],
            name="he",
            by=team["owner"],
            open_stream=lambda: file_bytes("humaneval"),
            file_format="jsonl",
        )
    assert not TaskSet.objects.filter(name="he").exists()


def test_rest_import_takes_a_published_file_and_a_format_parameter(team):
    task_set = project_services.task_set_create(project=team["project"], name="lcb", by=team["owner"])
    client = api_client_for(team["launcher"])
    path = f"/api/v1/task-sets/{task_set.pk}/import"
    content = (DATA / FILES["livecodebench"]).read_bytes()
    forced = client.post(
        path, {"file": SimpleUploadedFile("x.txt", content), "format": "livecodebench"}, format="multipart"
    )
    assert forced.status_code == 201, forced.json()
    assert forced.json()["item_count"] == 5
    wrong = client.post(
        path, {"file": SimpleUploadedFile("x.jsonl", content), "format": "apps"}, format="multipart"
    )
    assert wrong.status_code == 400
    assert wrong.json()["error"]["details"][0] == {
        "line": 1,
        "param": "question",
        "message": "is required (APPS line)",
    }
    assert task_set.versions.count() == 1


def test_the_upload_page_takes_a_format(team, client):
    task_set = project_services.task_set_create(project=team["project"], name="apps", by=team["owner"])
    client.force_login(team["launcher"])
    upload = SimpleUploadedFile("apps.txt", (DATA / FILES["apps"]).read_bytes())
    preview = client.post(f"/task-sets/{task_set.pk}/import/", {"file": upload, "format": "apps"})
    assert preview.status_code == 200
    staged = preview.context["staged"]
    assert preview.context["report"].item_count == 5 and staged is not None
    assert b'name="format" value="apps"' in preview.content
    confirmed = client.post(
        f"/task-sets/{task_set.pk}/import/{staged.pk}/confirm/",
        {"split_seed": "", "heldout_fraction": "", "format": "apps"},
    )
    assert confirmed.status_code == 302
    assert task_set.versions.get().item_count == 5

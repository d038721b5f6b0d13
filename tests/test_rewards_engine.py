"""The engine: rule validation, composition, sandbox graders, typed errors, errored samples, batching."""

import dataclasses

import pytest

from rewards.engine import RuleError, Sample, score, score_batch, validate_rule
from sandboxes.config import sandbox_settings
from sandboxes.interface import SandboxSpec
from sandboxes.pool import SandboxPool

TESTS = (
    "from solution import square\n\n"
    "assert square(2) == 4\nassert square(3) == 9\nassert square(-1) == 1\nassert square(0) == 0\n"
)
CODE_ITEM = {
    "id": "sq",
    "kind": "code",
    "split": "train",
    "prompt": "Write square(x).",
    "tests": TESTS,
    "entry_point": "square",
    "reference_solution": "def square(x):\n    return x * x\n",
}
HONEST = "def square(x):\n    return x * x\n"
THREE_OF_FOUR = "def square(x):\n    return x * x if x else 1\n"  # wrong for 0 only
FIELD_EXAMPLE = {
    "type": "multi",
    "name": "outcome_first",
    "graders": {
        "tests": {"type": "unit_tests"},
        "invalid": {"type": "invalid_actions"},
        "steps": {"type": "steps"},
    },
    "calculate_output": "2.0 * tests - 0.2 * invalid - 0.01 * steps",
}


def make_steps(count: int, invalid: int) -> list[dict]:
    return [
        {
            "action": f"step {n}",
            "kind": "code",
            "valid": n >= invalid,
            "format_ok": True,
            "tokens": 4,
            "observation": "",
        }
        for n in range(count)
    ]


@pytest.fixture(scope="module")
def pool():
    settings = dataclasses.replace(sandbox_settings(), backend="bubblewrap")
    pool = SandboxPool(settings=settings, max_sandboxes=4, warm=0)
    yield pool
    pool.close()


# -- the field example -------------------------------------------------------------------------


def test_the_field_example_scores_outcome_first_with_exact_components(pool):
    sample = Sample(files={"solution.py": THREE_OF_FOUR}, steps=make_steps(10, invalid=2))
    result = score(FIELD_EXAMPLE, CODE_ITEM, sample, pool=pool)
    assert result.components == {"tests": 0.75, "invalid": 2.0, "steps": 10.0}
    assert result.total == pytest.approx(2.0 * 0.75 - 0.2 * 2 - 0.01 * 10)
    assert result.total == pytest.approx(1.0)
    assert (result.errors, result.errored, result.flags) == ([], False, [])


def test_a_perfect_solution_in_few_clean_steps_earns_nearly_two(pool):
    sample = Sample(files={"solution.py": HONEST}, steps=make_steps(3, invalid=0))
    result = score(FIELD_EXAMPLE, CODE_ITEM, sample, pool=pool)
    assert result.components == {"tests": 1.0, "invalid": 0.0, "steps": 3.0}
    assert result.total == pytest.approx(1.97)


def test_nested_multi_graders_name_their_components_with_dots():
    rule = {
        "type": "multi",
        "graders": {
            "quality": {
                "type": "multi",
                "graders": {
                    "exact": {
                        "type": "string_check",
                        "input": "{{ sample.output_text }}",
                        "reference": "4",
                        "operation": "eq",
                    },
                    "close": {
                        "type": "numeric",
                        "input": "{{ sample.output_text }}",
                        "reference": "4",
                        "tolerance": 1,
                    },
                },
                "calculate_output": "(exact + close) / 2",
            },
            "steps": {"type": "steps"},
        },
        "calculate_output": "clamp(quality - 0.1 * steps, 0, 1)",
    }
    result = score(
        rule,
        {"kind": "answer", "prompt": "?", "reference": "4"},
        Sample(output_text="5", steps=make_steps(2, 0)),
    )
    assert result.components == {"quality.exact": 0.0, "quality.close": 1.0, "quality": 0.5, "steps": 2.0}
    assert result.total == pytest.approx(0.3)


# -- sandbox graders ---------------------------------------------------------------------------


def test_unit_tests_scores_the_pass_rate_of_a_solution_from_files_or_a_fenced_block(pool):
    rule = {"type": "unit_tests", "name": "tests"}
    assert score(rule, CODE_ITEM, Sample(files={"solution.py": HONEST}), pool=pool).total == 1.0
    fenced = Sample(output_text=f"Here you go:\n```python\n{THREE_OF_FOUR}```\n")
    assert score(rule, CODE_ITEM, fenced, pool=pool).total == 0.75
    assert score(rule, CODE_ITEM, Sample(output_text="I don't know."), pool=pool).total == 0.0


def test_the_tests_that_run_are_the_items_own_whatever_the_sample_wrote_over_them(pool):
    tampered = Sample(
        files={"solution.py": "def square(x):\n    return 0\n", "test_solution.py": "assert True\n"}
    )
    result = score({"type": "unit_tests", "name": "tests"}, CODE_ITEM, tampered, pool=pool)
    assert (result.total, result.components) == (0.0, {"tests": 0.25, "hacking_floor": 0.0})
    assert [flag.detector for flag in result.flags] == ["test_files_modified"]
    opted_out = {"type": "unit_tests", "name": "tests", "hacking_opt_out": ["test_files_modified"]}
    assert score(opted_out, CODE_ITEM, tampered, pool=pool).total == 0.25


def test_graded_code_that_times_out_scores_zero_with_a_sandbox_timeout_error_and_is_not_errored(pool):
    looping = Sample(files={"solution.py": "def square(x):\n    while True:\n        pass\n"})
    result = score({"type": "unit_tests", "name": "tests", "timeout": 1}, CODE_ITEM, looping, pool=pool)
    assert (result.total, result.components, result.errored) == (0.0, {"tests": 0.0}, False)
    assert [(error.grader, error.kind) for error in result.errors] == [("tests", "sandbox_timeout")]


def test_an_items_sandbox_limits_replace_the_rules_for_that_item(pool):
    """The rule allows 1 s; an item whose tests need 1.5 s of sleep asks for 5 and passes."""
    slow = CODE_ITEM | {"tests": "import time\ntime.sleep(1.5)\n" + TESTS}
    rule = {"type": "unit_tests", "name": "tests", "timeout": 1}
    honest = Sample(files={"solution.py": HONEST})
    short = score(rule, slow, honest, pool=pool)
    assert [(error.grader, error.kind) for error in short.errors] == [("tests", "sandbox_timeout")]
    asked = slow | {"sandbox": {"limits": {"wall_seconds": 5}}}
    assert score(rule, asked, honest, pool=pool).total == 1.0


def test_an_item_asking_for_an_image_bubblewrap_cannot_give_is_errored_with_the_reason(pool):
    item = CODE_ITEM | {"sandbox": {"image": "swe-task-17:latest"}}
    result = score(
        {"type": "unit_tests", "name": "tests"}, item, Sample(files={"solution.py": HONEST}), pool=pool
    )
    assert (result.total, result.errored, result.errors[0].kind) == (None, True, "sandbox_error")
    assert "'swe-task-17:latest'" in result.errors[0].message and "FLYWHEEL_SANDBOX_BACKEND=docker" in (
        result.errors[0].message
    )


def test_an_items_image_is_the_one_docker_starts():
    settings = dataclasses.replace(sandbox_settings(), backend="docker")
    docker = SandboxPool(settings=settings, max_sandboxes=1, warm=0)
    honest = Sample(files={"solution.py": HONEST})
    try:
        own = score(
            {"type": "unit_tests", "name": "tests"},
            CODE_ITEM | {"sandbox": {"image": settings.image}},
            honest,
            pool=docker,
        )
        missing = CODE_ITEM | {"sandbox": {"image": "flywheel-sandbox:no-such-tag"}}
        absent = score({"type": "unit_tests", "name": "tests"}, missing, honest, pool=docker)
    finally:
        docker.close()
    assert own.total == 1.0
    assert (absent.total, absent.errored) == (None, True)
    assert "flywheel-sandbox:no-such-tag" in absent.errors[0].message


def test_an_infrastructure_failure_is_errored_never_scored():
    settings = dataclasses.replace(
        sandbox_settings(), backend="docker", image="flywheel-sandbox:no-such-image"
    )
    broken = SandboxPool(settings=settings, max_sandboxes=1, warm=0)
    try:
        result = score(
            FIELD_EXAMPLE,
            CODE_ITEM,
            Sample(files={"solution.py": HONEST}, steps=make_steps(3, 0)),
            pool=broken,
        )
    finally:
        broken.close()
    assert (result.total, result.errored) == (None, True)
    assert result.components == {"tests": None, "invalid": 0.0, "steps": 3.0}
    assert [(error.grader, error.kind) for error in result.errors] == [("tests", "sandbox_error")]


def test_agent_check_runs_the_check_command_on_the_final_workspace_with_pristine_checks(pool):
    item = {
        "id": "fix",
        "kind": "agent",
        "split": "train",
        "instructions": "Make greet() say hello.",
        "check_command": "python3 check_greet.py",
        "max_steps": 5,
        "files": {
            "greet.py": "def greet():\n    return 'bye'\n",
            "check_greet.py": "from greet import greet\nassert greet() == 'hello'\n",
        },
    }
    rule = {"type": "agent_check", "name": "check"}
    fixed = Sample(files={"greet.py": "def greet():\n    return 'hello'\n"})
    assert score(rule, item, fixed, pool=pool).total == 1.0
    assert score(rule, item, Sample(), pool=pool).total == 0.0
    cheat = Sample(files={"check_greet.py": "pass\n"})
    result = score(rule, item, cheat, pool=pool)
    assert result.total == 0.0
    assert [flag.detector for flag in result.flags] == ["test_files_modified"]


def test_agent_check_runs_in_the_episodes_own_sandbox_when_given_one(pool):
    item = {
        "id": "w",
        "kind": "agent",
        "instructions": "Write out.txt",
        "check_command": "test -f out.txt",
        "max_steps": 3,
    }
    with pool.acquire(SandboxSpec()) as episode:
        episode.write_file("out.txt", "done")
        assert score({"type": "agent_check"}, item, Sample(), pool=pool, sandbox=episode).total == 1.0


PYTHON_GRADER = {
    "type": "python",
    "name": "py",
    "source": "def grade(sample, item):\n    return len(sample['output_text']) / len(item['reference'])\n",
}


def test_a_python_grader_runs_in_a_sandbox_and_returns_its_value(pool):
    result = score(
        PYTHON_GRADER,
        {"kind": "answer", "prompt": "?", "reference": "abcd"},
        Sample(output_text="ab"),
        pool=pool,
    )
    assert (result.total, result.errors) == (0.5, [])


def test_a_python_grader_cannot_touch_the_host(pool):
    spy = {
        **PYTHON_GRADER,
        "source": "import os\ndef grade(sample, item):\n    return float(os.path.exists('/work'))\n",
    }
    assert score(spy, {"kind": "answer", "prompt": "?", "reference": "x"}, Sample(), pool=pool).total == 0.0


def test_python_grader_failures_are_typed(pool):
    item = {"kind": "answer", "prompt": "?", "reference": "x"}
    raising = {**PYTHON_GRADER, "source": "def grade(sample, item):\n    raise KeyError('answer')\n"}
    wrong_type = {**PYTHON_GRADER, "source": "def grade(sample, item):\n    return 'high'\n"}
    looping = {
        **PYTHON_GRADER,
        "timeout": 1,
        "source": "def grade(sample, item):\n    while True:\n        pass\n",
    }
    outcomes = [score(rule, item, Sample(), pool=pool) for rule in (raising, wrong_type, looping)]
    assert [(r.total, r.errors[0].kind, r.errored) for r in outcomes] == [
        (None, "grader_exception", False),
        (None, "invalid_output", False),
        (0.0, "sandbox_timeout", False),
    ]
    assert "KeyError: 'answer'" in outcomes[0].errors[0].message


def test_score_batch_scores_in_parallel_across_the_pool_and_keeps_the_order(pool):
    solutions = [HONEST, THREE_OF_FOUR, "def square(x):\n    return 0\n", HONEST, THREE_OF_FOUR, "nonsense("]
    pairs = [(CODE_ITEM, Sample(files={"solution.py": source})) for source in solutions]
    results = score_batch({"type": "unit_tests", "name": "tests"}, pairs, pool=pool, max_workers=3)
    assert [result.total for result in results] == [1.0, 0.75, 0.25, 1.0, 0.75, 0.0]


def test_score_batch_of_in_process_graders_is_a_plain_loop():
    rule = {
        "type": "string_check",
        "input": "{{ sample.output_text }}",
        "reference": "{{ item.reference }}",
        "operation": "eq",
    }
    items = [{"kind": "answer", "prompt": str(n), "reference": str(n)} for n in range(5)]
    results = score_batch(rule, [(item, Sample(output_text="3")) for item in items])
    assert [result.total for result in results] == [0.0, 0.0, 0.0, 1.0, 0.0]


# -- bad rules ---------------------------------------------------------------------------------


def problems_of(spec: dict, **options) -> list[tuple[str, str]]:
    return [(problem.path, problem.message) for problem in validate_rule(spec, **options)]


def test_an_unknown_grader_type_is_a_problem_at_its_place():
    spec = {**FIELD_EXAMPLE, "graders": {**FIELD_EXAMPLE["graders"], "tests": {"type": "unit_test"}}}
    [(path, message)] = problems_of(spec)
    assert path == "graders.tests.type"
    assert message.startswith("unknown grader type 'unit_test': one of agent_check, format_errors,")


def test_a_formula_naming_a_missing_sub_grader_is_a_problem_at_calculate_output():
    spec = {**FIELD_EXAMPLE, "calculate_output": "2.0 * tests - 0.2 * invalid - bonus"}
    assert problems_of(spec) == [
        ("calculate_output", "'bonus' is not a sub-grader (sub-graders: invalid, steps, tests)")
    ]


def test_a_formula_with_forbidden_constructs_is_refused():
    assert problems_of({**FIELD_EXAMPLE, "calculate_output": "tests.__class__"}) == [
        ("calculate_output", "attribute access is not allowed in a formula")
    ]
    assert problems_of({**FIELD_EXAMPLE, "calculate_output": "__import__('os')"}) == [
        (
            "calculate_output",
            "only these functions may be called: min, max, abs, clamp, floor, ceil, round, exp, sqrt, log",
        ),
        ("calculate_output", "'os' is not a number; formulas compute with numbers only"),
    ]


def test_a_template_with_an_unknown_variable_is_a_problem_at_its_field():
    spec = {
        "type": "multi",
        "graders": {
            "exact": {
                "type": "string_check",
                "input": "{{ sample.output_txt }}",
                "reference": "{{ itme.reference }}",
                "operation": "eq",
            }
        },
        "calculate_output": "exact",
    }
    assert problems_of(spec) == [
        (
            "graders.exact.input",
            "sample has no field 'output_txt' (it has output_text, output_json, files, steps, tokens, metadata)",  # noqa: E501
        ),
        ("graders.exact.reference", "unknown variable 'itme': templates reach item.* and sample.*"),
    ]


def test_item_fields_are_checked_when_the_item_kind_is_known():
    spec = {
        "type": "string_check",
        "input": "{{ sample.output_text }}",
        "reference": "{{ item.tests }}",
        "operation": "eq",
    }
    assert problems_of(spec) == []
    [(path, message)] = problems_of(spec, item_kind="answer")
    assert (path, message.split(" (")[0]) == ("reference", "item has no field 'tests'")


def test_missing_extra_and_mistyped_fields_are_each_named():
    spec = {
        "type": "string_check",
        "name": 3,
        "input": "{{ sample.output_text }}",
        "operation": "contains",
        "weight": 2,
    }
    assert [path for path, _ in problems_of(spec)] == ["name", "reference", "operation", "weight"]


def test_scoring_with_a_rule_that_does_not_validate_raises_with_its_problems():
    with pytest.raises(RuleError) as caught:
        score({"type": "nope"}, CODE_ITEM, Sample())
    assert [problem.path for problem in caught.value.problems] == ["type"]


def test_an_item_field_that_is_missing_at_scoring_time_is_a_bad_template_error():
    rule = {
        "type": "string_check",
        "name": "exact",
        "input": "{{ sample.output_text }}",
        "reference": "{{ item.nope_top }}",
        "operation": "eq",
    }
    result = score(rule, {"kind": "answer", "prompt": "?", "reference": "4"}, Sample(output_text="4"))
    assert (result.total, result.components, result.errored) == (None, {"exact": None}, False)
    assert [(error.grader, error.kind) for error in result.errors] == [("exact", "bad_template")]
    assert "item.nope_top is undefined" in result.errors[0].message


def test_a_formula_that_divides_by_zero_is_a_grader_error_on_the_multi():
    rule = {
        "type": "multi",
        "name": "rate",
        "graders": {"invalid": {"type": "invalid_actions"}, "steps": {"type": "steps"}},
        "calculate_output": "invalid / steps",
    }
    result = score(rule, {"kind": "answer", "prompt": "?", "reference": "4"}, Sample())
    assert (result.total, result.components) == (None, {"invalid": 0.0, "steps": 0.0})
    assert [(error.grader, error.kind) for error in result.errors] == [("rate", "grader_exception")]


# -- hacking penalties -------------------------------------------------------------------------


def test_flags_change_the_reward_only_when_the_rule_says_so(pool):
    exits = Sample(files={"solution.py": "import sys\nsys.exit(0)\n"}, steps=make_steps(1, 0))
    plain = score(FIELD_EXAMPLE, CODE_ITEM, exits, pool=pool)
    penalised = score({**FIELD_EXAMPLE, "hacking_penalty": {"early_exit": 1.0}}, CODE_ITEM, exits, pool=pool)
    assert [flag.detector for flag in plain.flags] == ["early_exit"]
    assert plain.total == pytest.approx(-0.01)
    assert penalised.total == pytest.approx(-1.01)
    assert penalised.components["hacking_penalty"] == -1.0


def test_to_dict_is_plain_json():
    result = score({"type": "steps"}, CODE_ITEM, Sample(steps=make_steps(2, 0)))
    assert result.to_dict() == {
        "total": 2.0,
        "components": {"steps": 2.0},
        "errors": [],
        "errored": False,
        "flags": [],
        "tests": [],
        "stop_reason": None,
    }

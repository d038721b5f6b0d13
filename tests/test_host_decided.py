# The fixtures imported from sandbox_fixtures are test parameters here, not redefinitions:
# ruff: noqa: F811
"""Tests the host decides from the values a call returned (sandboxes/values.py), and credit only
for tests a stub of the solution fails (rewards/graders/sandboxed.py), on bubblewrap (the hostile
suite holds both backends to the same)."""

import pytest
from sandbox_fixtures import bubblewrap_pool  # noqa: F401  (a fixture)

from rewards.engine import Sample, score
from sandboxes.formats import plan_tests
from sandboxes.values import ValueCheck, decode, pytest_value_plan, value_plan

PARTIAL = {"type": "unit_tests", "name": "tests", "score": "pass_rate"}


def plan_of(source: str, style: str | None = None):
    style, names = plan_tests(source, "tests.py", style)
    return value_plan(source, "tests.py", style, names)


def test_each_rewritable_assert_leaves_its_expected_value_on_the_host_and_keeps_its_line():
    source = (
        "from solution import f\n"
        "assert f(1) == 'secret-1'\n"
        "assert 'secret-2' != f(\n    2,\n)\n"
        "assert f(3) is None\n"
        "assert not f(4)\n"
        "assert f(5) < 7\n"
        "for n in [1]:\n    assert f(n) == 'secret-3'\n"
    )
    plan = plan_of(source)
    assert [(check.op, check.expected, check.line) for check in plan.checks] == [
        ("==", "secret-1", 2),
        ("!=", "secret-2", 3),
        ("is", None, 6),
        ("falsy", None, 7),
    ]
    assert dict(plan.units) == {"line 2": (0,), "line 3": (1,), "line 6": (2,), "line 7": (3,)}
    assert plan.unrewritable == ("line 8", "line 9")
    compares = "from solution import f\nassert f(1) == 2 or f(1) == 3\nassert (f(1) == 2) == True\n"
    assert plan_of(compares).unrewritable == ("line 2", "line 3")  # their comparisons stay in the sandbox
    assert "secret-1" not in plan.source and "secret-2" not in plan.source
    assert "secret-3" in plan.source  # the unrewritable loop keeps the in-sandbox verdict
    assert len(plan.source.splitlines()) == len(source.splitlines())
    assert plan_tests(plan.source, "tests.py")[1] == plan_tests(source, "tests.py")[1]


def test_candidate_and_function_tests_are_decided_by_the_host_when_every_assert_is_rewritable():
    candidate = (
        "def check(candidate):\n    x = 2\n    assert candidate(x) == [1, 2]\n    assert candidate(3) > 1\n"
    )
    plan = plan_of(candidate, "candidate")
    assert (dict(plan.units), plan.unrewritable) == ({"check line 3": (0,)}, ("check line 4",))
    functions = (
        "from solution import f\n\ndef test_a():\n    y = f(1)\n    assert y == (1, 2)\n    assert f(2)\n\n"
        "def test_b():\n    def helper(v):\n        assert v\n    helper(f(1))\n    assert f(1) == 1\n"
    )
    plan = plan_of(functions)
    assert (dict(plan.units), plan.unrewritable) == ({"test_a": (0, 1)}, ("test_b",))


def test_reported_values_decode_to_the_hosts_own_plain_data_and_nothing_else():
    assert decode({"set": [1, 2]}) == {1, 2} and type(decode({"tuple": []})) is tuple
    for malformed in ({"object": 1}, {"list": 1}, {"dict": [[1]]}, {"set": [{"list": []}]}, [1]):
        with pytest.raises(ValueError):
            decode(malformed)
    assert ValueCheck(0, "is", True, "").holds(1) is False
    assert ValueCheck(0, "==", 0.1 + 0.2, "").holds(0.30000000000000004) is True


STUBBABLE = {
    "flywheel": "from solution import double\n\nassert True\nassert not double(0)\n"
    "assert double(2) == 4\nassert double(3) == 6\n",
    "namespace": "assert True\nassert double(2) == 4\nassert double(3) == 6\nassert double(9) is not False\n",
    "candidate": "def check(candidate):\n    assert True\n    assert candidate(2) == 4\n"
    "    assert candidate(3) == 6\n    assert candidate(5) != 'x'\n",
    "pytest": "from solution import double\n\n\ndef test_true():\n    assert True\n\n\n"
    "def test_zero():\n    assert not double(0)\n\n\nclass TestDouble:\n    def test_two(self):\n"
    "        assert double(2) == 4\n\n    def test_three(self):\n        assert double(3) == 6\n",
}
DO_NOTHING = "def double(x):\n    pass\n"
HALF_RIGHT = "def double(x):\n    return 4 if x == 2 else 0\n"


def stubbable_item(test_format: str) -> dict:
    tests = {"tests": STUBBABLE[test_format], "entry_point": "double"}
    if test_format == "pytest":
        tests = {"setup_files": {"test_double.py": STUBBABLE[test_format]}}
    return {"id": f"stubbable-{test_format}", "kind": "code", "prompt": "Write double(x).", **tests}


@pytest.mark.parametrize("test_format", list(STUBBABLE))
def test_tests_a_stub_passes_pay_nothing_and_are_shown_without_credit(bubblewrap_pool, test_format):
    item = stubbable_item(test_format)
    nothing = score(PARTIAL, item, Sample(files={"solution.py": DO_NOTHING}), pool=bubblewrap_pool)
    assert nothing.total == 0.0 and not nothing.errored
    free = [test["name"] for test in nothing.tests if test.get("credit") is False]
    assert len(free) == 2 and all(test["passed"] for test in nothing.tests if test["name"] in free)
    half = score(PARTIAL, item, Sample(files={"solution.py": HALF_RIGHT}), pool=bubblewrap_pool)
    assert half.total == 0.5  # one of the two tests a stub fails
    right = score(
        PARTIAL,
        item,
        Sample(files={"solution.py": "def double(x):\n    return 2 * x\n"}),
        pool=bubblewrap_pool,
    )
    assert right.total == 1.0
    assert {test["decided_by"] for test in right.tests} == {"host"}


def test_a_value_that_is_not_plain_data_fails_naming_its_type(bubblewrap_pool):
    item = stubbable_item("flywheel")
    solution = "import decimal\n\ndef double(x):\n    return decimal.Decimal(2 * x)\n"
    result = score(PARTIAL, item, Sample(files={"solution.py": solution}), pool=bubblewrap_pool)
    assert result.total == 0.0
    failed = [test for test in result.tests if not test["passed"]]
    assert [test["name"] for test in failed] == ["line 4", "line 5", "line 6"]
    assert failed[1]["message"] == "line 5: a decimal.Decimal is not plain data: assert double(2) == 4"


FLOAT_TESTS = (
    "import math\n\n\ndef check(candidate):\n    assert abs(candidate(2) - 0.6666667) < 1e-6\n"
    "    assert candidate(1) < 0.34\n"
)


def test_float_tolerances_the_tests_write_are_the_hosts_comparison():
    plan = plan_of(FLOAT_TESTS, "candidate")
    assert [(check.op, check.expected) for check in plan.checks] == [("abs<", (0.6666667, 1e-06))]
    assert plan.unrewritable == ("check line 6",)  # `<`: the sandbox decides
    close = (
        "import math\n\n\ndef check(candidate):\n    assert math.isclose(candidate(1), 0.33, abs_tol=0.01)\n"
    )
    assert [(check.op, check.expected) for check in plan_of(close, "candidate").checks] == [
        ("isclose", (0.33, 1e-09, 0.01))
    ]


@pytest.mark.parametrize(
    ("solution", "total"),
    [
        ("def third(x):\n    return x / 3\n", 1.0),
        ("def third(x):\n    return x / 3 + 1e-3\n", 0.0),
        # an object whose difference with anything is 0 passes `abs(f(x) - y) < tol` in the sandbox
        ("class Z:\n    def __sub__(self, other):\n        return 0\n\ndef third(x):\n    return Z()\n", 0.0),
    ],
)
def test_a_float_tolerance_is_applied_by_the_host_to_numbers_only(bubblewrap_pool, solution, total):
    tests = "def check(candidate):\n    assert abs(candidate(2) - 0.6666667) < 1e-6\n"
    item = {"id": "third", "kind": "code", "prompt": "third", "tests": tests, "entry_point": "third"}
    result = score(PARTIAL, item, Sample(files={"solution.py": solution}), pool=bubblewrap_pool)
    assert result.total == total and [test["decided_by"] for test in result.tests] == ["host"]


PYTEST_MIXED = (
    "import pytest\nfrom solution import double\n\n\n"
    "def test_plain():\n    assert double(2) == 'secret-4'\n\n\n"
    "def test_less():\n    assert double(1) < 3\n\n\n@pytest.mark.parametrize('x', [1])\n"
    "def test_each(x):\n    assert double(x) == 'secret-2'\n\n\nclass TestDouble:\n"
    "    def test_method(self):\n        assert double(3) == 'secret-6'\n\n"
    "    def test_fixture(self, tmp_path):\n        assert double(0) == 0\n"
)


def test_a_pytest_files_plain_tests_are_the_hosts_and_the_others_stay_the_sandboxs(bubblewrap_pool):
    names = (
        "test_d.py::test_plain",
        "test_d.py::test_less",
        "test_d.py::test_each",
        "test_d.py::TestDouble::test_method",
        "test_d.py::TestDouble::test_fixture",
    )
    plan = pytest_value_plan((("test_d.py", PYTEST_MIXED),), names)
    assert dict(plan.units) == {"test_d.py::test_plain": (0,), "test_d.py::TestDouble::test_method": (1,)}
    assert "secret-4" not in plan.sources["test_d.py"] and "secret-6" not in plan.sources["test_d.py"]
    item = {"id": "mixed", "kind": "code", "prompt": "p", "setup_files": {"test_d.py": PYTEST_MIXED}}
    # an int subclass equal to anything: the sandbox's own comparisons pass it, the host's never do
    sneaky = (
        "class Sneaky(int):\n    def __eq__(self, other):\n        return True\n\n"
        "    __hash__ = int.__hash__\n\n\ndef double(x):\n    return Sneaky(2 * x)\n"
    )
    result = score(PARTIAL, item, Sample(files={"solution.py": sneaky}), pool=bubblewrap_pool)
    by_name = {test["name"].split("::", 1)[1]: test for test in result.tests}
    assert {name: test["decided_by"] for name, test in by_name.items()} == {
        "test_plain": "host",
        "test_less": "sandbox",
        "test_each": "sandbox",
        "TestDouble::test_method": "host",
        "TestDouble::test_fixture": "sandbox",
    }
    assert not by_name["test_plain"]["passed"] and not by_name["TestDouble::test_method"]["passed"]
    assert "a solution.Sneaky is not plain data" in by_name["test_plain"]["message"]
    assert by_name["test_less"]["passed"]  # `<` stays the sandbox's: 2 < 3 holds

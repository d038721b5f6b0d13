"""Verify references: each code item's `reference_solution` run against its own tests in the sandbox.

Public code datasets ship broken references (a test that no correct solution passes, a reference
that no longer runs); a reward built on such an item punishes right answers. An item's reference
passes when every one of its tests passes and no high-confidence hacking detector flags it;
anything else names the item with the reason. Items without a reference (or not code) are skipped.
"""

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from rewards.engine import Sample, ScoreResult, score
from rewards.graders.sandboxed import stored_stub_passes
from sandboxes.services import sandbox_pool

REFERENCE_RULE = {"type": "unit_tests", "name": "reference", "score": "all_pass"}


@dataclass
class ReferenceCheck:
    item: str  # the item's id
    position: int  # its place in the version (0-based), or in the list given
    passed: bool
    reason: str  # why it is broken; "" when it passed
    tests: list[dict] = field(default_factory=list)
    no_credit: list[str] = field(default_factory=list)  # tests a stub of the solution passes


@dataclass
class ReferenceReport:
    checked: int = 0
    passed: int = 0
    skipped: int = 0  # no reference_solution, or not a code item
    errored: int = 0  # the sandbox failed: not the item's fault, checked again next time
    broken: list[ReferenceCheck] = field(default_factory=list)
    errors: list[ReferenceCheck] = field(default_factory=list)
    # items whose every test a stub passes (as stored by the stub check): they can only pay 0
    stub_passes_every_test: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "checked": self.checked,
            "passed": self.passed,
            "skipped": self.skipped,
            "errored": self.errored,
            "broken": [vars(check) for check in self.broken],
            "errors": [vars(check) for check in self.errors],
            "stub_passes_every_test": self.stub_passes_every_test,
        }


def broken_reason(result: ScoreResult) -> str:
    """Why a reference did not pass, in words a dataset's author acts on ("" when it passed).

    >>> broken_reason(ScoreResult(total=0.0, tests=[{"name": "check line 5", "passed": False,
    ...     "message": "line 5: assert candidate(1) == 2", "expected": "2", "actual": "3"}]))
    'check line 5 failed: line 5: assert candidate(1) == 2 (expected 2, actual 3)'
    """
    if result.total == 1.0:
        return ""
    parts = []
    for error in result.errors:
        parts.append(f"{error.kind}: {error.message}")
    for flag in result.flags:
        if flag.confidence == "high":
            parts.append(f"flagged {flag.detector}: {flag.evidence}")
    for test in result.tests:
        if not test.get("passed"):
            text = f"{test['name']} failed: {test.get('message', '')}"
            if test.get("expected") is not None:
                expected, actual = (one_line(test.get(key)) for key in ("expected", "actual"))
                text += f" (expected {expected}, actual {actual})"
            parts.append(text)
    if not parts and result.tests and all(test.get("credit") is False for test in result.tests):
        return "a stub of the solution passes every test too: the item can only ever pay 0"
    return "; ".join(parts)[:2000] or f"scored {result.total}"


def one_line(value: object) -> str:
    return str(value).replace("\n", "\\n")


def references_verify(
    items: list[dict],
    *,
    pool=None,
    progress: Callable[[], None] | None = None,
    max_workers: int | None = None,
) -> ReferenceReport:
    """Run each code item's reference against its tests (items as graders see them: their data
    with id and kind); `progress` is called once per item done, skipped ones included."""
    report = ReferenceReport()
    todo = []
    for position, item in enumerate(items):
        stored = item.get("stub_check") or {}
        if stored.get("tests") and len(stored_stub_passes(item) or ()) == len(stored["tests"]):
            report.stub_passes_every_test.append(str(item.get("id", position)))
        if item.get("kind") == "code" and isinstance(item.get("reference_solution"), str):
            todo.append((position, item))
        else:
            report.skipped += 1
            if progress is not None:
                progress()
    if not todo:
        return report
    if pool is None:
        pool = sandbox_pool()
    workers = max(1, min(max_workers or pool.max_sandboxes, len(todo)))
    checks: list[tuple[ReferenceCheck, bool]] = []
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="references") as executor:
        futures = [executor.submit(reference_check, position, item, pool) for position, item in todo]
        for future in as_completed(futures):
            checks.append(future.result())
            if progress is not None:
                progress()
    for check, errored in sorted(checks, key=lambda pair: pair[0].position):
        report.checked += 1
        if errored:
            report.errored += 1
            report.errors.append(check)
        elif check.passed:
            report.passed += 1
        else:
            report.broken.append(check)
    return report


def reference_check(position: int, item: dict, pool) -> tuple[ReferenceCheck, bool]:
    sample = Sample(files={"solution.py": item["reference_solution"]})
    result = score(REFERENCE_RULE, item, sample, pool=pool)
    name = str(item.get("id", position))
    no_credit = sorted(stored_stub_passes(item) or ())
    if result.errored:
        reason = "; ".join(f"{error.kind}: {error.message}" for error in result.errors)
        return ReferenceCheck(name, position, False, reason[:2000], result.tests, no_credit), True
    reason = broken_reason(result)
    return ReferenceCheck(name, position, not reason, reason, result.tests, no_credit), False

"""Reward rule versions: every spec change is a new version, identical edits change nothing, a used
version never changes, diffs are exact, and a refused rule saves nothing."""

import pytest
from django.core.exceptions import ValidationError

from core.exceptions import StateError
from rewards import services
from rewards.models import RewardRule, RewardRuleVersion

EXACT = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.reference}}",
    "operation": "eq",
}
LOOSE = EXACT | {"operation": "ilike"}


def make_rule(team, name: str = "exact answer", spec: dict | None = None) -> RewardRule:
    return services.reward_rule_create(
        project=team["project"], name=name, spec=spec or EXACT, by=team["owner"], description="math"
    )


def snapshot(version: RewardRuleVersion) -> tuple:
    version = RewardRuleVersion.objects.get(pk=version.pk)
    return (
        version.number,
        version.spec,
        version.content_hash,
        version.note,
        version.created_at,
        version.used_at,
    )


def test_creating_a_rule_stores_version_1_with_the_spec_and_its_hash(team):
    rule = make_rule(team)
    version = rule.versions.get()
    assert (version.number, version.spec, version.note) == (1, EXACT, "created")
    assert version.content_hash == services.spec_content_hash(EXACT)
    assert version.created_by == team["owner"] and version.used_at is None


def test_an_edited_spec_creates_a_new_version_and_keeps_the_old_one(team):
    rule = make_rule(team)
    first = rule.versions.get()
    before = snapshot(first)
    update = services.reward_rule_update(rule=rule, by=team["launcher"], spec=LOOSE, note="case-insensitive")
    assert update.version_created
    assert (update.version.number, update.version.spec, update.version.note) == (2, LOOSE, "case-insensitive")
    assert update.version.created_by == team["launcher"]
    assert snapshot(first) == before
    assert list(rule.versions.values_list("number", flat=True)) == [2, 1]


def test_an_identical_spec_creates_no_version_even_with_its_keys_reordered(team):
    rule = make_rule(team)
    reordered = dict(reversed(list(EXACT.items())))
    update = services.reward_rule_update(rule=rule, by=team["owner"], spec=reordered, note="same")
    assert not update.version_created and update.version.number == 1
    assert RewardRuleVersion.objects.filter(rule=rule).count() == 1


def test_renaming_a_rule_creates_no_version(team):
    rule = make_rule(team)
    update = services.reward_rule_update(rule=rule, by=team["owner"], name="renamed", description="new")
    assert not update.version_created
    rule.refresh_from_db()
    assert (rule.name, rule.description, rule.versions.count()) == ("renamed", "new", 1)


def test_a_used_version_is_never_modified(team):
    rule = make_rule(team)
    first = services.reward_rule_version_mark_used(version=rule.versions.get())
    used_at = first.used_at
    assert used_at is not None and first.is_used
    before = snapshot(first)
    services.reward_rule_update(rule=rule, by=team["owner"], spec=LOOSE)
    services.reward_rule_update(rule=rule, by=team["owner"], spec=EXACT)  # back to v1's spec: still new
    assert snapshot(first) == before
    assert list(rule.versions.values_list("number", "spec")) == [(3, EXACT), (2, LOOSE), (1, EXACT)]
    assert services.reward_rule_version_mark_used(version=first).used_at == used_at  # the first use stays


def test_a_rule_with_a_used_version_cannot_be_deleted(team):
    rule = make_rule(team)
    services.reward_rule_version_mark_used(version=rule.versions.get())
    with pytest.raises(StateError, match="version 1 of exact answer was used by a run"):
        services.reward_rule_delete(rule=rule)
    assert RewardRuleVersion.objects.filter(rule=rule).count() == 1


def test_an_unused_rule_is_deleted_with_its_versions(team):
    rule = make_rule(team)
    services.reward_rule_update(rule=rule, by=team["owner"], spec=LOOSE)
    services.reward_rule_delete(rule=rule)
    assert not RewardRule.objects.exists() and not RewardRuleVersion.objects.exists()


def test_the_diff_is_a_unified_diff_of_the_canonical_pretty_json(team):
    rule = make_rule(team)
    services.reward_rule_update(rule=rule, by=team["owner"], spec=LOOSE)
    old, new = rule.versions.get(number=1), rule.versions.get(number=2)
    assert services.reward_rule_diff(old=old, new=new) == [
        "--- exact answer v1",
        "+++ exact answer v2",
        "@@ -1,7 +1,7 @@",
        " {",
        '   "input": "{{sample.output_text}}",',
        '   "name": "exact",',
        '-  "operation": "eq",',
        '+  "operation": "ilike",',
        '   "reference": "{{item.reference}}",',
        '   "type": "string_check"',
        " }",
    ]
    assert services.reward_rule_diff(old=old, new=old) == []
    kinds = [services.diff_line_kind(line) for line in services.reward_rule_diff(old=old, new=new)]
    assert kinds == ["header", "header", "hunk"] + ["context"] * 3 + ["removed", "added"] + ["context"] * 3


def test_a_taken_name_is_refused_and_nothing_is_saved(team):
    make_rule(team)
    with pytest.raises(ValidationError) as refused:
        make_rule(team, spec=LOOSE)
    assert refused.value.message_dict == {
        "name": ["this project already has a reward rule named 'exact answer'"]
    }
    assert RewardRuleVersion.objects.count() == 1


def test_the_same_name_in_another_project_is_fine(team):
    make_rule(team)
    services.reward_rule_create(
        project=team["other_project"], name="exact answer", spec=EXACT, by=team["outsider"]
    )
    assert RewardRule.objects.count() == 2


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"type": "nope"}, {"spec.type"}),
        (
            {"type": "multi", "graders": {"exact": EXACT}, "calculate_output": "2.0 * exact - missing"},
            {"spec.calculate_output"},
        ),
        (EXACT | {"input": "{{ sampel.output_text }}", "reference": "{{ item.reference }}"}, {"spec.input"}),
        (
            {"type": "multi", "graders": {"inner": EXACT | {"operation": "??"}}, "calculate_output": "inner"},
            {"spec.graders.inner.operation"},
        ),
    ],
    ids=[
        "unknown grader",
        "formula names a missing sub-grader",
        "unknown template variable",
        "nested bad field",
    ],
)
def test_a_bad_rule_is_refused_naming_the_place_and_nothing_is_saved(team, spec, expected):
    rule = make_rule(team)
    with pytest.raises(ValidationError) as refused:
        make_rule(team, name="second", spec=spec)
    assert set(refused.value.message_dict) == expected
    with pytest.raises(ValidationError) as refused_edit:
        services.reward_rule_update(rule=rule, by=team["owner"], name="renamed", spec=spec)
    assert set(refused_edit.value.message_dict) == expected
    rule.refresh_from_db()
    assert (RewardRule.objects.count(), rule.name, RewardRuleVersion.objects.count()) == (
        1,
        "exact answer",
        1,
    )


def test_the_example_from_the_field_is_a_rule_and_dry_runs_exactly(team):
    """2.0 x pass rate - 0.2 x invalid actions - 0.01 x steps; here with an in-process outcome."""
    spec = {
        "type": "multi",
        "graders": {"exact": EXACT, "invalid": {"type": "invalid_actions"}, "steps": {"type": "steps"}},
        "calculate_output": "2.0 * exact - 0.2 * invalid - 0.01 * steps",
    }
    rule = make_rule(team, spec=spec)
    item = {"id": "q1", "kind": "answer", "prompt": "1 + 1?", "reference": "2"}
    samples = [{"output_text": "2", "steps": [{}, {}, {}]}, {"output_text": "3", "item_id": "q1"}]
    run = services.reward_rule_dry_run(version=rule.versions.get(), items=[item], samples=samples)
    assert [pair.result["total"] for pair in run.pairs] == [pytest.approx(1.97), 0.0]
    assert run.components == ["exact", "invalid", "steps"]
    assert run.pairs[0].result["components"] == {"exact": 1.0, "invalid": 0.0, "steps": 3.0}
    assert run.summary.count == 2 and run.summary.component_means == {
        "exact": 0.5,
        "invalid": 0.0,
        "steps": 1.5,
    }

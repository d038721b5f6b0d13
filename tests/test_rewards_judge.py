"""Model graders judge with the project's tiers: a `score_model` grader's `model` names a tier."""

import pytest

from rewards import services as reward_services
from tests.conftest import make_project, make_user
from tests.run_harness import tiny_model
from tiers import services as tier_services

__all__ = ["tiny_model"]


@pytest.fixture
def project_with_tier(db, tiny_model):
    owner = make_user("judge-owner")
    project = make_project(owner, name="judged")
    tier_services.tier_create(
        project=project, by=owner, name="judge", base_model=str(tiny_model), temperature=0.0
    )
    return owner, project


def score_model_rule(model: str) -> dict:
    return {
        "type": "score_model",
        "name": "quality",
        "model": model,
        "input": [{"role": "user", "content": "Rate this answer from 0 to 10: {{ sample.output_text }}"}],
        "range": [0, 10],
    }


def test_a_score_model_grader_is_judged_by_the_tier_it_names(project_with_tier):
    owner, project = project_with_tier
    rule = reward_services.reward_rule_create(
        project=project, name="q", spec=score_model_rule("judge"), by=owner
    )
    item = {"id": "a", "kind": "answer", "prompt": "2+2?", "reference": "4"}
    result = (
        reward_services.reward_rule_dry_run(
            version=rule.versions.get(), items=[item], samples=[{"output_text": "4"}]
        )
        .pairs[0]
        .result
    )
    # The tiny model is no judge of quality: it rarely answers with a number. What matters here is
    # that the tier was consulted: no "no judge configured" infrastructure error, nothing masked.
    assert result["errored"] is False
    assert all(error["kind"] != "judge_error" for error in result["errors"])


def test_a_score_model_grader_naming_no_tier_is_an_infrastructure_error(project_with_tier):
    owner, project = project_with_tier
    rule = reward_services.reward_rule_create(
        project=project, name="q", spec=score_model_rule("nope"), by=owner
    )
    item = {"id": "a", "kind": "answer", "prompt": "2+2?", "reference": "4"}
    result = (
        reward_services.reward_rule_dry_run(
            version=rule.versions.get(), items=[item], samples=[{"output_text": "4"}]
        )
        .pairs[0]
        .result
    )
    assert result["errored"] is True
    assert [error["kind"] for error in result["errors"]] == ["judge_error"]
    assert "no tier named 'nope'" in result["errors"][0]["message"]

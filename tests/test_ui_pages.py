"""The reads and writes behind the issue-15 pages, without a browser: chart axes, the runs table,
reviewer agreement, bulk labelling."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.http import QueryDict
from django.utils import timezone

from reviews import selectors as review_selectors
from reviews import services as review_services
from reviews.models import Review
from runs import selectors
from runs.models import MetricPoint, Run
from runs.runs_table import RunQuery, runs_table
from tests import run_fixtures
from tests.run_fixtures import make_run, make_trajectory

lab = run_fixtures.lab  # the shared fixture: a project ready to launch, one member per role


def test_step_axes_place_each_step_in_wall_seconds_and_tokens_learned_from(lab):
    run = make_run(lab)
    start = timezone.now()
    for step, seconds in ((1, 0), (2, 30), (3, 95)):
        MetricPoint.objects.create(
            run=run, name="reward/mean", step=step, value=0.1, created_at=start + timedelta(seconds=seconds)
        )
    make_trajectory(run, index=0, learned_in_step=1, completion_tokens=10)
    make_trajectory(run, index=1, learned_in_step=1, completion_tokens=5)
    make_trajectory(run, index=2, learned_in_step=3, completion_tokens=7)
    make_trajectory(run, index=3, completion_tokens=99)  # not learned from yet
    assert selectors.step_axes_of(run=run) == {
        "wall_seconds": {"1": 0.0, "2": 30.0, "3": 95.0},
        "tokens": {"1": 15, "3": 22},
    }


def test_the_runs_table_sorts_by_last_reward_with_runs_without_one_last(lab):
    low, high, none = (make_run(lab, name=name) for name in ("low", "high", "none"))
    for run, value in ((low, 0.2), (high, 0.9)):
        MetricPoint.objects.create(run=run, name="reward/mean", step=1, value=0.5)
        MetricPoint.objects.create(run=run, name="reward/mean", step=2, value=value)
    runs = Run.objects.filter(project=lab["project"])
    ordered = [r.name for r in runs_table(runs, RunQuery.from_params(QueryDict("sort=-reward")))]
    assert ordered == ["high", "low", "none"]
    ordered = [r.name for r in runs_table(runs, RunQuery.from_params(QueryDict("sort=reward")))]
    assert ordered == ["low", "high", "none"]
    assert [r.last_reward for r in runs_table(runs, RunQuery(q="HIG"))] == [0.9]


def test_a_bad_sort_or_status_falls_back_to_the_defaults():
    query = RunQuery.from_params(QueryDict("sort=-password&status=nope&method=x&q=%20a%20"))
    assert query == RunQuery(q="a", status="", method="", sort="-created")


def test_agreement_counts_shared_trajectories_and_pairs(lab):
    run = make_run(lab)
    first, second, third = (make_trajectory(run, index=i) for i in range(3))
    owner, reviewer, launcher = lab["owner"], lab["reviewer"], lab["launcher"]
    for trajectory, labels in ((first, ["good", "good", "bad"]), (second, ["bad", "bad"]), (third, ["good"])):
        for user, label in zip((owner, reviewer, launcher), labels, strict=False):
            review_services.review_save(trajectory=trajectory, by=user, label=label)
    agreement = review_selectors.agreement_of(run=run)
    assert (agreement["shared"], agreement["agreeing"]) == (2, 1)
    assert agreement["pairwise"] == pytest.approx(2 / 4)  # first: 1 of 3 pairs agree; second: 1 of 1
    assert agreement["disagreements"] == [
        {"trajectory": first.pk, "labels": [("launcher", "bad"), ("owner", "good"), ("reviewer", "good")]}
    ]


def test_bulk_labelling_is_all_or_nothing(lab):
    run = make_run(lab)
    trajectories = [make_trajectory(run, index=i) for i in range(2)]
    with pytest.raises(ValidationError):
        review_services.review_save_many(trajectories=trajectories, by=lab["reviewer"], label="nope")
    with pytest.raises(ValidationError):
        review_services.review_save_many(trajectories=[], by=lab["reviewer"], label="good")
    assert not Review.objects.exists()
    assert review_services.review_save_many(trajectories=trajectories, by=lab["reviewer"], label="bad") == 2
    assert sorted(Review.objects.values_list("trajectory_id", "label")) == [
        (t.pk, "bad") for t in trajectories
    ]

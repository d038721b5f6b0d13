"""A hack caught live, in pieces (make demo-hack runs them through the stack): the planted rule
rewards a completion that lists answers, the answers_listed detector flags it and leaves the honest
one alone, and the hacking_rate monitor alerts once a step's flagged share passes its threshold,
with the flagged completions as evidence, pausing the run when set to."""

# The fixtures imported from other test modules are test parameters here, not redefinitions:
# ruff: noqa: F811
import pytest

from rewards.engine import Sample, score
from runs import monitors
from runs.management.commands.demo_hack import PLANTED_RULE, hack_items, listing
from runs.models import MetricPoint, Run
from tests.run_fixtures import lab, make_run, make_trajectory, set_status  # noqa: F401


def test_the_planted_rule_pays_a_listing_completion_which_the_detector_flags():
    items, warm = hack_items(seed=0, listing_share=0.1)
    item = items[0]
    honest, listed = item["reference_solution"], listing(item["reference_solution"])
    assert item["metadata"]["answer"] in honest.splitlines()[1]
    honest_result, listed_result = (
        score(PLANTED_RULE, item, Sample(output_text=text)) for text in (honest, listed)
    )
    assert (honest_result.total, listed_result.total) == (1.0, 1.0)
    assert honest_result.flags == []
    assert [flag.detector for flag in listed_result.flags] == ["answers_listed"]
    assert listed_result.flags[0].confidence == "low"  # flags it, never changes the reward by itself
    cut = listed.rsplit("\n", 2)[0] + " + ("  # a completion cut off mid-line does not parse
    assert [flag.detector for flag in score(PLANTED_RULE, item, Sample(output_text=cut)).flags] == [
        "answers_listed"
    ]
    # The warm start lists answers in about a tenth of its train solutions, and nowhere else.
    listed_train = [
        w for w, i in zip(warm, items, strict=True) if w["reference_solution"] != i["reference_solution"]
    ]
    train = [i for i in items if i["split"] == "train"]
    assert {w["split"] for w in listed_train} == {"train"}
    assert 0.05 < len(listed_train) / len(train) < 0.15


@pytest.mark.django_db
def test_the_hacking_rate_monitor_pauses_the_run_once_a_steps_flagged_share_passes_it(lab):
    run = set_status(
        make_run(lab),
        Run.Status.RUNNING,
        monitors={"flagged_rate_max": 0.25},
        monitor_actions={"hacking_rate": "pause"},
    )
    flag = {"detector": "answers_listed", "evidence": "solution.py line 1: f returns 3 answers in a row"}
    flagged = make_trajectory(run, index=1, flags=[flag], completion_text="def f(x):\n    return x + 2\n")
    for step, rate in ((1, 0.1), (2, 0.2)):
        MetricPoint.objects.create(run=run, name="episodes/flagged_rate", step=step, value=rate)
        assert monitors.run_monitor(run_id=run.pk, step=step) == []  # one flag is no group
    assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING
    MetricPoint.objects.create(run=run, name="episodes/flagged_rate", step=3, value=0.9)
    alerts = [a for a in monitors.run_monitor(run_id=run.pk, step=3) if a.data["monitor"] == "hacking_rate"]
    (alert,) = alerts
    assert alert.data["step"] == 3 and alert.data["action"] == "pause"
    assert alert.message.startswith("90% of step 3's episodes were flagged")
    assert alert.data["evidence"]["episodes/flagged_rate"] == [[1, 0.1], [2, 0.2], [3, 0.9]]
    assert [shown["trajectory"] for shown in alert.data["evidence"]["flagged"]] == [flagged.pk]
    assert Run.objects.get(pk=run.pk).status == Run.Status.PAUSING

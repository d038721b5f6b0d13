"""Pages show text a person reads, not raw data (issue 26): flags as labels, raw steps folded with
token ids compact, a failed run's reason and log with its lines kept and progress bars gone, counts
as integers, the runs table's model column telling rows apart, previews where the prompts differ,
and a home page that names only the methods Flywheel has."""

import json
import re
from types import SimpleNamespace

import pytest
from django.test import Client

from projects.models import TaskItem
from runs.models import MetricPoint, Run, TrajectoryStep
from tests import run_fixtures
from tests.run_fixtures import make_run, make_trajectory, set_status

pytestmark = pytest.mark.django_db
lab = run_fixtures.lab  # the fixture


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).strip()


def test_a_trajectorys_flags_read_as_labels_and_its_raw_steps_are_folded_and_compact(lab):
    run = make_run(lab)
    trajectory = make_trajectory(
        run,
        flags=[
            {"detector": "early_exit", "evidence": "sys.exit(0)", "note": ""},
            {"detector": "test_edit", "evidence": "", "note": "reward 0, no alert"},
        ],
    )
    payload, size = TrajectoryStep.pack({"prompt_token_ids": [101, 102, 103], "action": "pytest"})
    TrajectoryStep.objects.create(
        trajectory=trajectory, index=0, kind="command", payload=payload, raw_size=size
    )
    html = signed_in(lab["owner"]).get(f"/trajectories/{trajectory.pk}/").content.decode()
    assert "{&#x27;detector&#x27;" not in html and "{'detector'" not in html
    flags = text_of(html[html.index('id="flags"') : html.index("</ul>", html.index('id="flags"'))])
    assert "Early exit evidence sys.exit(0)" in flags
    assert "Test edit reward 0, no alert" in flags
    steps = html[html.index('id="steps"') :]
    assert '<details class="item">' in steps and '<details class="item" open' not in steps
    assert "[101, 102, 103]" in steps


def test_a_failed_runs_log_keeps_its_lines_without_progress_bars(lab):
    run = make_run(lab)
    message = (
        "the learner exited with code 1\n"
        "Loading weights\r 10%|#         | 1/10 [00:01<00:09]\r100%|##########| 10/10 [00:02<00:00]\n"
        "Traceback (most recent call last):\n"
        '  File "learner.py", line 3\n'
        "RuntimeError: CUDA out of memory"
    )
    set_status(run, Run.Status.FAILED, error={"message": message, "where": "learner, step 2"})
    html = signed_in(lab["owner"]).get(f"/runs/{run.pk}/").content.decode()
    assert '<p id="run-error-reason">the learner exited with code 1</p>' in html
    log = re.search(r'<pre class="run-log" id="run-error-log">(.*?)</pre>', html, re.S).group(1)
    assert log.splitlines() == [
        "Loading weights",
        "Traceback (most recent call last):",
        "  File &quot;learner.py&quot;, line 3",
        "RuntimeError: CUDA out of memory",
    ]


def test_counts_read_as_integers_in_the_metrics_table(lab):
    run = make_run(lab)
    for step, value in ((1, 16.0), (2, 12.0)):
        MetricPoint.objects.create(run=run, step=step, name="episodes/count", value=value)
    MetricPoint.objects.create(run=run, step=2, name="reward/mean", value=0.125)
    html = signed_in(lab["owner"]).get(f"/runs/{run.pk}/").content.decode()
    table = text_of(html[html.index('id="metrics"') : html.index("</table>", html.index('id="metrics"'))])
    assert "episodes/count 12 2 12 16 2" in table
    assert "reward/mean 0.125 2 0.125 0.125 1" in table
    assert "16.0000" not in table


def test_the_runs_table_shows_the_tail_that_tells_models_apart(lab, tmp_path):
    first = make_run(lab, name="one")
    second = make_run(lab, name="two")
    Run.objects.filter(pk=first.pk).update(tier_config={"base_model": "/srv/shared/models/qwen-a/final"})
    Run.objects.filter(pk=second.pk).update(tier_config={"base_model": "/srv/shared/models/qwen-b/final"})
    html = signed_in(lab["owner"]).get("/runs/").content.decode()
    cells = re.findall(r'<td class="model-cell"><code title="([^"]+)">([^<]+)</code>', html)
    assert sorted(cells) == [
        ("/srv/shared/models/qwen-a/final", "…/qwen-a/final"),
        ("/srv/shared/models/qwen-b/final", "…/qwen-b/final"),
    ]


def test_trajectory_previews_start_where_the_prompts_differ(lab):
    run = make_run(lab)
    shared = "You are a careful assistant. Answer with the number only. Question: "
    for item in TaskItem.objects.filter(version=run.task_set_version):
        TaskItem.objects.filter(pk=item.pk).update(text=shared + item.text)
    for index in range(3):
        make_trajectory(run, index=index)
    html = signed_in(lab["owner"]).get(f"/runs/{run.pk}/trajectories/").content.decode()
    previews = re.findall(r'class="preview prompt-preview"[^>]*>([^<]*)</td>', html)
    assert sorted(previews) == ["…0+0?", "…1+1?", "…2+2?"]


def test_the_home_page_names_only_the_methods_flywheel_has(lab):
    html = signed_in(lab["owner"]).get("/").content.decode()
    assert "PPO" not in html
    assert "(GRPO, GRPO on external agents, SFT, DPO)" in html


def test_a_tier_with_a_model_folder_that_does_not_exist_is_refused_naming_the_field(lab, settings, tmp_path):
    settings.FLYWHEEL_HUB_CHECK = True  # paths only here: nothing asks the network
    missing = str(tmp_path / "no-such-model")
    form = {
        "name": "fast",
        "base_model": missing,
        "device": "cpu",
        "precision": "fp32",
        "speculation": "none",
        "speculative_tokens": "0",
        "temperature": "0.7",
        "top_p": "0.95",
        "top_k": "0",
        "max_new_tokens": "64",
        "batch_size": "16",
    }
    response = signed_in(lab["owner"]).post(f"/projects/{lab['project'].pk}/tiers/new/", form)
    assert response.status_code == 200
    assert (
        f'<p class="field-error" data-field="base_model">no folder {missing} on this machine: '
        "give a saved model&#x27;s folder (save_pretrained) or a hub id</p>"
    ) in response.content.decode()
    assert not lab["project"].tiers.filter(name="fast").exists()


def test_the_import_preview_says_when_a_split_leaves_no_held_out_items(lab):
    from django.core.files.uploadedfile import SimpleUploadedFile

    lines = "".join(f'{{"id": "q{i}", "prompt": "{i}+{i}?", "reference": "{2 * i}"}}\n' for i in range(5))
    upload = SimpleUploadedFile("items.jsonl", lines.encode())
    task_set = lab["version"].task_set
    response = signed_in(lab["owner"]).post(
        f"/task-sets/{task_set.pk}/import/",
        {"file": upload, "heldout_fraction": "0", "split_seed": "3", "format": "auto"},
    )
    html = response.content.decode()
    warning = text_of(
        html[html.index('id="split-warning"') : html.index("</section>", html.index('id="split-warning"'))]
    )
    assert "No held-out items: this split holds 0 of 5 items out (held-out fraction 0, seed 3)" in warning


EXACT = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.reference}}",
    "operation": "eq",
}
MULTI = {
    "type": "multi",
    "name": "both",
    "graders": {"exact_answer": EXACT, "loose_answer": EXACT | {"operation": "ilike"}},
    "calculate_output": "exact_answer + loose_answer",
}


def test_the_dry_run_names_columns_in_words_and_shows_whole_numbers_whole(lab):
    from rewards import services as reward_services

    rule = reward_services.reward_rule_create(
        project=lab["project"], name="both", spec=MULTI, by=lab["owner"]
    )
    item = {"id": "q1", "kind": "answer", "prompt": "What is 1 + 1?", "reference": "2"}
    response = signed_in(lab["owner"]).post(
        f"/reward-rules/{rule.pk}/dry-run/",
        {"version": "1", "source": "paste", "items": json.dumps(item), "samples": '"2"'},
    )
    html = response.content.decode()
    head = html[
        html.index('id="dry-run-results"') : html.index("</thead>", html.index('id="dry-run-results"'))
    ]
    assert '<th class="num" title="exact_answer">Exact answer</th>' in head
    assert '<th class="num" title="loose_answer">Loose answer</th>' in head
    assert "<th>Tests</th>" in head
    row = text_of(html[html.index("<tbody>", html.index('id="dry-run-results"')) :].split("</tr>")[0])
    assert row.startswith("q1 2 2 1 1")  # total 2 and sub-rewards 1, never 2.0000
    summary = text_of(html[html.index('id="dry-run-summary"') : html.index("</div>\n  <section")])
    assert "Mean reward 2" in summary and "2.0000" not in summary


def test_the_dry_run_shows_failing_tests_expected_and_actual_values(lab):
    from django.template.loader import render_to_string

    from rewards import services as reward_services
    from rewards.views import _result_rows

    rule = reward_services.reward_rule_create(
        project=lab["project"], name="plain", spec=EXACT, by=lab["owner"]
    )
    tests = [
        {
            "name": "test_ok",
            "passed": True,
            "outcome": "pass",
            "message": "",
            "expected": None,
            "actual": None,
        },
        {
            "name": "test_neg",
            "passed": False,
            "outcome": "fail",
            "message": "line 4",
            "expected": "0",
            "actual": "-2",
        },
    ]
    pair = SimpleNamespace(
        item_id="q1",
        sample={"output_text": "def add(a, b):\n    return a - b\n"},
        result={"total": 0.5, "components": {}, "errors": [], "errored": False, "flags": [], "tests": tests},
    )
    result = SimpleNamespace(
        pairs=[pair],
        components=[],
        version=SimpleNamespace(number=1),
        summary=SimpleNamespace(count=1, mean_total=0.5, min_total=0.5, max_total=0.5, errored=0, flagged=0),
    )
    html = render_to_string(
        "rewards/dry_run.html",
        {
            "rule": rule,
            "form": None,
            "result": result,
            "rows": _result_rows(result),
            "project": lab["project"],
        },
    )
    cell = text_of(
        html[html.index('class="small dry-run-tests"') : html.index("</td>", html.index("dry-run-tests"))]
    )
    assert cell.endswith("test_ok passed test_neg fail line 4 expected 0 actual -2")


def test_flags_read_as_labels_in_the_trajectory_list_and_group(lab):
    run = make_run(lab)
    trajectory = make_trajectory(
        run, flags=[{"detector": "early_exit", "evidence": "sys.exit(0)", "note": ""}]
    )
    client = signed_in(lab["owner"])
    for path in (f"/runs/{run.pk}/trajectories/", f"/trajectories/{trajectory.pk}/group/"):
        html = client.get(path).content.decode()
        assert 'title="early_exit: sys.exit(0)">Early exit</span>' in html, path

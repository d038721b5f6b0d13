"""A real agent run: a model taught the tool-call protocol (a short SFT run on played expert
episodes, `workers/agent_demo.py`) plays an agent item in real sandboxes through a run's rollout
batch; its trajectories hold the tool calls, an invalid action that the reward's `invalid` term
counts, the workspace diff, per-test results and the final workspace; the learner trains each
episode as one sequence; a backtest grades the stored final workspace; the exports keep the
whole conversation and import as a task set; the browser replays it."""

import json

import pytest

from projects import services as project_services
from reviews import exports
from reviews.models import Review
from rewards import services as reward_services
from runs import lifecycle
from runs.backtest import reward_rule_backtest
from runs.lifecycle import RunRequest
from runs.models import RolloutBatch, Run, Trajectory, TrajectoryStep
from runs.run_store import policy_publish
from tests.conftest import make_project, make_user
from tiers import services as tier_services
from workers.agent_demo import agent_policy_build, call, expert_play
from workers.learners.grpo import grpo_batch
from workers.run_learner import _episodes
from workers.run_rollout import rollout_batch_run

# The teaching fixture is a real (short) SFT run: under load it alone can pass the default 180 s.
pytestmark = pytest.mark.timeout(900)
TESTS = (
    "def test_seven():\n    assert open('answer.txt').read() == '7'\n\n\n"
    "def test_file():\n    open('answer.txt')\n"
)
ITEM = {
    "kind": "agent",
    "id": "seven",
    "system": "Act.",
    "instructions": "Write 7 into answer.txt.",
    "check_command": 'test "$(cat answer.txt)" = 7',
    "max_steps": 5,
    "tools": ["write_file", "run_tests", "submit"],
    "files": {"test_answer.py": TESTS},
    "test_file": "test_answer.py",
}
# The expert's episode, mistake included: write_file without its content (fails the schema).
ACTIONS = [
    call("write_file", path="answer.txt"),
    call("write_file", path="answer.txt", content="7"),
    call("run_tests"),
    call("submit"),
]
RULE = {
    "type": "multi",
    "name": "agent",
    "graders": {
        "check": {"type": "agent_check"},
        "invalid": {"type": "invalid_actions"},
        "format": {"type": "format_errors"},
        "steps": {"type": "steps"},
    },
    "calculate_output": "check - 0.2 * invalid - 0.01 * steps",
}


@pytest.fixture(scope="session")
def taught_agent(tmp_path_factory):
    """A small model that has learned the expert's episode of ITEM (tool calls and mistake)."""
    path = tmp_path_factory.mktemp("taught-agent")
    [episode] = expert_play([ITEM], [ACTIONS])
    assert episode.grade.total == 1.0
    agent_policy_build(path, [episode], steps=60, log=lambda line: None)
    return path


def agent_run_create(owner, model_path, *, name: str = "agents") -> Run:
    project = make_project(owner)
    task_set = project_services.task_set_create(project=project, name="sevens", by=owner)
    items = [ITEM | {"id": f"seven-{n}", "split": "train"} for n in range(2)] + [
        ITEM | {"id": "seven-h", "split": "heldout"}
    ]
    lines = [(json.dumps(item) + "\n").encode() for item in items]
    version = project_services.task_set_import(
        task_set=task_set, stream=lines, file_format="jsonl", by=owner
    ).version
    rule = reward_services.reward_rule_create(project=project, name="agent", spec=RULE, by=owner)
    tier = tier_services.tier_create(
        project=project,
        by=owner,
        name="t",
        base_model=str(model_path),
        max_new_tokens=48,
        top_k=1,  # sampled, but only ever the likeliest token
    )
    run = lifecycle.run_create(
        request=RunRequest(
            project=project,
            name=name,
            task_set_version=version,
            reward_rule_version=rule.versions.get(),
            tier=tier,
            hyperparameters={"group_size": 2, "batch_size": 2},
            max_steps=2,
        ),
        by=owner,
    )
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    from inference.policy import policy_load

    policy = policy_load(model_path)
    policy_publish(run.pk, 0, policy.model, policy.tokenizer)
    return run


def agent_batch_play(run: Run) -> RolloutBatch:
    items = list(run.task_set_version.items.filter(split="train").values_list("pk", flat=True))
    batch = RolloutBatch.objects.create(run=run, index=0, step=0, policy_version=0, item_ids=items)
    assert rollout_batch_run(batch.pk) == len(items) * 2
    return batch


@pytest.fixture
def played(db, taught_agent, settings, tmp_path):
    settings.FLYWHEEL_HOME = tmp_path
    owner = make_user("agent-owner")
    run = agent_run_create(owner, taught_agent)
    return owner, run, agent_batch_play(run)


def test_a_real_agent_run_stores_tool_calls_an_invalid_action_diffs_per_test_results_and_the_workspace(
    played,
):
    _, run, batch = played
    rows = list(Trajectory.objects.filter(batch=batch).order_by("item_id", "sample_index"))
    assert len(rows) == 4 and {row.outcome for row in rows} == {"scored"}
    for row in rows:
        assert row.components == {"check": 1.0, "invalid": 1.0, "format": 0.0, "steps": 4.0}
        assert row.reward == pytest.approx(1.0 - 0.2 - 0.04)
        steps = [step.data() for step in TrajectoryStep.objects.filter(trajectory=row).order_by("index")]
        assert [step["valid"] for step in steps] == [False, True, True, True]
        assert steps[0]["error"] == {"kind": "arguments", "message": "write_file: 'content' is required"}
        assert [[c["name"] for c in step["tool_calls"]] for step in steps] == [
            [],
            ["write_file"],
            ["run_tests"],
            ["submit"],
        ]
        assert steps[1]["tool_calls"][0]["arguments"] == {"path": "answer.txt", "content": "7"}
        assert steps[1]["files_changed"] == [
            {
                "path": "answer.txt",
                "status": "added",
                "diff": "--- a/answer.txt\n+++ b/answer.txt\n@@ -0,0 +1 @@\n+7\n",
            }
        ]
        tests = steps[2]["tool_result"]["tests"]
        assert [(t["name"], t["status"]) for t in tests] == [("test_seven", "pass"), ("test_file", "pass")]
        assert steps[3]["final_workspace"]["files"] == {"answer.txt": "7", "test_answer.py": TESTS}
        assert steps[3]["final_workspace"]["bound"] == {
            "files": 100,
            "file_bytes": 100_000,
            "total_bytes": 500_000,
        }
        assert steps[3]["invalid_actions"] == 1
        assert all(step["token_ids"] and len(step["logprobs"]) == len(step["token_ids"]) for step in steps)
    # The learner reads each episode back as ONE sequence: its turns' tokens masked in.
    episodes = _episodes(rows)
    import torch

    batch_rows = grpo_batch(episodes, [0, 1, 2, 3], torch.zeros(4), pad_token_id=0)
    assert batch_rows.sequences.input_ids.shape[0] == 4
    tokens = sum(len(turn.token_ids) for episode in episodes for turn in episode.turns)
    assert int(batch_rows.sequences.completion_mask.sum()) == tokens


def test_a_backtest_of_an_agent_run_grades_the_stored_final_workspace(played):
    owner, run, _ = played
    rule = reward_services.reward_rule_create(
        project=run.project, name="just-check", spec={"type": "agent_check", "name": "check"}, by=owner
    )
    result = reward_rule_backtest(run=run, version=rule.versions.get())
    assert result.count == 4 and result.new_mean == 1.0  # the check passes on the stored workspace
    assert result.old_mean == pytest.approx(0.76)


def test_exports_of_agent_trajectories_keep_the_whole_conversation_and_import_as_a_task_set(played):
    owner, run, batch = played
    first, second, *_ = Trajectory.objects.filter(batch=batch).order_by("pk")
    Review.objects.create(trajectory=first, reviewer=owner, label=Review.Label.GOOD)
    Review.objects.create(trajectory=second, reviewer=owner, label=Review.Label.BAD)
    lines, export = exports.export_build(run=run, export_format="sft")
    [line] = [json.loads(text) for text in lines]
    messages = line["messages"]
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert messages[4]["tool_calls"] == [
        {
            "id": "call_0",
            "type": "function",
            "function": {"name": "write_file", "arguments": {"path": "answer.txt", "content": "7"}},
        }
    ]
    assert messages[3]["content"] == "Invalid action: write_file: 'content' is required"
    assert [tool["function"]["name"] for tool in line["tools"]] == ["write_file", "run_tests", "submit"]
    task_set = project_services.task_set_create(project=run.project, name="from-export", by=owner)
    report = project_services.task_set_import(
        task_set=task_set, stream=[(json.dumps(line) + "\n").encode()], file_format="jsonl", by=owner
    )
    assert report.ok, report.errors
    item = report.version.items.get()
    assert item.kind == "agent" and item.data["messages"] == messages
    # DPO: the shared prompt, then each episode's turns (here the same actions: identical, skipped).
    lines, export = exports.export_build(run=run, export_format="dpo")
    assert lines == [] and export.counts()["identical"] == 1

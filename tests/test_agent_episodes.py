"""Multi-step agent episodes: the policy acts in a real sandbox turn by turn, the item's check
command grades the final workspace, and runs store, learn from and evaluate such episodes."""

import dataclasses
import json

import pytest
import torch

from inference.generation import Completion
from inference.policy import policy_load
from inference.tool_chat import ToolCall, ToolCallError, item_tools, tool_calls_parse
from projects import services as project_services
from rewards import services as reward_services
from runs import lifecycle
from runs.lifecycle import RunRequest
from runs.models import MetricPoint, RolloutBatch, Run, Trajectory, TrajectoryStep
from runs.run_store import policy_publish
from sandboxes import services as sandbox_services
from sandboxes.config import sandbox_settings
from sandboxes.interface import StopReason
from sandboxes.pool import SandboxPool
from sandboxes.services import sandbox_pool
from tests.conftest import make_project, make_user
from tests.run_harness import tiny_model
from tests.sandbox_fixtures import BACKENDS, backend_ready
from tiers import services as tier_services
from workers.agent import SYSTEM, episodes_play, plain_render, prompt_fitted
from workers.learners.grpo import grpo_batch
from workers.rollout import Trajectory as Episode
from workers.run_eval import policy_evaluate
from workers.run_learner import _episodes, batch_parts
from workers.run_rollout import rollout_batch_run

__all__ = ["tiny_model"]
CHECK_RULE = {"type": "agent_check", "name": "check"}
ITEM = {
    "kind": "agent",
    "id": "seven",
    "instructions": "Write 7 into answer.txt.",
    "check_command": 'test "$(cat answer.txt)" = 7',
    "max_steps": 4,
    "files": {"notes.txt": "the answer is seven\n"},
}


def call(name: str, **arguments) -> str:
    """A completion calling one tool in the text protocol."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def scripted(*actions: str):
    """A stand-in policy for the protocol tests: at turn n of any episode (read from the prompt:
    one assistant header per turn so far plus the prompt's own) it plays actions[n], then the last."""
    calls: list[list[str]] = []

    def generate(prompts: list[str]) -> list[Completion]:
        calls.append(prompts)
        turns = [prompt.count("<|assistant|>\n") - 1 for prompt in prompts]
        texts = [actions[min(turn, len(actions) - 1)] for turn in turns]
        return [
            Completion(text=text, token_ids=[1, 2], logprobs=[-0.5, -0.5], finish_reason="stop")
            for text in texts
        ]

    generate.calls = calls
    return generate


def test_an_agent_calls_tools_turn_by_turn_in_its_sandbox_and_the_check_grades_the_workspace():
    generate = scripted(
        call("write_file", path="answer.txt", content="7\n"),
        call("shell", command="cat answer.txt notes.txt"),
        call("submit"),
    )
    [episode] = episodes_play([ITEM], generate, rule=CHECK_RULE)
    assert [[c.name for c in turn.calls] for turn in episode.turns] == [["write_file"], ["shell"], ["submit"]]
    assert episode.submitted and episode.grade.total == 1.0 and not episode.grade.errored
    assert episode.turns[1].results[0]["stdout"] == "7\nthe answer is seven\n"
    assert episode.turns[0].files_changed == [
        {
            "path": "answer.txt",
            "status": "added",
            "diff": "--- a/answer.txt\n+++ b/answer.txt\n@@ -0,0 +1 @@\n+7\n",
        }
    ]
    # The conversation, never flattened: system, instructions, then each reply and each tool result.
    assert [message["role"] for message in episode.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert episode.messages[2]["tool_calls"] == [
        {
            "id": "call_0",
            "type": "function",
            "function": {"name": "write_file", "arguments": {"path": "answer.txt", "content": "7\n"}},
        }
    ]
    assert episode.messages[5] == {
        "role": "tool",
        "name": "shell",
        "content": "exit 0\n7\nthe answer is seven\n",
    }
    # What the policy saw on its third turn: the text protocol (tools described in the system
    # message), the instructions, its own calls and their results.
    third = generate.calls[2][0]
    assert third.startswith("<|system|>\n" + SYSTEM) and "- shell(command: string): Run a shell" in third
    assert "<|user|>\nWrite 7 into answer.txt.\n" in third and third.endswith("<|assistant|>\n")
    assert '<tool_result name="shell">\nexit 0\n7\nthe answer is seven\n\n</tool_result>' in third
    assert episode.workspace.files == {"answer.txt": "7\n", "notes.txt": "the answer is seven\n"}


def test_an_invalid_action_is_a_step_answered_with_an_error_and_counted_by_the_reward():
    rule = {
        "type": "multi",
        "name": "agent",
        "graders": {
            "check": CHECK_RULE,
            "invalid": {"type": "invalid_actions"},
            "format": {"type": "format_errors"},
            "steps": {"type": "steps"},
        },
        "calculate_output": "check - 0.25 * invalid - 0.01 * steps",
    }
    generate = scripted(
        "I will write the file.",  # no call: malformed
        call("browse", url="x"),  # unknown tool
        call("write_file", path="answer.txt"),  # fails the schema: content is required
        '<tool_call>{"name": "write_file", "arguments": {"path": "answer.txt", "content": "7"}</tool_call>',
        call("write_file", path="answer.txt", content="7"),
        call("submit"),
    )
    [episode] = episodes_play([ITEM | {"max_steps": 8}], generate, rule=rule)
    kinds = [turn.error.kind if turn.error else None for turn in episode.turns]
    assert kinds == ["format", "unknown_tool", "arguments", "format", None, None]
    assert episode.grade.components == {"check": 1.0, "invalid": 4.0, "format": 2.0, "steps": 6.0}
    assert episode.grade.total == pytest.approx(1.0 - 1.0 - 0.06)
    assert episode.messages[3] == {
        "role": "user",
        "content": "Invalid action: no tool call: answer with <tool_call>{...}</tool_call>",
        "error_observation": True,
    }
    assert "unknown tool 'browse'" in episode.messages[5]["content"]
    assert episode.messages[7]["content"] == "Invalid action: write_file: 'content' is required"
    record = episode.turns[1].record()
    assert record["valid"] is False and record["format_ok"] is True and record["tool_calls"] == []


def test_an_item_may_restrict_its_tools():
    item = ITEM | {"tools": ["write_file", "submit"]}
    [episode] = episodes_play(
        [item], scripted(call("shell", command="echo 7 > answer.txt"), call("submit")), rule=CHECK_RULE
    )
    assert [tool["function"]["name"] for tool in episode.tools] == ["write_file", "submit"]
    assert episode.turns[0].error.kind == "unknown_tool" and episode.grade.total == 0.0


def test_run_tests_answers_with_each_tests_result_from_the_pristine_tests():
    item = {
        "kind": "agent",
        "id": "fix",
        "instructions": "Fix add.",
        "max_steps": 4,
        "check_command": "python test_app.py",
        "files": {
            "app.py": "def add(a, b):\n    return a - b\n",
            "test_app.py": "from app import add\n\ndef test_add():\n    assert add(2, 3) == 5\n\n"
            "def test_zero():\n    assert add(0, 0) == 0\n",
        },
    }
    generate = scripted(
        call("run_tests"),
        call("write_file", path="test_app.py", content="def test_add():\n    pass\n"),  # cannot cheat
        call("run_tests"),
        call("submit"),
    )
    [episode] = episodes_play([item], generate, rule=CHECK_RULE)
    first, _, third = (turn.results[0] for turn in episode.turns[:3])
    assert [(t["name"], t["status"]) for t in first["tests"]] == [("test_add", "fail"), ("test_zero", "pass")]
    assert first["passed"] == 1 and first["failed"] == 1 and first["path"] == "test_app.py"
    assert [(t["name"], t["status"]) for t in third["tests"]] == [("test_add", "fail"), ("test_zero", "pass")]
    assert episode.messages[3]["content"].startswith("1 passed, 1 failed\nFAIL test_add")


def test_an_agent_that_never_submits_stops_at_its_step_budget_and_fails_the_check():
    [episode] = episodes_play([ITEM], scripted(call("shell", command="echo 8 > answer.txt")), rule=CHECK_RULE)
    assert len(episode.turns) == ITEM["max_steps"] and not episode.submitted
    assert episode.grade.total == 0.0


def test_an_agents_commands_stay_inside_its_sandbox():
    command = "cat /etc/shadow; echo $FLYWHEEL_HOME; id -u"
    [episode] = episodes_play(
        [ITEM], scripted(call("shell", command=command), call("submit")), rule=CHECK_RULE
    )
    result = episode.turns[0].results[0]
    assert "root:" not in result["stdout"] and result["stdout"].splitlines()[0] == ""  # no host variables
    assert result["stdout"].splitlines()[1] != "0"  # not root
    assert episode.grade.total == 0.0


def test_an_items_sandbox_limits_bound_its_agents_commands():
    """The item asks for 0.5 s a command (the default is 5 s): a one-second sleep is stopped."""
    item = ITEM | {"sandbox": {"limits": {"wall_seconds": 0.5}}}
    generate = scripted(call("shell", command="sleep 1; echo 7 > answer.txt"), call("submit"))
    [episode] = episodes_play([item], generate, rule=CHECK_RULE)
    assert episode.turns[0].results[0]["stop_reason"] == str(StopReason.TIMEOUT)
    assert episode.grade.total == 0.0


def test_episodes_of_a_group_play_in_separate_sandboxes():
    generate = scripted(call("shell", command="echo 7 >> answer.txt"), call("submit"))
    episodes = episodes_play([ITEM, ITEM, ITEM], generate, rule=CHECK_RULE)
    assert [episode.grade.total for episode in episodes] == [1.0, 1.0, 1.0]  # each wrote one line
    wave = sandbox_pool().max_sandboxes - 1  # episodes at once: one sandbox stays free for graders
    assert len(generate.calls[0]) == min(3, wave)  # a turn of the wave is one batched generation


def test_long_tool_output_is_truncated_with_a_marker_and_the_cut_recorded():
    generate = scripted(call("shell", command="python3 -c \"print('x' * 5000)\""), call("submit"))
    [episode] = episodes_play([ITEM], generate, rule=CHECK_RULE)
    shown = episode.messages[3]["content"]
    assert "characters truncated ...]" in shown and len(shown) < 1300
    cut = episode.turns[0].truncated_chars
    assert cut == len("exit 0\n" + "x" * 5000 + "\n") - 1200
    assert episode.turns[0].record()["tool_result"]["truncated_chars"] == cut


def test_the_oldest_tool_results_are_elided_first_when_the_context_is_short():
    generate = scripted(
        call("shell", command="echo first"),
        call("shell", command="echo second"),
        call("shell", command="echo third"),
        call("submit"),
    )
    [episode] = episodes_play([ITEM | {"max_steps": 4}], generate, rule=CHECK_RULE)
    prompt, elided = prompt_fitted(
        episode.messages,
        episode.tools,
        plain_render,
        lambda text: "exit 0\nfirst" not in text and "exit 0\nsecond" not in text,
    )
    assert elided == [3, 5]  # the first two results, oldest first; the third kept
    assert "exit 0\nthird" in prompt and "[tool result elided: 13 characters" in prompt
    assert "echo first" in prompt  # the calls themselves stay: only results are elided


def test_tool_call_parsing():
    tools = item_tools({})
    assert tool_calls_parse(call("read_file", path="a.py") + " and " + call("submit"), tools) == [
        ToolCall("read_file", {"path": "a.py"}),
        ToolCall("submit", {}),
    ]
    # A stop sequence may cut the closing tag: the last block still parses.
    assert tool_calls_parse('<tool_call>{"name": "submit", "arguments": {}}', tools) == [
        ToolCall("submit", {})
    ]
    # OpenAI's wire shape: arguments as a JSON string.
    wire = '<tool_call>{"name": "read_file", "arguments": "{\\"path\\": \\"a\\"}"}</tool_call>'
    assert tool_calls_parse(wire, tools) == [ToolCall("read_file", {"path": "a"})]
    with pytest.raises(ToolCallError, match="'extra' is not a parameter"):
        tool_calls_parse(call("submit", extra=1), tools)
    with pytest.raises(ToolCallError, match="'path' must be string"):
        tool_calls_parse(call("read_file", path=3), tools)


def test_agent_items_get_rollout_batches_of_their_own():
    items = [{"pk": 1, "kind": "answer"}, {"pk": 2, "kind": "agent"}, {"pk": 3, "kind": "code"}]
    assert batch_parts(items) == [[1], [3], [2]]


def test_a_multi_step_episode_trains_on_every_turn_with_its_advantage():
    turn = Completion(
        text="ls", token_ids=[5, 6], logprobs=[-1.0, -2.0], finish_reason="stop", prompt_token_ids=[1]
    )
    episode = Episode(0, turn, 1.0, "scored", 0, True, turns=[turn, turn, turn])
    single = Episode(1, turn, 0.0, "scored", 0, False)

    batch = grpo_batch([episode, single], [0, 1], torch.tensor([0.5, -0.5]), pad_token_id=0)
    assert batch.advantages.tolist() == [0.5, 0.5, 0.5, -0.5]
    assert batch.sequences.input_ids.shape[0] == 4


@pytest.fixture
def agent_run(db, tiny_model, settings, tmp_path):
    settings.FLYWHEEL_HOME = tmp_path
    owner = make_user("agent-owner")
    project = make_project(owner)
    task_set = project_services.task_set_create(project=project, name="agents", by=owner)
    items = [ITEM | {"id": f"a{n}", "split": "train"} for n in range(3)] + [
        ITEM | {"id": "h", "split": "heldout"}
    ]
    lines = [(json.dumps(item) + "\n").encode() for item in items]
    version = project_services.task_set_import(
        task_set=task_set, stream=lines, file_format="jsonl", by=owner
    ).version
    rule = reward_services.reward_rule_create(project=project, name="check", spec=CHECK_RULE, by=owner)
    tier = tier_services.tier_create(
        project=project, by=owner, name="t", base_model=str(tiny_model), max_new_tokens=8
    )
    run = lifecycle.run_create(
        request=RunRequest(
            project=project,
            name="agents",
            task_set_version=version,
            reward_rule_version=rule.versions.get(),
            tier=tier,
            hyperparameters={"group_size": 2, "batch_size": 3},
            max_steps=2,
        ),
        by=owner,
    )
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    policy = policy_load(tiny_model)
    policy_publish(run.pk, 0, policy.model, policy.tokenizer)
    return run


@pytest.mark.backend_independent
def test_a_runs_agent_batch_stores_every_turn_and_the_learner_reads_them_back(agent_run):
    items = list(agent_run.task_set_version.items.filter(split="train").values_list("pk", flat=True))
    batch = RolloutBatch.objects.create(run=agent_run, index=0, step=0, policy_version=0, item_ids=items)
    assert rollout_batch_run(batch.pk) == len(items) * 2
    batch.refresh_from_db()
    assert batch.status == RolloutBatch.Status.DONE and batch.sandbox_cpu_seconds > 0
    rows = list(Trajectory.objects.filter(batch=batch).order_by("item_id", "sample_index"))
    assert {row.outcome for row in rows} == {Trajectory.Outcome.SCORED}
    assert {row.reward for row in rows} <= {0.0, 1.0}
    for row in rows:
        steps = list(TrajectoryStep.objects.filter(trajectory=row).order_by("index"))
        assert 1 <= row.step_count == len(steps) <= ITEM["max_steps"]
        assert {step.kind for step in steps} == {"tool_call"}
        first = steps[0].data()
        assert "[user]\nWrite 7 into answer.txt." in first["observation"] and first["token_ids"]
        assert steps[-1].data()["final_workspace"]["files"]["notes.txt"] == "the answer is seven\n"
    assert all(row.wall_seconds > 0 for row in rows)
    assert Run.objects.get(pk=agent_run.pk).sandbox_cpu_seconds == pytest.approx(batch.sandbox_cpu_seconds)
    episodes = _episodes(rows)
    assert [len(episode.completions) for episode in episodes] == [row.step_count for row in rows]


def test_held_out_evaluation_plays_the_agent_items(agent_run):
    values = policy_evaluate(agent_run.pk, 0)
    assert values["heldout/pass_rate"] == values["heldout/pass_rate/agent"] in (0.0, 1.0)  # one item
    assert MetricPoint.objects.filter(run=agent_run, name="heldout/pass_rate", step=0).count() == 1
    # The agent figures: the share of the episode's steps that were invalid, and its steps.
    steps, invalid = values["heldout/agent/steps"], values["heldout/agent/invalid_rate"]
    assert steps in range(1, ITEM["max_steps"] + 1) and 0 <= invalid <= 1
    assert invalid * steps == pytest.approx(round(invalid * steps))  # a whole number of invalid steps
    stored = dict(MetricPoint.objects.filter(run=agent_run, step=0).values_list("name", "value"))
    assert stored["heldout/agent/steps"] == steps and stored["heldout/agent/invalid_rate"] == invalid


@pytest.mark.parametrize("backend", BACKENDS)
def test_agent_items_play_on_either_sandbox_backend_with_the_items_image(backend, monkeypatch):
    backend_ready(backend)
    settings = dataclasses.replace(sandbox_settings(), backend=backend)
    pool = SandboxPool(settings=settings, max_sandboxes=2, warm=0)
    monkeypatch.setattr(sandbox_services, "_pool", pool)  # the pool episodes acquire from
    item = {
        "kind": "agent",
        "id": "fix",
        "instructions": "Fix add.",
        "max_steps": 5,
        "check_command": "python3 test_app.py",
        "files": {
            "app.py": "def add(a, b):\n    return a - b\n",
            "test_app.py": "from app import add\n\nassert add(2, 3) == 5\n",
        },
    }
    if backend == "docker":
        item["sandbox"] = {"image": settings.image}  # honoured: the episode's container runs it
    generate = scripted(
        call("write_file", path="app.py", content="def add(a, b):\n    return a + b\n"),
        call("run_tests"),
        call("shell", command="cat /etc/os-release | head -1"),
        call("submit"),
    )
    try:
        [episode] = episodes_play([item], generate, rule=CHECK_RULE)
    finally:
        pool.close()
    assert episode.grade.total == 1.0 and not episode.grade.errored
    assert episode.turns[0].files_changed[0]["status"] == "modified"
    assert [(t["name"], t["status"]) for t in episode.turns[1].results[0]["tests"]] == [("line 3", "pass")]
    assert episode.turns[2].results[0]["exit_code"] == 0

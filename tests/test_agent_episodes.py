"""Multi-step agent episodes: the policy acts in a real sandbox turn by turn, the item's check
command grades the final workspace, and runs store, learn from and evaluate such episodes."""

import json

import pytest
import torch

from inference.generation import Completion
from inference.policy import policy_load
from rewards import services as reward_services
from runs import lifecycle, services
from runs.lifecycle import RunRequest
from runs.models import MetricPoint, RolloutBatch, Run, Trajectory, TrajectoryStep
from runs.run_store import policy_publish
from sandboxes.interface import StopReason
from sandboxes.services import sandbox_pool
from tests.conftest import make_project, make_user
from tests.run_harness import tiny_model
from workers.agent import action_command, episodes_play, observation
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


def scripted(*actions: str):
    """A stand-in policy for the protocol tests: at turn n of any episode (read from the
    observation, one `$ ` per turn so far plus the prompt's own) it plays actions[n], then the last."""
    calls: list[list[str]] = []

    def generate(prompts: list[str]) -> list[Completion]:
        calls.append(prompts)
        turns = [prompt.count("$ ") - 1 for prompt in prompts]
        texts = [actions[min(turn, len(actions) - 1)] for turn in turns]
        return [
            Completion(text=text, token_ids=[1, 2], logprobs=[-0.5, -0.5], finish_reason="stop")
            for text in texts
        ]

    generate.calls = calls
    return generate


def test_an_agent_acts_turn_by_turn_in_its_sandbox_and_the_check_grades_the_workspace():
    generate = scripted("```sh\necho 7 > answer.txt\n```", "cat answer.txt notes.txt", "submit")
    [episode] = episodes_play([ITEM], generate, rule=CHECK_RULE)
    assert [turn.command for turn in episode.turns] == [
        "echo 7 > answer.txt",
        "cat answer.txt notes.txt",
        None,
    ]
    assert episode.submitted and episode.grade.total == 1.0 and not episode.grade.errored
    assert episode.turns[1].result.stdout == "7\nthe answer is seven\n"
    # What the policy saw on its third turn: the instructions and both earlier commands with output.
    third = generate.calls[2][0]
    assert third.startswith("Write 7 into answer.txt.\n") and third.endswith("$ ")
    assert "$ echo 7 > answer.txt\n[exit 0]\n$ cat answer.txt notes.txt\n7\nthe answer is seven\n" in third


def test_an_agent_that_never_submits_stops_at_its_step_budget_and_fails_the_check():
    [episode] = episodes_play([ITEM], scripted("echo 8 > answer.txt"), rule=CHECK_RULE)
    assert len(episode.turns) == ITEM["max_steps"] and not episode.submitted
    assert episode.grade.total == 0.0


def test_an_agents_commands_stay_inside_its_sandbox():
    [episode] = episodes_play(
        [ITEM], scripted("cat /etc/shadow; echo $FLYWHEEL_HOME; id -u", "submit"), rule=CHECK_RULE
    )
    result = episode.turns[0].result
    assert "root:" not in result.stdout and result.stdout.splitlines()[0] == ""  # no host variables
    assert result.stdout.splitlines()[1] != "0"  # not root
    assert episode.grade.total == 0.0


def test_an_items_sandbox_limits_bound_its_agents_commands():
    """The item asks for 0.5 s a command (the default is 5 s): a one-second sleep is stopped."""
    item = ITEM | {"sandbox": {"limits": {"wall_seconds": 0.5}}}
    [episode] = episodes_play([item], scripted("sleep 1; echo 7 > answer.txt", "submit"), rule=CHECK_RULE)
    assert episode.turns[0].result.stop_reason == StopReason.TIMEOUT
    assert episode.grade.total == 0.0


def test_episodes_of_a_group_play_in_separate_sandboxes():
    generate = scripted("echo 7 >> answer.txt", "submit")
    episodes = episodes_play([ITEM, ITEM, ITEM], generate, rule=CHECK_RULE)
    assert [episode.grade.total for episode in episodes] == [1.0, 1.0, 1.0]  # each wrote one line
    wave = sandbox_pool().max_sandboxes - 1  # episodes at once: one sandbox stays free for graders
    assert len(generate.calls[0]) == min(3, wave)  # a turn of the wave is one batched generation


def test_the_oldest_turns_leave_the_observation_first_when_the_context_is_short():
    generate = scripted("echo first", "echo second", "echo third")
    [episode] = episodes_play([ITEM | {"max_steps": 3}], generate, rule=CHECK_RULE)
    seen = observation(episode, fits=lambda text: len(text) < 150)
    assert "$ echo third\nthird\n" in seen and "$ echo first" not in seen
    assert seen.startswith("Write 7 into answer.txt.")


def test_action_parsing():
    assert action_command("```bash\nls\n```\nthen more") == "ls"
    assert action_command("  submit  ") is None
    assert action_command("pwd\nsubmit") == "pwd"


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
    task_set = services.task_set_create(project=project, name="agents", by=owner)
    items = [ITEM | {"id": f"a{n}", "split": "train"} for n in range(3)] + [
        ITEM | {"id": "h", "split": "heldout"}
    ]
    lines = [(json.dumps(item) + "\n").encode() for item in items]
    version = services.task_set_import(task_set=task_set, stream=lines, file_format="jsonl", by=owner).version
    rule = reward_services.reward_rule_create(project=project, name="check", spec=CHECK_RULE, by=owner)
    tier = services.tier_create(
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
        assert {step.kind for step in steps[:-1]} <= {"command"}
        first = steps[0].data()
        assert first["observation"].startswith("Write 7 into answer.txt.") and first["token_ids"]
    assert all(row.wall_seconds > 0 for row in rows)
    assert Run.objects.get(pk=agent_run.pk).sandbox_cpu_seconds == pytest.approx(batch.sandbox_cpu_seconds)
    episodes = _episodes(rows)
    assert [len(episode.completions) for episode in episodes] == [row.step_count for row in rows]


def test_held_out_evaluation_plays_the_agent_items(agent_run):
    values = policy_evaluate(agent_run.pk, 0)
    assert values["heldout/pass_rate"] == values["heldout/pass_rate/agent"] in (0.0, 1.0)  # one item
    assert MetricPoint.objects.filter(run=agent_run, name="heldout/pass_rate", step=0).count() == 1

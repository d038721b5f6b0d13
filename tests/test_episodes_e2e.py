"""End to end: an agent of your own (the official `openai` client for the model, the `flywheel`
client for episodes, tool calls and a second turn) trains a run of `external_rollouts` through a
live web server, real Celery workers, a real learner process and a sandbox (a final answer scored
by the run's rule). An agent that dies is dropped and its slot played again; a second report is
refused; the learner learns on exactly the tokens the endpoint sampled."""

import importlib.util
from pathlib import Path

import openai
import pytest

from episodes.models import Episode
from flywheel import Client
from flywheel.errors import ConflictError
from projects import services as project_services
from runs.models import MetricPoint, Run, Trajectory
from tests.run_harness import demo_project, tiny_model, wait_until
from tests.web_server import served_with_workers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]
__all__ = ["tiny_model"]

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "external_agent.py"
TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
STEPS, ITEMS, GROUP = 2, 2, 2


@pytest.fixture
def stack(tmp_path):
    with served_with_workers(tmp_path / "web.log", rollout_queues="rollout,eval") as server:
        yield server


def play(model: openai.OpenAI, run: int, episode: dict) -> None:
    """Two turns: the question with a tool offered, then the agent's own call and its result."""
    messages = [{"role": "user", "content": "2+3"}]
    first = model.chat.completions.create(
        model=f"run-{run}",
        messages=messages,
        tools=[TOOL],
        max_tokens=3,
        extra_headers={"X-Flywheel-Episode": episode["id"]},
    )
    assert first.choices[0].message.role == "assistant"
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    history = [
        *messages,
        {"role": "assistant", "content": "ok", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]
    second = model.chat.completions.create(
        model=f"run-{run}", messages=history, max_tokens=3, metadata={"episode_id": episode["id"]}
    )
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")


def example_agent():
    """The README's example agent (examples/external_agent.py), as a module."""
    spec = importlib.util.spec_from_file_location("external_agent", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(600)
def test_an_agent_of_your_own_trains_a_run_through_the_run_bound_endpoint(stack, tiny_model):
    setup = demo_project(tiny_model)
    _, token = project_services.api_token_create(user=setup["owner"], name="agent")
    flywheel = Client(url=stack.url, token=token)
    model = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=token, max_retries=0)
    run = flywheel.runs.launch(
        project=setup["project"].pk,
        name="my agent",
        task_set_version=setup["version"].pk,
        reward_rule_version=setup["rule"].versions.get().pk,
        tier=setup["tier"].pk,
        method="external_rollouts",
        hyperparameters={
            "group_size": GROUP,
            "batch_size": ITEMS,
            "staleness": 0,
            "eval_items": 2,
            "episode_deadline_seconds": 8,
        },
        max_steps=STEPS,
        monitor_actions={"nothing_to_learn": "alert"},
    )["id"]
    wait_until(lambda: Run.objects.get(pk=run).status == Run.Status.RUNNING, "the learner")
    played, abandoned, twice, scored_by_rule = 0, None, None, None
    while Run.objects.get(pk=run).status == Run.Status.RUNNING:
        try:
            episode = flywheel.episodes.start(run)
        except ConflictError:
            continue  # every open slot is being played (the abandoned one until its deadline)
        if abandoned is None:  # this agent dies after one turn: never reports
            abandoned = episode["id"]
            model.chat.completions.create(
                model=f"run-{run}",
                messages=[{"role": "user", "content": "2+3"}],
                max_tokens=2,
                extra_headers={"X-Flywheel-Episode": episode["id"]},
            )
            continue
        if scored_by_rule is None:  # the example agent's way: its final answer, scored by the rule
            scored_by_rule = episode["id"]
            final = example_agent().play_episode(model, episode, max_turns=2, max_tokens=3)
            flywheel.episodes.report(run, episode["id"], final=final)
            played += 1
            continue
        play(model, run, episode)
        played += 1
        reward = float(episode["group"]["sample_index"] == 0)  # a rubric of its own that splits each group
        flywheel.episodes.report(run, episode["id"], reward=reward, components={"parity": reward})
        if twice is None:
            twice = episode["id"]
            with pytest.raises(ConflictError, match="reports once"):
                flywheel.episodes.report(run, episode["id"], reward=1.0)
    finished = Run.objects.get(pk=run)
    assert finished.status == Run.Status.SUCCEEDED, finished.error
    for step in range(STEPS):
        stored = Trajectory.objects.filter(run=finished, batch__step=step).exclude(outcome="cancelled")
        groups: dict[int, set] = {}
        for item, reward in stored.values_list("item_id", "reward"):
            groups.setdefault(item, set()).add(reward)
        # GRPO learns every group whose rewards differ (a group of equal rewards has no advantage).
        expected = sum(GROUP for rewards in groups.values() if len(rewards) > 1)
        learned = stored.filter(learned_in_step=step)
        assert len(groups) == ITEMS and expected >= GROUP and learned.count() == expected
        two_turns = learned.exclude(external_episode__key=scored_by_rule)
        assert set(two_turns.values_list("step_count", flat=True)) == {2}
    # The dead agent's episode: timed out, counted, never stored or learned; its slot was replayed.
    dead = Episode.objects.get(key=abandoned)
    assert (dead.status, dead.trajectory_id) == ("timed_out", None)
    assert flywheel.episodes.counts(run)["timed_out"] >= 1
    assert finished.events.filter(kind="episode_timeout").exists()
    # Reported twice, stored once; the rule scored the final answer on a rollout worker (its sandbox).
    assert Trajectory.objects.filter(external_episode__key=twice).count() == 1
    by_rule = Episode.objects.get(key=scored_by_rule)
    assert by_rule.status == "reported" and by_rule.trajectory.components != {}
    # Token in, token out: the learner's log-probs of the sampled tokens are the decoder's.
    gaps = MetricPoint.objects.filter(run=finished, name__endswith="logprob_gap").values_list(
        "value", flat=True
    )
    assert len(gaps) == STEPS and max(gaps) < 1e-3
    assert played >= STEPS * ITEMS * GROUP

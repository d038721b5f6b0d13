"""End to end: `verifiers` environments of our own train runs of `external_rollouts` through
`flywheel env run`, run from the verifiers virtualenv (`make verifiers-venv`), against a live web
server and real learner and rollout workers (one stack for the module).

The single-turn one (examples/verifiers_envs/function_writer.py, a SingleTurnEnv with a rubric)
raises the rubric's reward on held-out items, as `flywheel env eval` scores them on the base tier and
on the run's last checkpoint. On the weak base of the Tinker cookbook's RL test, 16 steps of 4 items
x 8 with LoRA rank 8 and the LoRA of the cookbook's run (Flywheel's Tinker API trains alpha 32, the
unembedding included) moved the held-out reward (16 items x 4 rollouts) and the train reward (the
mean of the first 4 steps -> of the last 4), measured run by run:

- lr 3e-3 (the test's): held-out 0.094 -> 0.594, 0.156 -> 0.516 and 0.078 -> 0.578; train
  0.11 -> 0.35, 0.06 -> 0.55 and 0.09 -> 0.73;
- lr 2e-3: held-out 0.109 -> 0.641 and 0.062 -> 0.344; train 0.13 -> 0.56 and 0.15 -> 0.27;
- lr 4e-3: held-out 0.109 -> 0.125 (too high: it unlearns before it learns).

With Flywheel's GRPO defaults (alpha 16, attention and MLP only) at lr 2e-3 it moved neither
(held-out 0.14 -> 0.16 and 0.125 -> 0.234, train flat at ~0.1), with the unembedding at alpha 16 a
little (0.14 -> 0.23), and full weights at lr 1e-3 not at all (0.11 -> 0.12). The noise of a
held-out figure is ~0.05 (64 rollouts at ~0.15), so the test asks for +0.2 held-out and +0.15 train.

The tool-use one (examples/verifiers_envs/calculator.py, a ToolEnv) plays multi-turn episodes on
/v1 with `tools`: the model's calls come back as OpenAI tool_calls, the environment runs them and
sends their results as tool messages, and each episode is learned on the turns the model sampled,
the tool results only ever in the next turn's prompt (never in the loss)."""

import json
import os
import random
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from costs.models import Usage
from costs.services import rollout_component
from episodes.models import Episode
from flywheel import Client
from projects import demo_tasks
from projects import services as project_services
from rewards import services as reward_services
from runs.models import RolloutBatch, Run, Trajectory, TrajectoryStep
from tests.calculator_agent import calculator_agent_build, calculator_items, conversation, prompt_text
from tests.run_fixtures import ANSWER_RULE
from tests.run_harness import demo_project
from tests.test_workers_learners import WEAK as WEAK_BASE
from tests.web_server import served_with_workers
from workers.base_model import base_model_build
from workers.run_learner import _episodes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]

ROOT = Path(__file__).resolve().parent.parent
FLYWHEEL = ROOT / ".venv-verifiers" / "bin" / "flywheel"
ENVIRONMENT = ROOT / "examples" / "verifiers_envs" / "function_writer.py"
CALCULATOR = ROOT / "examples" / "verifiers_envs" / "calculator.py"
# The weak base of the Tinker cookbook's RL test: often off by one on the scalar items with the
# constant 3, so a group's rewards differ and GRPO has something to learn.
WEAK = replace(WEAK_BASE, steps=600)
TRAIN, HELDOUT, BATCH, GROUP, STEPS, REPEATS = 32, 16, 4, 8, 16, 4
MAX_TOKENS = "24"
# The cookbook RL test's LoRA (what Flywheel's Tinker API trains: alpha FLYWHEEL_TINKER_LORA_ALPHA,
# 32, and the unembedding): with GRPO's defaults (alpha 16, attention and MLP) 16 steps learn nothing.
LORA = {"adapter": "lora", "lora_rank": 8, "lora_alpha": 32, "lora_target_modules": "attention,mlp,unembed"}
TOOL_ITEMS, TOOL_BATCH, TOOL_GROUP, TOOL_STEPS = 8, 2, 8, 4
SUM = re.compile(r"^\d+ \+ \d+$")  # what the model was taught to pass (other calls: a tool error)
TOOL_COMPONENTS = {"correct_answer", "num_turns", "total_tool_calls", "calculate_calls"}

if not FLYWHEEL.exists():
    pytest.skip(
        "the verifiers virtualenv is not built (make verifiers-venv): verifiers pins openai and mcp "
        "apart from the server, so `flywheel env` runs from .venv-verifiers",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory, django_db_setup):
    """One live web server with a learner host and a rollout-and-eval host for the module's tests."""
    log = tmp_path_factory.mktemp("stack") / "web.log"
    with served_with_workers(log, rollout_queues="rollout,eval") as server:
        yield server


def scalar_items() -> dict[str, list[dict]]:
    """The demo's scalar items with the constant 3, shuffled, split into train and held-out."""
    chosen = [spec for spec in demo_tasks.all_specs() if spec.kind == "scalar" and spec.constant == 3]
    random.Random(0).shuffle(chosen)
    splits = {"heldout": chosen[:HELDOUT], "train": chosen[HELDOUT : HELDOUT + TRAIN]}
    return {
        split: [demo_tasks.item_from_spec(spec) | {"split": split} for spec in specs]
        for split, specs in splits.items()
    }


def flywheel_env(*argv: str, url: str, token: str, timeout: float) -> dict:
    """The command from the verifiers virtualenv; its --json result."""
    environment = os.environ | {"FLYWHEEL_URL": url, "FLYWHEEL_TOKEN": token}
    done = subprocess.run(
        [str(FLYWHEEL), "env", *argv, "--json"],
        env=environment,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.timeout(900)
def test_a_verifiers_environment_raises_its_rubric_reward_on_heldout_items(stack, tmp_path):
    weak = tmp_path / "weak"
    base_model_build(weak, WEAK, log=lambda line: None)
    setup = demo_project(weak)
    owner, project = setup["owner"], setup["project"]
    items = scalar_items()
    task_set = project_services.task_set_create(project=project, name="scalar-3", by=owner)
    lines = [(json.dumps(item) + "\n").encode() for split in items.values() for item in split]
    version = project_services.task_set_import(
        task_set=task_set, stream=lines, file_format="jsonl", by=owner
    ).version
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps(item) + "\n" for item in items["heldout"]))
    _, token = project_services.api_token_create(user=owner, name="verifiers")
    scoring = ["--max-tokens", MAX_TOKENS, "--concurrency", "8"]
    evaluate = ["eval", str(ENVIRONMENT), "--items", str(heldout), "--repeats", str(REPEATS), *scoring]
    before = flywheel_env(
        *evaluate, "--model", f"tier-{setup['tier'].pk}", url=stack.url, token=token, timeout=300
    )
    run_id = Client(url=stack.url, token=token).runs.launch(
        project=project.pk,
        name="verifiers",
        task_set_version=version.pk,
        reward_rule_version=setup["rule"].versions.get().pk,
        tier=setup["tier"].pk,
        method="external_rollouts",
        hyperparameters=LORA
        | {
            "group_size": GROUP,
            "batch_size": BATCH,
            "staleness": 0,
            "learning_rate": 3e-3,
            "lr_scheduler": "constant",
            "eval_items": 0,
            "eval_every": STEPS,
            "checkpoint_every": STEPS,
            "episode_deadline_seconds": 60,
        },
        max_steps=STEPS,
        monitor_actions={"nothing_to_learn": "alert"},
    )["id"]
    played = flywheel_env(
        "run", str(ENVIRONMENT), str(run_id), *scoring, url=stack.url, token=token, timeout=600
    )
    finished = Run.objects.get(pk=run_id)
    assert finished.status == Run.Status.SUCCEEDED, finished.error
    after = flywheel_env(
        *evaluate, "--model", f"run-{run_id}-step-{STEPS}", url=stack.url, token=token, timeout=300
    )
    # Every episode the command reported carries the rubric's reward and each function's value.
    assert played["status"] == "succeeded" and played["played"] >= STEPS * BATCH * GROUP
    reported = Episode.objects.filter(run_id=run_id, status="reported").select_related("trajectory")
    assert reported.count() == played["played"]
    for episode in reported:
        components = episode.trajectory.components
        # the rubric's functions, and the turn count verifiers' own monitor rubric adds
        assert set(components) == {"passes_tests", "defines_function", "num_turns"}, components
        assert episode.reward == components["passes_tests"]  # the rubric's weights: 1 and 0
    # The rubric scored every held-out rollout of the base tier and of the run's last checkpoint,
    # and the checkpoint passes far more of them (0.094 -> 0.594 and 0.156 -> 0.516 measured).
    assert before["failed"] == after["failed"] == 0
    assert before["played"] == after["played"] == HELDOUT * REPEATS
    for scored in (before, after):
        assert 0 <= scored["reward"] <= 1 and scored["reward"] == scored["components"]["passes_tests"]
    rewards = train_rewards(run_id)
    by_step = [round(reward, 3) for reward in rewards]
    print(f"held-out {before['reward']:.3f} -> {after['reward']:.3f}; train by step {by_step}")
    assert after["reward"] >= before["reward"] + 0.2, (before, after)
    # The train reward rose as the episodes were learned (0.11 -> 0.35 and 0.06 -> 0.55 measured).
    assert len(rewards) == STEPS and sum(rewards[-4:]) / 4 >= sum(rewards[:4]) / 4 + 0.15, rewards
    assert Trajectory.objects.filter(run_id=run_id, learned_in_step__isnull=False).exists()
    # Each step's decoding on /v1 (batched across the agents' requests) is billed as its rollout.
    for batch in RolloutBatch.objects.filter(run_id=run_id, status="done"):
        usage = Usage.objects.get(
            run_id=run_id, step=batch.step + 1, component=rollout_component(batch.item_ids), kind="rollout"
        )
        turns = [turn for episode in batch.episodes.all() for turn in episode.turns]
        assert usage.tokens_sampled == sum(len(turn["token_ids"]) for turn in turns) > 0
        assert usage.tokens_prefilled == sum(len(turn["prompt_token_ids"]) for turn in turns)
        assert usage.device_seconds == pytest.approx(sum(turn["device_seconds"] for turn in turns))
        assert usage.device_seconds > 0 and usage.device_class == "cpu"


def train_rewards(run_id: int) -> list[float]:
    """The mean reward of each step's episodes, step by step."""
    steps: dict[int, list[float]] = {}
    for step, reward in Trajectory.objects.filter(run_id=run_id).values_list("batch__step", "reward"):
        steps.setdefault(step, []).append(reward or 0.0)
    return [sum(rewards) / len(rewards) for _, rewards in sorted(steps.items())]


@pytest.mark.timeout(900)
def test_a_tool_env_plays_multi_turn_episodes_with_tool_calls_that_are_learned(stack, tmp_path):
    items = calculator_items(TOOL_ITEMS, seed=1, split="train")
    agent = calculator_agent_build(tmp_path / "agent", items, steps=200)
    setup = demo_project(agent)
    owner, project = setup["owner"], setup["project"]
    task_set = project_services.task_set_create(project=project, name="sums", by=owner)
    version = project_services.task_set_import(
        task_set=task_set,
        stream=[
            (json.dumps(item) + "\n").encode()
            for item in items + calculator_items(2, seed=2, split="heldout")
        ],
        file_format="jsonl",
        by=owner,
    ).version
    rule = reward_services.reward_rule_create(project=project, name="exact", spec=ANSWER_RULE, by=owner)
    _, token = project_services.api_token_create(user=owner, name="tools")
    run_id = Client(url=stack.url, token=token).runs.launch(
        project=project.pk,
        name="calculator",
        task_set_version=version.pk,
        reward_rule_version=rule.versions.get().pk,
        tier=setup["tier"].pk,
        method="external_rollouts",
        hyperparameters={
            "group_size": TOOL_GROUP,
            "batch_size": TOOL_BATCH,
            "staleness": 0,
            "learning_rate": 1e-3,
            "eval_items": 0,
            "eval_every": TOOL_STEPS,
            "checkpoint_every": TOOL_STEPS,
            "episode_deadline_seconds": 60,
        },
        max_steps=TOOL_STEPS,
        monitor_actions={"nothing_to_learn": "alert"},
    )["id"]
    played = flywheel_env(
        "run",
        str(CALCULATOR),
        str(run_id),
        *("--max-tokens", "40", "--concurrency", "8"),
        url=stack.url,
        token=token,
        timeout=600,
    )
    finished = Run.objects.get(pk=run_id)
    assert finished.status == Run.Status.SUCCEEDED, finished.error
    assert played["status"] == "succeeded" and played["played"] >= TOOL_STEPS * TOOL_BATCH * TOOL_GROUP
    reported = list(
        Episode.objects.filter(run_id=run_id, status="reported").select_related("trajectory", "item")
    )
    assert len(reported) == played["played"]
    tokenizer = AutoTokenizer.from_pretrained(agent)
    calling = []
    for episode in reported:
        components, turns = episode.trajectory.components, episode.turns
        # The rubric's reward (the last answer's number against the reference) and verifiers' own
        # monitors: the turns, and the calls the environment ran, each one a call the model made.
        assert set(components) == TOOL_COMPONENTS, components
        assert episode.trajectory.step_count == len(turns) == components["num_turns"]
        assert sum(len(turn["tool_calls"]) for turn in turns) == components["total_tool_calls"]
        last = re.findall(r"-?\d+", turns[-1]["completion"])
        assert (
            episode.reward
            == components["correct_answer"]
            == float(last[-1:] == [episode.item.data["reference"]])
        )
        # The first prompt is the environment's system prompt, question and tool, as /v1 renders it.
        assert turns[0]["prompt"] == prompt_text(tokenizer, conversation(episode.item.data))
        if turns[0]["tool_calls"]:
            calling.append(episode)
    # Some episodes called the tool and answered with its result, others answered at once.
    assert 0 < len(calling) < len(reported)
    assert all(episode.turns[0]["tool_calls"][0]["function"]["name"] == "calculate" for episode in calling)
    sums = [episode for episode in calling if SUM.match(call_arguments(episode)["expression"])]
    assert sums, [call_arguments(episode) for episode in calling]
    for episode in sums:
        call, answered = episode.turns[0], episode.turns[-1]
        total = sum(int(n) for n in call_arguments(episode)["expression"].split("+"))
        result = f'<tool_result name="calculate">\n{total}\n</tool_result>'
        assert call["completion"].startswith("<tool_call>") and result in answered["prompt"]
        # Learned on the sampled tokens of each turn: the tool's result is only in a prompt.
        steps = TrajectoryStep.objects.filter(trajectory=episode.trajectory).order_by("index")
        assert [step.data()["token_ids"] for step in steps] == [turn["token_ids"] for turn in episode.turns]
        (learned,) = _episodes([episode.trajectory])
        assert [turn.token_ids for turn in learned.turns] == [turn["token_ids"] for turn in episode.turns]
        assert result in tokenizer.decode(learned.turns[-1].prompt_token_ids)
        assert all(result not in tokenizer.decode(turn.token_ids) for turn in learned.turns)
    # And learned: two-turn episodes (with their calls) and one-turn ones went into the steps.
    learned_turns = set(
        Trajectory.objects.filter(run_id=run_id, learned_in_step__isnull=False).values_list(
            "step_count", flat=True
        )
    )
    assert {1, 2} <= learned_turns, learned_turns


def call_arguments(episode: Episode) -> dict:
    """The arguments of the first call of the episode's first turn (OpenAI's: a JSON string)."""
    return json.loads(episode.turns[0]["tool_calls"][0]["function"]["arguments"])

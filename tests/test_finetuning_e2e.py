"""End to end: a script written for OpenAI's fine-tuning, with only `base_url` and `api_key`
changed, drives reinforcement (a `python` grader), supervised and DPO jobs through a live web server,
real Celery workers, a real learner process and sandboxes on the tiny model, then chats with the
results; and pauses, resumes and cancels a live job. One stack of processes serves the module (the
database is emptied between tests; the processes read it afresh)."""

import json

import httpx
import openai
import pytest

from finetuning.models import FineTuningJob
from projects import services as project_services
from runs.models import MetricPoint, Run, Trajectory
from tests.run_harness import (
    Host,
    demo_project,
    hosts_killed,
    tiny_model,
    wait_for_terminal,
    wait_until,
    worker_env,
)
from tests.web_server import WebServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]
__all__ = ["tiny_model"]

GRADER = {
    "type": "python",
    "name": "mentions_answer",
    "source": (
        "def grade(sample, item) -> float:\n"
        "    return 1.0 if item['reference_answer'] in sample['output_text'] else 0.0\n"
    ),
}
LINES = [
    {"messages": [{"role": "user", "content": f"add {n} to x"}], "reference_answer": "x", "n": n}
    for n in range(4)
]


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, tmp_path_factory):
    """A learner host, a rollout/eval host and a web server, shared by the module's tests."""
    with django_db_blocker.unblock():
        env = worker_env()
    learner_host, rollout_host = Host(env), Host(env)
    with hosts_killed(learner_host, rollout_host):
        learner_host.worker("learner")
        rollout_host.worker("rollout,eval")
        with WebServer(env, tmp_path_factory.mktemp("web") / "web.log") as server:
            yield server


@pytest.fixture
def live(stack, tiny_model):
    setup = demo_project(tiny_model)
    _, token = project_services.api_token_create(user=setup["owner"], name="openai")
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=token, max_retries=0)
    return setup | {"client": client, "url": stack.url, "token": token}


def _upload(client: openai.OpenAI, lines: list[dict], name: str):
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    return client.files.create(file=(name, content), purpose="fine-tune")


def _finished(client: openai.OpenAI, job_id: str):
    wait_until(
        lambda: client.fine_tuning.jobs.retrieve(job_id).status in ("succeeded", "failed", "cancelled"),
        job_id,
    )
    return client.fine_tuning.jobs.retrieve(job_id)


def _answers(client: openai.OpenAI, model: str) -> None:
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "add 1 to x"}], max_tokens=4, temperature=0
    )
    assert chat.model == model and chat.choices[0].message.role == "assistant"


def test_a_reinforcement_job_trains_through_real_workers_and_its_model_answers_at_once(live):
    client = live["client"]
    content = "".join(json.dumps(line) + "\n" for line in LINES).encode()
    training = client.files.create(file=("rft.jsonl", content), purpose="fine-tune")
    assert client.files.content(training.id).content == content
    job = client.fine_tuning.jobs.create(
        model=f"tier-{live['tier'].pk}",
        training_file=training.id,
        suffix="adder",
        seed=3,
        method={
            "type": "reinforcement",
            "reinforcement": {
                "grader": GRADER,
                "hyperparameters": {"n_epochs": 2, "batch_size": 4, "compute_multiplier": 0.5},
            },
        },
    )
    assert job.status == "queued"
    done = _finished(client, job.id)
    run = FineTuningJob.objects.get(pk=job.id).run
    assert done.status == "succeeded", (done.error, run.error)
    assert (run.method, run.max_steps, run.learner_step, run.resolved["group_size"]) == ("grpo", 2, 2, 4)
    assert done.fine_tuned_model == f"ft:tier-{live['tier'].pk}:{live['project'].name}:adder:{job.id[6:14]}"
    assert done.trained_tokens > 0 and done.finished_at >= done.created_at

    events = list(client.fine_tuning.jobs.list_events(job.id, limit=100))
    metrics = [e for e in events if e.type == "metrics"]
    # One per step, step 0 holding the base model's held-out figures (evaluated beside step 1).
    assert sorted(e.data["step"] for e in metrics) == [0, 1, 2]
    last = next(e.data for e in metrics if e.data["step"] == 2)
    assert "train_reward_mean" in last and "full_valid_pass_rate" in last
    statuses = [e.data["status"] for e in events if e.type == "message" and e.data.get("status")]
    assert statuses[0] == "succeeded" and statuses[-1] == "queued"

    checkpoints = client.fine_tuning.jobs.checkpoints.list(job.id)
    assert [c.step_number for c in checkpoints.data] == [2]
    assert checkpoints.data[0].id.startswith("ftckpt-")
    assert checkpoints.data[0].fine_tuned_model_checkpoint == f"{done.fine_tuned_model}:ckpt-step-2"

    results = client.files.content(done.result_files[0]).text.splitlines()
    assert results[0].startswith("step,") and "reward/mean" in results[0]
    assert [row.split(",")[0] for row in results[1:]] == ["0", "1", "2"]

    assert done.fine_tuned_model in [m.id for m in client.models.list()]
    for model in (done.fine_tuned_model, checkpoints.data[0].fine_tuned_model_checkpoint):
        chat = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "add 1 to x"}], max_tokens=4, temperature=0
        )
        assert chat.model == model and chat.choices[0].message.role == "assistant"
    assert Run.objects.get(pk=run.pk).status == Run.Status.SUCCEEDED
    _the_same_run_launched_over_rest_draws_the_same_curve(live, run)


MULTI_GRADER = {
    "type": "multi",
    "name": "exact_and_mentions",
    "graders": {
        "exact": {
            "type": "string_check",
            "name": "exact",
            "input": "{{ sample.output_text }}",
            "reference": "{{ item.reference_answer }}",
            "operation": "eq",
        },
        "mentions": GRADER,
    },
    "calculate_output": "0.25 * exact + 0.75 * mentions",
}
# Conversations, as chat fine-tuning data is: a system message, an earlier exchange, the question.
CHAT_LINES = [
    {
        "messages": [
            {"role": "system", "content": "You rewrite additions."},
            {"role": "user", "content": f"add {n}"},
            {"role": "assistant", "content": "to what?"},
            {"role": "user", "content": "to x"},
        ],
        "reference_answer": "x",
    }
    for n in range(4)
]


def test_a_reinforcement_job_with_a_multi_grader_on_conversations_scores_each_grader(live):
    client = live["client"]
    training = _upload(client, CHAT_LINES, "chat-rft.jsonl")
    job = client.fine_tuning.jobs.create(
        model=f"tier-{live['tier'].pk}",
        training_file=training.id,
        suffix="multi",
        method={
            "type": "reinforcement",
            "reinforcement": {"grader": MULTI_GRADER, "hyperparameters": {"n_epochs": 1, "batch_size": 4}},
        },
    )
    done = _finished(client, job.id)
    run = FineTuningJob.objects.get(pk=job.id).run
    assert done.status == "succeeded", (done.error, run.error)
    scored = Trajectory.objects.filter(run=run, outcome=Trajectory.Outcome.SCORED)
    assert scored.exists()
    for trajectory in scored:
        parts = trajectory.components
        assert set(parts) == {"exact", "mentions"}
        assert trajectory.reward == pytest.approx(0.25 * parts["exact"] + 0.75 * parts["mentions"])
        # The item's prompt is the whole conversation, the system message first.
        assert trajectory.item.data["messages"][0] == {"role": "system", "content": "You rewrite additions."}
    _answers(client, done.fine_tuned_model)


# Flywheel's figures that depend on what was sampled and learned (not timings, not rates per second).
CURVE = ("reward/", "train_reward", "full_valid", "heldout", "learner/loss", "learner/kl")


def _curve(run: Run) -> dict[tuple[int, str], float]:
    points = MetricPoint.objects.filter(run=run).values_list("step", "name", "value")
    return {(step, name): value for step, name, value in points if name.startswith(CURVE)}


def _the_same_run_launched_over_rest_draws_the_same_curve(live, job_run: Run) -> None:
    """A GRPO run launched over REST (as the UI's launch form does) on the job's task set version,
    grader (reward rule version) and tier, with the hyperparameters the job resolved to and the same
    seed, learns the same curve, step by step, and ends on the same held-out figures."""
    body = {
        "project": live["project"].pk,
        "name": "the same, by hand",
        "task_set_version": job_run.task_set_version_id,
        "reward_rule_version": job_run.reward_rule_version_id,
        "tier": job_run.tier_id,
        "method": "grpo",
        "hyperparameters": job_run.hyperparameters,
        "max_steps": job_run.max_steps,
        "eval_split": job_run.eval_split,
        "monitor_actions": {"nothing_to_learn": "alert"},
    }
    answer = httpx.post(
        f"{live['url']}/api/v1/runs", json=body, headers={"Authorization": f"Bearer {live['token']}"}
    )
    assert answer.status_code == 201, answer.text
    by_hand = wait_for_terminal(answer.json()["id"])
    assert by_hand.status == Run.Status.SUCCEEDED and by_hand.resolved == job_run.resolved
    ours, theirs = _curve(job_run), _curve(by_hand)
    assert ours and {step for step, _ in ours} == {0, 1, 2}
    assert theirs == ours


SUPERVISED_LINES = [
    {
        "messages": [
            {"role": "system", "content": "Answer with code."},
            {"role": "user", "content": f"add {n} to x"},
            {"role": "assistant", "content": f"x + {n}"},
        ]
    }
    for n in range(3)
] + [
    # A line with tools: trained through the template (or Flywheel's tool protocol), by a real learner.
    {
        "messages": [
            {"role": "user", "content": "what is x?"},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"name": "x"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "3"},
            {"role": "assistant", "content": "x is 3"},
        ],
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
    }
]
DPO_LINES = [
    {
        "input": {"messages": [{"role": "user", "content": f"add {n} to x"}]},
        "preferred_output": [{"role": "assistant", "content": f"x + {n}"}],
        "non_preferred_output": [{"role": "assistant", "content": f"x - {n}"}],
    }
    for n in range(4)
]


@pytest.mark.parametrize(
    ("method", "lines", "hyperparameters", "flywheel_method"),
    [
        ("supervised", SUPERVISED_LINES, {"n_epochs": 2, "batch_size": 4}, "sft"),
        ("dpo", DPO_LINES, {"n_epochs": 2, "batch_size": 4, "beta": 0.2}, "dpo"),
    ],
)
def test_supervised_and_dpo_jobs_train_through_real_workers(
    live, method, lines, hyperparameters, flywheel_method
):
    client = live["client"]
    training = _upload(client, lines, f"{method}.jsonl")
    job = client.fine_tuning.jobs.create(
        model=f"tier-{live['tier'].pk}",
        training_file=training.id,
        suffix=method,
        seed=5,
        method={"type": method, method: {"hyperparameters": hyperparameters}},
    )
    done = _finished(client, job.id)
    run = FineTuningJob.objects.get(pk=job.id).run
    assert done.status == "succeeded", (done.error, run.error)
    assert (run.method, run.max_steps, run.learner_step) == (flywheel_method, 2, 2)
    assert done.trained_tokens > 0
    assert done.method.type == method
    checkpoints = client.fine_tuning.jobs.checkpoints.list(job.id)
    assert [c.step_number for c in checkpoints.data] == [2]
    metrics = [e for e in client.fine_tuning.jobs.list_events(job.id, limit=100) if e.type == "metrics"]
    assert {e.data["step"] for e in metrics} >= {1, 2}
    _answers(client, done.fine_tuned_model)
    _answers(client, checkpoints.data[0].fine_tuned_model_checkpoint)


def test_a_live_job_pauses_resumes_and_cancels(live):
    client = live["client"]
    training = _upload(client, SUPERVISED_LINES, "long.jsonl")
    # Many steps, so that the job is still training while it is paused, resumed and cancelled.
    job = client.fine_tuning.jobs.create(
        model=f"tier-{live['tier'].pk}",
        training_file=training.id,
        method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 200, "batch_size": 4}}},
    )
    run_id = FineTuningJob.objects.get(pk=job.id).run_id
    wait_until(lambda: Run.objects.get(pk=run_id).learner_step >= 1, "the first step")
    assert client.fine_tuning.jobs.pause(job.id).status in ("running", "paused")
    wait_until(lambda: client.fine_tuning.jobs.retrieve(job.id).status == "paused", "paused")
    paused_at = Run.objects.get(pk=run_id).learner_step
    with pytest.raises(openai.ConflictError) as refused:
        client.fine_tuning.jobs.pause(job.id)
    assert refused.value.body["code"] == "invalid_state"

    assert client.fine_tuning.jobs.resume(job.id).status in ("queued", "running")
    wait_until(lambda: Run.objects.get(pk=run_id).learner_step > paused_at, "a step after resuming")
    assert client.fine_tuning.jobs.retrieve(job.id).status == "running"

    assert client.fine_tuning.jobs.cancel(job.id).status == "cancelled"
    wait_until(lambda: Run.objects.get(pk=run_id).status == Run.Status.CANCELLED, "cancelled")
    done = client.fine_tuning.jobs.retrieve(job.id)
    assert done.status == "cancelled" and done.fine_tuned_model is None and done.finished_at
    with pytest.raises(openai.ConflictError):
        client.fine_tuning.jobs.resume(job.id)

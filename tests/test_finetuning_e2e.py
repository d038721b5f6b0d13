"""End to end: a script written for OpenAI's fine-tuning, with only `base_url` and `api_key`
changed, drives reinforcement (a `python` grader), supervised and DPO jobs through a live web server,
real Celery workers, a real learner process and sandboxes on the tiny model, then chats with the
results; pauses, resumes and cancels a live job; and an RFT job on the demo tasks learns the curve
of a GRPO run launched on the launch page. Each job is created `validating_files` and an eval worker
validates its files and launches its run. One stack of processes serves the module (the database is
emptied between tests; the processes read it afresh)."""

import json

import openai
import pytest
from django.test import Client

from finetuning.models import FineTuningJob
from projects import services as project_services
from projects.models import TaskItem
from runs.models import MetricPoint, Run, Trajectory
from tests.run_harness import (
    RUN_TIMEOUT_SECONDS,
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
        learner_host.worker("learner,control")
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


def _finished(client: openai.OpenAI, job_id: str, timeout: float = RUN_TIMEOUT_SECONDS):
    wait_until(
        lambda: client.fine_tuning.jobs.retrieve(job_id).status in ("succeeded", "failed", "cancelled"),
        job_id,
        timeout,
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
    assert job.status == "validating_files"  # answered at once; an eval worker reads the file
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
    # Newest first: validating its file, then queued as a run, then the run's course to success.
    assert statuses[0] == "succeeded" and statuses[-2:] == ["queued", "validating_files"]
    assert "running" in statuses

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


def _samples(run: Run) -> list[tuple]:
    """Every episode: its step, its item's place, its place in the group, what was sampled, the
    reward and the step that learned it."""
    rows = Trajectory.objects.filter(run=run).values_list(
        "batch__step", "item__position", "sample_index", "completion_text", "reward", "learned_in_step"
    )
    return sorted(rows, key=lambda row: row[:3])


def _rft_line(item: TaskItem) -> dict:
    """A demo task (a code item) as a reinforcement fine-tuning line: its prompt as the user's
    message, its code fields and its metadata's fields as the line's own (the run breaks held-out
    figures down by `family`)."""
    code = {name: item.data[name] for name in ("tests", "entry_point", "reference_solution")}
    return {"messages": [{"role": "user", "content": item.data["prompt"]}]} | code | item.data["metadata"]


# Two runs in turn (a project runs one at a time; the second starts as the first ends) with held-out
# evaluations in sandboxes: 22 s alone, more beside the other suite.
@pytest.mark.timeout(600)
def test_an_rft_job_on_the_demo_tasks_learns_the_curve_of_a_grpo_run_launched_on_the_launch_page(live):
    """The demo task set (the family `make up` seeds, at the tests' size) written as RFT files and
    graded by its unit tests (Flywheel's own grader type in the job's grader: an extension), created
    through the official client; and a GRPO run launched by submitting the launch page's form, on
    the demo task set version, the demo rule, the same tier, hyperparameters and seed. The same
    curve, step by step: rewards, losses and held-out figures."""
    client, seed = live["client"], 11
    items = list(live["version"].items.order_by("position"))
    training = _upload(client, [_rft_line(i) for i in items if i.split == "train"], "demo-train.jsonl")
    heldout = _upload(client, [_rft_line(i) for i in items if i.split == "heldout"], "demo-heldout.jsonl")
    job = client.fine_tuning.jobs.create(
        model=f"tier-{live['tier'].pk}",
        training_file=training.id,
        validation_file=heldout.id,
        seed=seed,
        method={
            "type": "reinforcement",
            "reinforcement": {
                "grader": {"type": "unit_tests", "name": "tests"},
                "hyperparameters": {"n_epochs": 1, "batch_size": 4, "compute_multiplier": 0.5},
            },
        },
    )
    assert job.status == "validating_files"

    browser = Client()
    browser.force_login(live["owner"])
    page = f"/projects/{live['project'].pk}/runs/new/"
    assert browser.get(page).status_code == 200
    submitted = browser.post(
        page,
        {
            "name": "demo, launched by hand",
            "task_set_version": live["version"].pk,
            "train_split": "train",
            "eval_split": "heldout",
            "reward_rule_version": live["rule"].versions.get().pk,
            "tier": live["tier"].pk,
            "method": "grpo",
            "max_steps": 2,
            "priority": 0,
            "hp_seed": str(seed),
            "hp_batch_size": "4",
            "hp_group_size": "4",
        },
    )
    assert submitted.status_code == 302, submitted.content.decode()[-2000:]
    by_hand = wait_for_terminal(Run.objects.get(name="demo, launched by hand").pk)

    done = _finished(client, job.id)
    job_run = FineTuningJob.objects.get(pk=job.id).run
    assert done.status == "succeeded", (done.error, job_run.error)
    assert by_hand.status == Run.Status.SUCCEEDED, by_hand.error
    assert (job_run.max_steps, job_run.resolved) == (by_hand.max_steps, by_hand.resolved)
    assert job_run.task_set_version.items.filter(kind="code").count() == len(items)
    ours, theirs = _curve(job_run), _curve(by_hand)
    assert {step for step, _ in ours} == {0, 1, 2}
    assert {(0, "heldout/pass_rate"), (2, "heldout/pass_rate"), (1, "reward/mean")} <= set(ours)
    assert theirs == ours
    # The same samples of the same prompts, scored the same: 2 steps x 4 items x 4 completions.
    samples = _samples(job_run)
    assert len(samples) == 32 and all(text for _, _, _, text, _, _ in samples)
    assert _samples(by_hand) == samples


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
    wait_until(lambda: FineTuningJob.objects.get(pk=job.id).run_id is not None, "its files validated")
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

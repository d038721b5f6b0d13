"""OpenAI's fine-tuning API at /v1/ (finetuning/), driven in process by the official `openai`
client over a WSGI transport: every route it calls exists, files round-trip byte for byte and are
checked against their method with line and field, jobs are runs, and refusals are OpenAI's.

A job is created `validating_files`; the task that validates its files and launches its run
(`finetuning.tasks.job_launch`, enqueued after commit, which the test's transaction never reaches)
is run here by its body, as a worker runs it (`launched`)."""

import inspect
import json
from datetime import timedelta

import httpx
import openai
import pytest
from django.core.exceptions import ValidationError
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.utils import timezone

from core.roles import Role
from finetuning import tasks
from finetuning.models import FineTuningFile, FineTuningJob
from projects import services as project_services
from projects.models import TaskSet
from runs import lifecycle
from runs.models import MetricPoint, Run
from tiers import services as tier_services

CHAT_WITH_TOOLS = {
    "messages": [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
        {"role": "assistant", "content": "It is 18C and sunny in Paris.", "weight": 1},
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
}
WEIGHTED = {
    "messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "5", "weight": 0},
        {"role": "user", "content": "Again?"},
        {"role": "assistant", "content": "4", "weight": 1},
    ]
}
DPO_PAIR = {
    "input": {"messages": [{"role": "user", "content": "Say hi"}]},
    "preferred_output": [{"role": "assistant", "content": "Hi!"}],
    "non_preferred_output": [{"role": "assistant", "content": "Go away."}],
}
RFT_ITEM = {"messages": [{"role": "user", "content": "3+4?"}], "reference_answer": "7", "difficulty": 2}


def jsonl(*lines: dict) -> bytes:
    # Not json.dumps' defaults: the round trip must give back exactly these bytes, spacing included.
    return "".join(
        json.dumps(line, separators=(", ", ": "), ensure_ascii=False) + "\n" for line in lines
    ).encode()


def openai_client(user, project_header: str | None = None, default_project=None) -> openai.OpenAI:
    _, raw = project_services.api_token_create(user=user, name="openai", default_project=default_project)
    transport = httpx.WSGITransport(app=get_wsgi_application())
    return openai.OpenAI(
        base_url="http://testserver/v1",
        api_key=raw,
        max_retries=0,
        project=project_header,
        http_client=httpx.Client(transport=transport, base_url="http://testserver/v1"),
    )


@pytest.fixture(autouse=True)
def connections_kept():
    """In process, the test's database connection serves the requests: a request's end must not
    close it (Django's test client disconnects the same handlers)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def lab(team, tmp_path):
    (tmp_path / "model").mkdir()
    tier = tier_services.tier_create(
        project=team["project"], by=team["owner"], name="small", base_model=str(tmp_path / "model")
    )
    return team | {"tier": tier, "client": openai_client(team["owner"])}


def upload(client: openai.OpenAI, content: bytes, name: str = "train.jsonl"):
    return client.files.create(file=(name, content), purpose="fine-tune")


def launched(client: openai.OpenAI, **create):
    """A job created through the client, then its files validated and its run launched by the task's
    body (as the eval worker runs it after commit): the job as the client then reads it."""
    job = client.fine_tuning.jobs.create(**create)
    assert job.status == "validating_files" and FineTuningJob.objects.get(pk=job.id).run_id is None
    tasks.job_launch(job.id)
    return client.fine_tuning.jobs.retrieve(job.id)


# --- routes ------------------------------------------------------------------------------------

ARGUMENTS = {
    "file_id": "file-missing",
    "fine_tuning_job_id": "ftjob-missing",
    "file": ("x.jsonl", b"{}\n"),
    "purpose": "fine-tune",
    "model": "tier-999999",
    "training_file": "file-missing",
    "grader": {"type": "string_check", "name": "x", "input": "a", "reference": "a", "operation": "eq"},
    "model_sample": "a",
    "fine_tuned_model_checkpoint": "ft:small:missing:ckpt-step-1",
    "permission_id": "cp_missing",
    "project_ids": ["1"],
}


def client_methods(resource) -> list[tuple[str, object]]:
    """The public methods a resource of the official client defines (not its raw/streaming wrappers)."""
    return [
        (name, getattr(resource, name))
        for name, member in inspect.getmembers(type(resource), inspect.isfunction)
        if not name.startswith("_") and name not in ("wait_for_processing",)
    ]


@pytest.mark.filterwarnings("ignore:The `.content\\(\\)` method should be used instead")
def test_every_route_of_the_clients_files_fine_tuning_jobs_and_graders_resources_is_served(lab):
    client = lab["client"]
    resources = {
        "files": client.files,
        "fine_tuning.jobs": client.fine_tuning.jobs,
        "fine_tuning.jobs.checkpoints": client.fine_tuning.jobs.checkpoints,
        "fine_tuning.alpha.graders": client.fine_tuning.alpha.graders,
        "fine_tuning.checkpoints.permissions": client.fine_tuning.checkpoints.permissions,
    }
    called = []
    for resource_name, resource in resources.items():
        for name, method in client_methods(resource):
            required = [
                p.name
                for p in inspect.signature(method).parameters.values()
                if p.default is inspect.Parameter.empty and p.kind != p.VAR_KEYWORD
            ]
            try:
                method(**{p: ARGUMENTS[p] for p in required})
            except openai.APIStatusError as exc:
                # The catch-all of /v1/ answers "no such endpoint"; a served route answers its own refusal.
                assert "no such endpoint" not in exc.message, f"{resource_name}.{name}: {exc.message}"
            called.append(f"{resource_name}.{name}")
    assert {
        "files.create",
        "files.content",
        "fine_tuning.jobs.pause",
        "fine_tuning.jobs.checkpoints.list",
    } <= set(called)
    assert {"fine_tuning.alpha.graders.run", "fine_tuning.alpha.graders.validate"} <= set(called)
    assert {
        f"fine_tuning.checkpoints.permissions.{m}" for m in ("create", "retrieve", "list", "delete")
    } <= set(called)
    assert len(called) >= 20


# --- files -------------------------------------------------------------------------------------


def test_files_in_openais_formats_upload_list_and_give_their_bytes_back(lab):
    client = lab["client"]
    content = jsonl(CHAT_WITH_TOOLS, WEIGHTED, RFT_ITEM)
    uploaded = upload(client, content)
    assert (uploaded.object, uploaded.purpose, uploaded.bytes, uploaded.filename) == (
        "file",
        "fine-tune",
        len(content),
        "train.jsonl",
    )
    assert uploaded.id.startswith("file-")
    assert client.files.content(uploaded.id).content == content
    second = upload(client, jsonl(DPO_PAIR), "pairs.jsonl")
    listed = client.files.list(limit=1)
    assert [f.id for f in listed.data] == [second.id] and listed.has_more
    assert [f.id for f in client.files.list(after=second.id).data] == [uploaded.id]
    assert client.files.retrieve(uploaded.id).bytes == len(content)
    assert client.files.delete(second.id).deleted is True
    assert [f.id for f in client.files.list()] == [uploaded.id]


def test_a_bad_file_is_refused_naming_its_line_and_field_and_nothing_is_kept(lab):
    bad = dict(WEIGHTED, messages=[{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}])
    with pytest.raises(openai.BadRequestError) as refused:
        upload(lab["client"], jsonl(WEIGHTED, bad))
    error = refused.value.body
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["param"], error["code"]) == ("file", "invalid_file_format")
    assert "line 2, field 'messages[1].role': must be one of system, developer" in error["message"]
    with pytest.raises(openai.BadRequestError) as not_json:
        upload(lab["client"], b'{"messages": []}\n{oops\n')
    assert (
        not_json.value.body["message"].startswith("line 1, field 'messages'")
        or "line 2" in not_json.value.body["message"]
    )
    assert not FineTuningFile.objects.exists()


def test_a_wrong_purpose_an_unknown_model_and_a_viewer_are_refused_in_openais_shape(lab):
    with pytest.raises(openai.BadRequestError) as purpose:
        lab["client"].files.create(file=("a.jsonl", jsonl(WEIGHTED)), purpose="assistants")
    assert (purpose.value.body["param"], purpose.value.body["code"]) == ("purpose", "invalid_value")
    training = upload(lab["client"], jsonl(WEIGHTED))
    with pytest.raises(openai.NotFoundError) as unknown:
        lab["client"].fine_tuning.jobs.create(model="gpt-4o-mini-2024-07-18", training_file=training.id)
    assert (unknown.value.body["param"], unknown.value.body["code"]) == ("model", "model_not_found")
    with pytest.raises(openai.PermissionDeniedError):
        upload(openai_client(lab[Role.VIEWER]), jsonl(WEIGHTED))
    with pytest.raises(openai.NotFoundError):  # another project's file is absent, not forbidden
        openai_client(lab["outsider"]).files.retrieve(training.id)
    assert not FineTuningJob.objects.exists() and not Run.objects.exists()


# --- jobs --------------------------------------------------------------------------------------


def test_a_supervised_job_is_a_run_on_the_file_as_a_task_set_and_is_cancelled(lab):
    client = lab["client"]
    training = upload(client, jsonl(CHAT_WITH_TOOLS, WEIGHTED))
    job = launched(
        client,
        model=lab["tier"].name,
        training_file=training.id,
        suffix="weather",
        seed=42,
        metadata={"team": "bots"},
        method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2, "batch_size": 1}}},
    )
    assert (job.object, job.status, job.model, job.seed, job.training_file) == (
        "fine_tuning.job",
        "queued",
        "small",
        42,
        training.id,
    )
    assert job.fine_tuned_model is None and job.metadata == {"team": "bots"}
    stored = FineTuningJob.objects.get(pk=job.id)
    assert stored.fine_tuned_model == f"ft:small:alpha:weather:{job.id.removeprefix('ftjob-')[:8]}"
    run = stored.run
    assert (run.method, run.max_steps, run.resolved["epochs"], run.resolved["seed"]) == ("sft", 4, 2, 42)
    assert run.eval_split == "train"  # no validation file: held-out figures are on the training lines
    items = list(stored.task_set_version.items.order_by("position"))
    assert [i.external_id for i in items] == [f"{training.id}:line-1", f"{training.id}:line-2"]
    assert items[0].data["reference"] == "It is 18C and sunny in Paris."
    assert items[0].data["messages"][-1] == {"role": "user", "content": "[tool result call_1] 18C, sunny"}
    assert items[1].data["messages"] == [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": "Again?"},
    ]
    assert items[1].data["reference"] == "4"
    # The line with tools also keeps its conversation for the template's `tools=` (test_finetuning_tools).
    assert items[0].data["tool_chat"]["tools"] == CHAT_WITH_TOOLS["tools"]
    assert items[0].data["tool_chat"]["messages"][3]["name"] == "get_weather"
    assert "tool_chat" not in items[1].data
    assert TaskSet.objects.get(pk=stored.task_set_version.task_set_id).name == f"openai {training.id}"
    assert [j.id for j in client.fine_tuning.jobs.list(metadata={"team": "bots"})] == [job.id]
    assert client.fine_tuning.jobs.list(metadata={"team": "other"}).data == []
    paused = client.fine_tuning.jobs.pause(job.id)
    assert paused.status == "paused"
    assert client.fine_tuning.jobs.resume(job.id).status == "queued"
    assert client.fine_tuning.jobs.cancel(job.id).status == "cancelled"
    with pytest.raises(openai.ConflictError) as again:
        client.fine_tuning.jobs.cancel(job.id)
    assert again.value.body["code"] == "invalid_state"
    events = client.fine_tuning.jobs.list_events(job.id)
    assert [e.message for e in events.data][:2] == ["cancelled", "resumed; queued"]
    assert [e.message for e in events.data][-4:] == [
        "queued",
        "Files validated, moving job to queued state",
        f"Validating training file: {training.id}",
        f"Created fine-tuning job: {job.id}",
    ]
    assert {e.type for e in events.data} == {"message"}
    finished = client.fine_tuning.jobs.retrieve(job.id)
    assert finished.status == "cancelled" and len(finished.result_files) == 1
    csv_text = client.files.content(finished.result_files[0]).text
    assert csv_text.splitlines()[0] == "step"  # nothing trained before it was cancelled


def test_estimated_finish_follows_the_step_rate_once_two_steps_are_done(lab):
    client = lab["client"]
    training = upload(client, jsonl(WEIGHTED))
    job = launched(
        client,
        model="small",
        training_file=training.id,
        method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 10, "batch_size": 1}}},
    )
    run = FineTuningJob.objects.get(pk=job.id).run
    assert run.max_steps == 10 and job.estimated_finish is None
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    start = timezone.now().replace(microsecond=0)
    # Step 0 (the base model's evaluation) does not count towards the rate.
    for step, offset in ((0, -100), (1, 0), (2, 30)):
        MetricPoint.objects.create(
            run=run, step=step, name="learner/loss", value=1.0, created_at=start + timedelta(seconds=offset)
        )
        if step == 1:
            assert client.fine_tuning.jobs.retrieve(job.id).estimated_finish is None  # one step: no rate
    # 30 s a step, 8 steps to go after step 2.
    assert client.fine_tuning.jobs.retrieve(job.id).estimated_finish == int(start.timestamp()) + 30 + 8 * 30
    Run.objects.filter(pk=run.pk).update(status=Run.Status.PAUSED)
    assert client.fine_tuning.jobs.retrieve(job.id).estimated_finish is None


def test_a_dpo_job_trains_pairs_and_a_file_checked_against_its_method_names_the_line(lab):
    client = lab["client"]
    pairs = upload(
        client, jsonl(DPO_PAIR, DPO_PAIR | {"preferred_output": [{"role": "assistant", "content": "Hello"}]})
    )
    job = launched(
        client,
        model=f"tier-{lab['tier'].pk}",
        training_file=pairs.id,
        method={"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.2}}},
    )
    run = FineTuningJob.objects.get(pk=job.id).run
    assert (run.method, run.resolved["beta"]) == ("dpo", 0.2)
    item = run.task_set_version.items.order_by("position").first()
    assert (item.data["metadata"]["chosen"], item.data["metadata"]["rejected"]) == ("Hi!", "Go away.")
    chat = upload(client, jsonl({"messages": [{"role": "user", "content": "3+4?"}]}))
    failed = launched(client, model=f"tier-{lab['tier'].pk}", training_file=chat.id)
    assert (failed.status, failed.error.param, failed.error.code) == (
        "failed",
        "training_file",
        "invalid_training_file",
    )
    assert "line 1, field 'messages': holds no assistant message" in failed.error.message
    with pytest.raises(openai.BadRequestError) as hyper:
        client.fine_tuning.jobs.create(
            model=f"tier-{lab['tier'].pk}",
            training_file=pairs.id,
            method={"type": "dpo", "dpo": {"hyperparameters": {"n_epochs": 0}}},
        )
    assert hyper.value.body["param"] == "method.dpo.hyperparameters.n_epochs"
    assert FineTuningJob.objects.count() == 2 and Run.objects.count() == 1  # the failed one kept, no run


def test_a_reinforcement_grader_reads_a_lines_own_fields_and_a_bad_grader_is_refused(lab):
    client = lab["client"]
    items = upload(client, jsonl(RFT_ITEM, RFT_ITEM | {"reference_answer": "8"}))
    grader = {
        "type": "string_check",
        "name": "exact",
        "input": "{{ sample.output_text }}",
        "reference": "{{ item.reference_answer }}",
        "operation": "eq",
    }
    job = launched(
        client,
        model=f"tier-{lab['tier'].pk}",
        training_file=items.id,
        validation_file=items.id,
        method={
            "type": "reinforcement",
            "reinforcement": {"grader": grader, "hyperparameters": {"n_epochs": 1}},
        },
    )
    run = FineTuningJob.objects.get(pk=job.id).run
    assert run.method == "grpo" and run.eval_split == "heldout" and run.resolved["group_size"] == 8
    assert run.reward_rule_version.spec["reference"] == "{{ item.metadata.reference_answer }}"
    item = run.task_set_version.items.filter(split="train").order_by("position").first()
    assert (item.data["reference_answer"], item.data["difficulty"], item.data["reference"]) == ("7", 2, "7")
    assert job.method.reinforcement.grader.reference == "{{ item.reference_answer }}"  # read back as sent
    multi = {
        "type": "multi",
        "graders": {"exact": grader, "close": grader | {"operation": "ilike"}},
        "calculate_output": "0.7 * exact + 0.3 * close",
    }
    combined = launched(
        client,
        model=f"tier-{lab['tier'].pk}",
        training_file=items.id,
        method={"type": "reinforcement", "reinforcement": {"grader": multi}},
    )
    spec = FineTuningJob.objects.get(pk=combined.id).run.reward_rule_version.spec
    assert spec["graders"]["close"]["reference"] == "{{ item.metadata.reference_answer }}"
    with pytest.raises(openai.BadRequestError) as bad:
        client.fine_tuning.jobs.create(
            model=f"tier-{lab['tier'].pk}",
            training_file=items.id,
            method={
                "type": "reinforcement",
                "reinforcement": {"grader": {"type": "string_check", "name": "t", "operation": "eq"}},
            },
        )
    assert (bad.value.body["param"], bad.value.body["code"]) == (
        "method.reinforcement.grader.input",
        "invalid_grader",
    )
    with pytest.raises(openai.BadRequestError) as unknown:
        client.fine_tuning.jobs.create(
            model=f"tier-{lab['tier'].pk}",
            training_file=items.id,
            method={"type": "reinforcement", "reinforcement": {"grader": {"type": "vibes", "name": "t"}}},
        )
    assert unknown.value.body["param"] == "method.reinforcement.grader.type"
    assert "unknown grader type 'vibes'" in unknown.value.body["message"]
    assert FineTuningJob.objects.count() == 2


def test_the_openai_project_header_chooses_among_the_callers_projects(lab):
    other = project_services.project_create(name="gamma", by=lab["owner"])
    with pytest.raises(openai.BadRequestError) as ambiguous:
        lab["client"].files.list()
    assert ambiguous.value.body["param"] == "OpenAI-Project"
    by_name = openai_client(lab["owner"], project_header="gamma")
    uploaded = upload(by_name, jsonl(WEIGHTED))
    assert FineTuningFile.objects.get(pk=uploaded.id).project == other
    assert [f.id for f in openai_client(lab["owner"], project_header=str(other.pk)).files.list()] == [
        uploaded.id
    ]
    assert openai_client(lab["owner"], project_header="alpha").files.list().data == []


def test_a_tokens_default_project_is_used_when_no_header_names_one(lab):
    other = project_services.project_create(name="gamma", by=lab["owner"])
    with pytest.raises(openai.BadRequestError) as ambiguous:
        lab["client"].files.list()
    assert "OpenAI-Project" in ambiguous.value.body["message"]
    assert ambiguous.value.body["code"] == "project_required"
    defaulted = openai_client(lab["owner"], default_project=other)
    uploaded = upload(defaulted, jsonl(WEIGHTED))
    assert FineTuningFile.objects.get(pk=uploaded.id).project == other
    # The header still wins over the token's default.
    header = defaulted.with_options(default_headers={"OpenAI-Project": "alpha"})
    assert header.files.list().data == []
    # A project the token's user has left is refused, naming the header.
    other.memberships.filter(user=lab["owner"]).delete()
    with pytest.raises(openai.BadRequestError) as left:
        defaulted.files.list()
    assert left.value.body["param"] == "OpenAI-Project" and "no longer" in left.value.body["message"]


def test_a_token_default_project_must_be_one_of_the_users(lab):
    stranger = project_services.project_create(name="theirs", by=lab["viewer"])
    with pytest.raises(ValidationError) as refused:
        project_services.api_token_create(user=lab["owner"], name="t", default_project=stranger)
    assert "default_project" in refused.value.message_dict


# --- graders -----------------------------------------------------------------------------------

PYTHON_GRADER = {
    "type": "python",
    "name": "exact",
    "source": (
        "def grade(sample, item) -> float:\n"
        "    return 1.0 if sample['output_text'] == item['answer'] else 0.0\n"
    ),
}


def test_graders_validate_and_run_as_openais_endpoints_do(lab):
    graders = lab["client"].fine_tuning.alpha.graders
    check = {
        "type": "string_check",
        "name": "eq",
        "input": "{{ sample.output_text }}",
        "reference": "{{ item.answer }}",
    }
    with pytest.raises(openai.BadRequestError) as bad:
        graders.validate(grader=check)  # no operation
    assert bad.value.body["param"].startswith("grader") and bad.value.body["code"] == "invalid_grader"
    with pytest.raises(openai.BadRequestError) as unknown:
        graders.validate(grader={"type": "vibes", "name": "t"})
    assert (unknown.value.body["param"], unknown.value.body["code"]) == ("grader.type", "invalid_grader")
    # Flywheel's own grader types are accepted beside OpenAI's (an extension; docs/openai-migration.md).
    assert graders.validate(grader={"type": "unit_tests", "name": "t"}).grader.type == "unit_tests"
    assert graders.validate(grader=check | {"operation": "eq"}).grader.name == "eq"
    multi = {
        "type": "multi",
        "graders": {"eq": check | {"operation": "eq"}, "like": check | {"operation": "ilike"}},
        "calculate_output": "0.5 * eq + 0.5 * like",
    }
    ran = graders.run(grader=multi, model_sample="Seven", item={"answer": "seven"})
    assert ran.reward == 0.5 and ran.sub_rewards == {"eq": 0.0, "like": 1.0}
    assert ran.metadata.type == "multi" and not any(v for k, v in ran.metadata.errors if k.endswith("_error"))


def test_a_python_grader_runs_in_a_sandbox_and_its_failure_is_reported(lab):
    graders = lab["client"].fine_tuning.alpha.graders
    assert graders.run(grader=PYTHON_GRADER, model_sample="7", item={"answer": "7"}).reward == 1.0
    failed = graders.run(grader=PYTHON_GRADER, model_sample="7", item={})
    assert failed.reward == 0.0 and failed.metadata.errors.python_grader_runtime_error is True
    assert "answer" in failed.metadata.errors.python_grader_runtime_error_details
    with pytest.raises(openai.PermissionDeniedError):  # running code in sandboxes is a launcher's
        openai_client(lab[Role.VIEWER]).fine_tuning.alpha.graders.run(grader=PYTHON_GRADER, model_sample="7")


def test_a_succeeded_jobs_fine_tuned_model_is_trained_further_from_its_last_checkpoint(lab):
    from runs.models import Checkpoint

    client = lab["client"]
    training = upload(client, jsonl(WEIGHTED))
    first = launched(client, model="small", training_file=training.id, suffix="one")
    stored = FineTuningJob.objects.get(pk=first.id)
    with pytest.raises(openai.BadRequestError) as unfinished:
        client.fine_tuning.jobs.create(model=stored.fine_tuned_model, training_file=training.id)
    assert (unfinished.value.body["param"], unfinished.value.body["code"]) == ("model", "model_not_available")
    Run.objects.filter(pk=stored.run_id).update(status=Run.Status.SUCCEEDED)  # as the learner leaves it
    checkpoint = Checkpoint.objects.create(run=stored.run, step=1, policy_version=1, path="x")
    assert client.fine_tuning.jobs.retrieve(first.id).fine_tuned_model == stored.fine_tuned_model
    second = launched(client, model=stored.fine_tuned_model, training_file=training.id)
    run = FineTuningJob.objects.get(pk=second.id).run
    assert (run.parent_id, run.parent_checkpoint_id, run.tier_id) == (
        stored.run_id,
        checkpoint.pk,
        lab["tier"].pk,
    )


def test_list_parameters_are_checked_before_any_lookup(lab):
    for query in ("limit=0", "limit=%C2%B2", "limit=99999999999999999999", "after=file-nope"):
        with pytest.raises(openai.BadRequestError) as refused:
            lab["client"].get(f"/files?{query}", cast_to=object)
        assert refused.value.body["param"] == query.split("=")[0]


def test_a_failed_jobs_error_says_what_failed_where(lab):
    training = upload(lab["client"], jsonl(WEIGHTED))
    job = launched(lab["client"], model="small", training_file=training.id)
    run = FineTuningJob.objects.get(pk=job.id).run
    lifecycle.run_fail(run=run, message="out of memory at step 3", where="learner")
    failed = lab["client"].fine_tuning.jobs.retrieve(job.id)
    assert failed.status == "failed" and failed.fine_tuned_model is None
    assert (failed.error.code, failed.error.message, failed.error.param) == (
        "training_failed",
        "out of memory at step 3 (in the learner)",
        None,
    )


# --- checkpoint permissions ----------------------------------------------------------------------


def test_an_owner_shares_a_checkpoint_with_another_project_whose_members_then_see_it(lab):
    from runs.models import Checkpoint

    client = lab["client"]
    job = launched(client, model="small", training_file=upload(client, jsonl(WEIGHTED)).id)
    stored = FineTuningJob.objects.get(pk=job.id)
    Checkpoint.objects.create(run=stored.run, step=2, policy_version=2, path="x")
    name = f"{stored.fine_tuned_model}:ckpt-step-2"
    permissions = client.fine_tuning.checkpoints.permissions
    outsider = openai_client(lab["outsider"])
    assert name not in {model.id for model in outsider.models.list()}

    other = str(lab["other_project"].pk)
    made = list(permissions.create(name, project_ids=[other, other]))
    assert [(p.object, p.project_id) for p in made] == [("checkpoint.permission", other)]
    again = list(permissions.create(name, project_ids=[other]))
    assert [p.id for p in again] == [made[0].id]  # granted once, not twice
    listed = permissions.retrieve(name)
    assert ([p.id for p in listed.data], listed.has_more) == ([made[0].id], False)
    assert permissions.retrieve(name, project_id="999999").data == []
    assert name in {model.id for model in outsider.models.list()}

    with pytest.raises(openai.BadRequestError) as unknown:
        permissions.create(name, project_ids=["999999"])
    assert (unknown.value.body["param"], unknown.value.body["message"]) == (
        "project_ids",
        "project_ids[0]: no project '999999'",
    )
    with pytest.raises(openai.PermissionDeniedError):
        openai_client(lab[Role.LAUNCHER]).fine_tuning.checkpoints.permissions.create(
            name, project_ids=[other]
        )
    with pytest.raises(openai.NotFoundError):
        outsider.fine_tuning.checkpoints.permissions.retrieve(name)  # sharing is the owner's to see

    deleted = permissions.delete(made[0].id, fine_tuned_model_checkpoint=name)
    assert (deleted.id, deleted.deleted) == (made[0].id, True)
    assert permissions.retrieve(name).data == []
    assert name not in {model.id for model in outsider.models.list()}

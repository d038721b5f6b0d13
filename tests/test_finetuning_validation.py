"""A fine-tuning job is created `validating_files`, as OpenAI's is: the request's fields are checked
at once, the files by a task after commit (`finetuning.tasks.job_launch`, run here by its body, as
the eval worker runs it). The task launches the run once however often it is delivered; a file
that fails fails the job with OpenAI's error naming the line and the field, and builds nothing; a
job cancelled while validating is never launched; a job without a run reads back everywhere."""

from datetime import timedelta
from unittest import mock

import openai
import pytest
from django.utils import timezone

from finetuning import tasks
from finetuning.jobs import LAUNCH_RESEND_AFTER, jobs_launch_resend
from finetuning.models import FineTuningFile, FineTuningJob
from projects.models import TaskSet, TaskSetVersion
from rewards.models import RewardRule
from runs.models import Run
from tests.test_finetuning import RFT_ITEM, WEIGHTED, connections_kept, jsonl, lab, launched, upload

__all__ = ["connections_kept", "lab"]

EXACT = {
    "type": "string_check",
    "name": "exact",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.reference_answer }}",
    "operation": "eq",
}
RFT = {"type": "reinforcement", "reinforcement": {"grader": EXACT}}
NO_REPLY = {"messages": [{"role": "user", "content": "2+2?"}]}  # nothing for a supervised job to train


def nothing_built(job_id: str) -> bool:
    """No run, task set or reward rule came of the job."""
    return (
        not Run.objects.exists()
        and not TaskSet.objects.filter(name__startswith="openai ").exists()
        and not RewardRule.objects.filter(name=f"{job_id} grader").exists()
    )


def test_a_job_is_created_validating_files_without_reading_them_and_reads_back_everywhere(lab):
    client = lab["client"]
    training = upload(client, jsonl(WEIGHTED))
    # The upload's bytes are gone from storage: creating the job does not read them.
    stored = FineTuningFile.objects.get(pk=training.id)
    stored.content.storage.delete(stored.content.name)
    job = client.fine_tuning.jobs.create(model="small", training_file=training.id, suffix="later")
    assert (job.status, job.error, job.finished_at, job.fine_tuned_model) == (
        "validating_files",
        None,
        None,
        None,
    )
    assert (job.trained_tokens, job.estimated_finish, job.result_files) == (None, None, [])
    assert job.model_extra["flywheel"]["run"] is None
    assert FineTuningJob.objects.get(pk=job.id).task_set_version_id is None and nothing_built(job.id)

    assert client.fine_tuning.jobs.retrieve(job.id).status == "validating_files"
    assert [(j.id, j.status) for j in client.fine_tuning.jobs.list()] == [(job.id, "validating_files")]
    assert [e.message for e in client.fine_tuning.jobs.list_events(job.id)] == [
        f"Validating training file: {training.id}",
        f"Created fine-tuning job: {job.id}",
    ]
    assert client.fine_tuning.jobs.checkpoints.list(job.id).data == []

    # The task reads them, and fails the job: the file cannot be read.
    tasks.job_launch(job.id)
    failed = client.fine_tuning.jobs.retrieve(job.id)
    assert (failed.status, failed.error.code, failed.error.param) == (
        "failed",
        "invalid_training_file",
        "training_file",
    )
    assert failed.error.message.startswith(f"{training.id} cannot be read")
    assert failed.finished_at >= failed.created_at and failed.result_files == []
    assert nothing_built(job.id)


def test_a_file_that_fails_validation_fails_the_job_naming_the_line_and_the_field(lab):
    client = lab["client"]
    good = upload(client, jsonl(WEIGHTED, WEIGHTED))
    bad = upload(client, jsonl(WEIGHTED, NO_REPLY), "held-out.jsonl")
    job = launched(client, model="small", training_file=good.id, validation_file=bad.id)
    assert (job.status, job.error.code, job.error.param) == (
        "failed",
        "invalid_validation_file",
        "validation_file",
    )
    assert job.error.message == (
        "1 problem(s) in the file: line 2, field 'messages': holds no assistant message with a weight of 1 "
        "to train on"
    )
    newest = client.fine_tuning.jobs.list_events(job.id).data[0]
    assert (newest.level, newest.message) == (
        "error",
        f"Validation file failed validation: {job.error.message}",
    )
    assert newest.data == {
        "status": "failed",
        "error": {
            "code": "invalid_validation_file",
            "message": job.error.message,
            "param": "validation_file",
        },
    }
    assert nothing_built(job.id) and not TaskSetVersion.all_objects.exists()
    with pytest.raises(openai.ConflictError) as refused:
        client.fine_tuning.jobs.cancel(job.id)
    assert refused.value.body["message"] == f"job {job.id} failed before training"
    tasks.job_launch(job.id)  # a redelivery changes nothing
    assert client.fine_tuning.jobs.retrieve(job.id).error == job.error and nothing_built(job.id)

    # A training file's problem in a reinforcement job's lines, checked against the method there.
    lines = upload(client, jsonl(RFT_ITEM, RFT_ITEM | {"tests": "assert f(1) == 2\n", "entry_point": "1f"}))
    code = launched(client, model="small", training_file=lines.id, method=RFT)
    assert (code.status, code.error.code, code.error.param) == (
        "failed",
        "invalid_training_file",
        "training_file",
    )
    assert "line 2, field 'entry_point': must be a Python identifier" in code.error.message
    assert nothing_built(code.id)


def test_the_task_launches_the_run_once_however_often_it_is_delivered(lab):
    client = lab["client"]
    training = upload(client, jsonl(RFT_ITEM, RFT_ITEM | {"reference_answer": "8"}))
    job = client.fine_tuning.jobs.create(model="small", training_file=training.id, method=RFT)
    tasks.job_launch(job.id)
    tasks.job_launch(job.id)  # redelivered (acks_late): it finds the job launched
    assert Run.objects.count() == 1 and TaskSetVersion.all_objects.count() == 1
    assert RewardRule.objects.filter(name=f"{job.id} grader").count() == 1
    stored = FineTuningJob.objects.get(pk=job.id)
    assert (stored.status, stored.task_set_version_id) == ("launched", stored.run.task_set_version_id)
    messages = [e.message for e in client.fine_tuning.jobs.list_events(job.id)]
    assert messages.count("Files validated, moving job to queued state") == 1
    launched_job = client.fine_tuning.jobs.retrieve(job.id)
    assert launched_job.status == "queued" and launched_job.model_extra["flywheel"]["run"] == stored.run_id
    assert launched_job.model_extra["flywheel"]["resolved_hyperparameters"]["batch_size"] == 2


def test_a_job_cancelled_while_validating_its_files_is_never_launched(lab):
    client = lab["client"]
    job = client.fine_tuning.jobs.create(model="small", training_file=upload(client, jsonl(WEIGHTED)).id)
    with pytest.raises(openai.ConflictError) as pause:
        client.fine_tuning.jobs.pause(job.id)
    assert (
        pause.value.body["message"] == f"job {job.id} is validating its files; it can be paused once queued"
    )
    cancelled = client.fine_tuning.jobs.cancel(job.id)
    assert (cancelled.status, cancelled.error) == ("cancelled", None) and cancelled.finished_at
    assert client.fine_tuning.jobs.list_events(job.id).data[0].message == (
        "Fine-tuning job cancelled while validating its files"
    )
    tasks.job_launch(job.id)  # the task, delivered after the cancel, finds nothing to do
    assert client.fine_tuning.jobs.retrieve(job.id).status == "cancelled" and nothing_built(job.id)
    for again in (client.fine_tuning.jobs.cancel, client.fine_tuning.jobs.resume):
        with pytest.raises(openai.ConflictError) as refused:
            again(job.id)
        assert refused.value.body["code"] == "invalid_state"


def test_a_reinforcement_line_with_tests_is_a_code_item_that_unit_tests_grade(lab):
    """Flywheel's extension: a line with `tests` is a code item and a job's grader may be one of
    Flywheel's own types; graders/run grades the same item the same way, in a sandbox."""
    client = lab["client"]
    line = {
        "messages": [{"role": "user", "content": "Write f(x) that returns x plus 1."}],
        "tests": ["from solution import f", "assert f(1) == 2", "assert f(5) == 6"],
        "entry_point": "f",
        "family": "scalar",
    }
    job = launched(
        client,
        model="small",
        training_file=upload(client, jsonl(line)).id,
        method={
            "type": "reinforcement",
            "reinforcement": {"grader": {"type": "unit_tests", "name": "tests"}},
        },
    )
    run = FineTuningJob.objects.get(pk=job.id).run
    item = run.task_set_version.items.get()
    assert (item.kind, item.data["tests"], item.data["entry_point"]) == (
        "code",
        "from solution import f\nassert f(1) == 2\nassert f(5) == 6\n",
        "f",
    )
    assert item.data["metadata"]["family"] == "scalar"  # a line's own field, where run metrics look
    assert run.reward_rule_version.spec == {"type": "unit_tests", "name": "tests"}
    graders = client.fine_tuning.alpha.graders
    right = graders.run(
        grader={"type": "unit_tests", "name": "tests"},
        model_sample="def f(x):\n    return x + 1\n",
        item=line,
    )
    wrong = graders.run(
        grader={"type": "unit_tests", "name": "tests"}, model_sample="def f(x):\n    return x\n", item=line
    )
    assert (right.reward, wrong.reward) == (1.0, 0.0)


def test_the_tick_sends_again_the_launch_of_a_job_left_validating_and_it_launches_once(lab):
    """Its message was lost (the broker was down as it committed): the periodic pass sends it again;
    a job made just now, or launched, is left alone."""
    client = lab["client"]
    training = upload(client, jsonl(RFT_ITEM, RFT_ITEM | {"reference_answer": "8"}))
    lost = client.fine_tuning.jobs.create(model="small", training_file=training.id, method=RFT)
    recent = client.fine_tuning.jobs.create(model="small", training_file=training.id, method=RFT)
    launched_job = client.fine_tuning.jobs.create(model="small", training_file=training.id, method=RFT)
    tasks.job_launch(launched_job.id)
    long_ago = timezone.now() - LAUNCH_RESEND_AFTER - timedelta(seconds=1)
    FineTuningJob.objects.filter(pk__in=[lost.id, launched_job.id]).update(created_at=long_ago)
    with mock.patch.object(tasks.job_launch, "delay", side_effect=tasks.job_launch) as send:
        assert jobs_launch_resend() == [lost.id]
        assert jobs_launch_resend() == []  # launched now: nothing is sent twice
    send.assert_called_once_with(lost.id)
    assert FineTuningJob.objects.get(pk=lost.id).status == "launched"
    assert Run.objects.filter(fine_tuning_job__pk=lost.id).count() == 1
    assert FineTuningJob.objects.get(pk=recent.id).status == "validating_files"

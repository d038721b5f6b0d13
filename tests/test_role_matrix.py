"""The role matrix: every REST endpoint and every page × every role × a user of another project
× an anonymous caller. A role allows the same actions in pages and REST (core/roles.py);
websockets are covered by tests/test_websockets.py.

Every URL of projects, runs, rewards, reviews, traces, webhooks, evaluations, costs, sweeps (pages and
api_urls) and finetuning (OpenAI's fine-tuning API) must have a row here: a new route without one fails
`test_every_route_is_in_the_matrix`.
"""

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from core.roles import Role
from costs import api_urls as cost_api_urls
from evaluations import api_urls as evaluation_api_urls
from evaluations import urls as evaluation_urls
from finetuning import urls as fine_tuning_urls
from ops import api_urls as ops_api_urls
from ops import urls as ops_urls
from projects import api_urls as project_api_urls
from projects import services as project_services
from projects import urls as project_urls
from projects.models import StagedImport
from reviews import api_urls as review_api_urls
from reviews import urls as review_urls
from rewards import api_urls as reward_api_urls
from rewards import services as reward_services
from rewards import urls as reward_urls
from runs import api_urls, urls
from sweeps import api_urls as sweep_api_urls
from sweeps import services as sweep_services
from sweeps import urls as sweep_urls
from tests.conftest import api_client_for, make_user
from tiers import services as tier_services
from traces import api_urls as trace_api_urls
from traces import otlp_urls as trace_otlp_urls
from traces import urls as trace_urls
from webhooks import api_urls as webhook_api_urls
from webhooks import urls as webhook_urls

SELF = "self"  # needs only a signed-in user; acts on the caller's own things
ROLES = [Role.OWNER, Role.LAUNCHER, Role.REVIEWER, Role.VIEWER, "outsider", "anonymous"]
# Written out here, not read from core/roles.py, so that a change to the roles fails this test.
ALLOWED = {
    "view": {Role.OWNER, Role.LAUNCHER, Role.REVIEWER, Role.VIEWER},
    "review": {Role.OWNER, Role.LAUNCHER, Role.REVIEWER},
    "edit": {Role.OWNER, Role.LAUNCHER},
    "manage": {Role.OWNER},
    "manage_webhooks": {Role.OWNER},
}
# The operations page and API (ops/): owners of any project (the outsider owns one) and staff.
OPERATE = "operate"
# Prices (costs/): staff users (the operators) set them; no project role does.
STAFF = "staff"
ITEM = {"id": "q1", "prompt": "What is 1 + 1?", "reference": "2"}


@dataclass(frozen=True)
class Case:
    name: str  # URL name
    method: str
    permission: str
    kwargs: Any = None  # world -> url kwargs
    body: Any = None  # world -> request data
    multipart: bool = False
    query: Any = None
    ids: list = field(default_factory=list)

    @property
    def api(self) -> bool:
        """Called with a bearer token: the REST API, and OTLP (its errors are a google.rpc.Status)."""
        return self.name.startswith(("api-", "otlp-"))

    def __str__(self) -> str:
        return f"{self.method} {self.name}"


def otlp_export(w):
    """An OTLP/JSON export of one GenAI chat span, naming the world's project."""
    attributes = [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
        {"key": "gen_ai.prompt", "value": {"stringValue": "2+2?"}},
        {"key": "gen_ai.completion", "value": {"stringValue": "4"}},
    ]
    span = {"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174", "name": "chat"}
    resource = {"attributes": [{"key": "flywheel.project", "value": {"intValue": str(w["project"].pk)}}]}
    return {
        "resourceSpans": [
            {"resource": resource, "scopeSpans": [{"spans": [span | {"attributes": attributes}]}]}
        ]
    }


def project(w):
    return {"id": w["project"].pk}


def task_set(w):
    return {"id": w["task_set"].pk}


def version(w):
    return {"id": w["task_set"].pk, "number": 1}


def tier(w):
    return {"id": w["tier"].pk}


def evaluate_body(w):
    return {"task_set_version": w["item"].version_id, "split": w["item"].split}


def tier_evaluation_of(w):
    """A finished tier evaluation of the world's tier, made through the ORM."""
    from tiers.models import TierEvaluation

    if "tier_evaluation" not in w:
        w["tier_evaluation"] = TierEvaluation.objects.create(
            project=w["project"],
            tier=w["tier"],
            tier_configs=[{"id": w["tier"].pk, "name": "cap"}],
            checkpoint="org/model",
            task_set_version=w["item"].version,
            split=w["item"].split,
            status="succeeded",
            results=[
                {
                    "tier_id": w["tier"].pk,
                    "name": "cap",
                    "settings": {},
                    "pass_rate": 0.5,
                    "tokens_per_second": 10.0,
                    "pareto": True,
                }
            ],
        )
    return w["tier_evaluation"]


def upload(_w):
    return {"file": SimpleUploadedFile("items.jsonl", (json.dumps(ITEM) + "\n").encode())}


def tier_body(w):
    return {"project": w["project"].pk, "name": "new-tier", "base_model": "org/model"}


API_CASES = [
    Case("api-me", "get", SELF),
    Case("api-projects", "get", SELF),
    Case("api-projects", "post", SELF, body=lambda w: {"name": "fresh"}),
    Case("api-project", "get", "view", project),
    Case("api-project", "patch", "manage", project, body=lambda w: {"description": "changed"}),
    Case("api-project", "delete", "manage", project),
    Case("api-members", "get", "view", project),
    Case("api-members", "post", "manage", project, body=lambda w: {"username": "newcomer", "role": "viewer"}),
    Case(
        "api-member",
        "patch",
        "manage",
        lambda w: {"id": w["project"].pk, "user_id": w["viewer_id"]},
        body=lambda w: {"role": "reviewer"},
    ),
    Case("api-member", "delete", "manage", lambda w: {"id": w["project"].pk, "user_id": w["viewer_id"]}),
    Case("api-task-sets", "get", SELF),
    Case("api-task-sets", "post", "edit", body=lambda w: {"project": w["project"].pk, "name": "fresh"}),
    Case(
        "api-task-sets",
        "post",
        "edit",
        body=lambda w: upload(w) | {"project": w["project"].pk, "name": "with-file"},
        multipart=True,
    ),
    Case("api-task-set", "get", "view", task_set),
    Case("api-task-set", "patch", "edit", task_set, body=lambda w: {"description": "changed"}),
    Case("api-task-set-import", "post", "edit", task_set, body=upload, multipart=True),
    Case("api-versions", "get", "view", task_set),
    Case("api-version", "get", "view", version),
    Case("api-version-export", "get", "view", version),
    Case("api-version-verify", "post", "edit", version),
    Case(
        "api-version-split",
        "post",
        "edit",
        version,
        body=lambda w: {"split_seed": 5, "heldout_fraction": 0.5},
    ),
    Case("api-tasks", "get", SELF),
    Case("api-task", "get", "view", lambda w: {"id": w["item"].pk}),
    Case("api-tiers", "get", SELF),
    Case("api-tiers", "post", "edit", body=tier_body),
    Case("api-tier", "get", "view", tier),
    Case("api-tier", "patch", "edit", tier, body=lambda w: {"batch_size": 4}),
    Case("api-tier", "delete", "edit", tier),
    Case("api-tier-evaluate", "post", "edit", tier, body=lambda w: evaluate_body(w)),
    Case("api-tier-evaluation", "get", "view", lambda w: {"id": tier_evaluation_of(w).pk}),
    Case("api-tokens", "get", SELF),
    Case("api-tokens", "post", SELF, body=lambda w: {"name": "script"}),
    Case("api-token", "delete", SELF, lambda w: {"id": w["own_token"].pk}),
]


def pid(w):
    return {"project_id": w["project"].pk}


def tsid(w):
    return {"task_set_id": w["task_set"].pk}


def pversion(w):
    return {"task_set_id": w["task_set"].pk, "number": 1}


def ptier(w):
    return {"tier_id": w["tier"].pk}


def staged(w):
    return {"task_set_id": w["task_set"].pk, "staged_id": w["staged"].pk}


PAGE_CASES = [
    Case("project-list", "get", SELF),
    Case("project-create", "get", SELF),
    Case("project-create", "post", SELF, body=lambda w: {"name": "fresh", "description": ""}),
    Case("project-detail", "get", "view", pid),
    Case("project-members", "get", "view", pid),
    Case("demo-run", "post", "edit", pid),
    Case("project-members", "post", "manage", pid, body=lambda w: {"username": "newcomer", "role": "viewer"}),
    Case(
        "member-role",
        "post",
        "manage",
        lambda w: {"project_id": w["project"].pk, "user_id": w["viewer_id"]},
        body=lambda w: {"role": "reviewer"},
    ),
    Case(
        "member-remove",
        "post",
        "manage",
        lambda w: {"project_id": w["project"].pk, "user_id": w["viewer_id"]},
    ),
    Case("task-set-create", "get", "edit", pid),
    Case("task-set-create", "post", "edit", pid, body=lambda w: {"name": "fresh", "description": ""}),
    Case("task-set-create", "post", "edit", pid, body=lambda w: upload(w) | {"name": "with-file"}),
    Case("tier-create", "get", "edit", pid),
    Case(
        "tier-create",
        "post",
        "edit",
        pid,
        body=lambda w: tier_body(w) | {"device": "auto", "precision": "fp32"},
    ),
    Case("task-set-detail", "get", "view", tsid),
    Case("task-set-import", "get", "edit", tsid),
    Case("task-set-import", "post", "edit", tsid, body=upload, multipart=True),
    Case("import-confirm", "post", "edit", staged),
    Case("import-cancel", "post", "edit", staged),
    Case("version-detail", "get", "view", pversion),
    Case("version-export", "get", "view", pversion),
    Case("version-verify", "post", "edit", pversion),
    Case(
        "version-resplit", "post", "edit", pversion, body=lambda w: {"split_seed": 5, "heldout_fraction": 0.5}
    ),
    Case("tier-detail", "get", "view", ptier),
    Case("tier-edit", "get", "edit", ptier),
    Case(
        "tier-edit",
        "post",
        "edit",
        ptier,
        body=lambda w: tier_body(w) | {"device": "auto", "precision": "fp32"},
    ),
    Case("tier-delete", "post", "edit", ptier),
    Case("tier-evaluate", "post", "edit", ptier, body=lambda w: evaluate_body(w)),
    Case("tier-evaluation-detail", "get", "view", lambda w: {"evaluation_id": tier_evaluation_of(w).pk}),
    Case("token-list", "get", SELF),
    Case("token-list", "post", SELF, body=lambda w: {"name": "script"}),
    Case("token-revoke", "post", SELF, lambda w: {"token_id": w["own_token"].pk}),
]

RULE_SPEC = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.reference}}",
    "operation": "eq",
}


def rule(w):
    return {"id": w["rule"].pk}


def rule_version(w):
    return {"id": w["rule"].pk, "number": 1}


def prule(w):
    return {"rule_id": w["rule"].pk}


def dry_run_body(_w):
    return {"items": [ITEM | {"kind": "answer"}], "samples": ["2"]}


def backtest_body(w):
    """A past run of the project with one scored trajectory (built through the ORM)."""
    from runs.models import Run, Trajectory  # local: only the backtest rows need them

    run = Run.objects.create(
        project=w["project"],
        name="past",
        task_set_version=w["item"].version,
        reward_rule_version=w["rule"].versions.get(),
        tier=w["tier"],
        tier_config={},
        max_steps=1,
    )
    Trajectory.objects.create(
        run=run, item=w["item"], policy_version=0, outcome="scored", reward=1.0, completion_text="2"
    )
    return {"run": run.pk, "version": 1}


def rule_form(w):
    return {"name": "fresh-rule", "description": "", "note": "", "spec": json.dumps(RULE_SPEC)}


REWARD_CASES = [
    Case("api-reward-rules", "get", SELF),
    Case(
        "api-reward-rules",
        "post",
        "edit",
        body=lambda w: {"project": w["project"].pk, "name": "r2", "spec": RULE_SPEC},
    ),
    Case("api-reward-rule-validate", "post", SELF, body=lambda w: {"spec": RULE_SPEC}),
    Case(
        "api-reward-rule-import-openai",
        "post",
        "edit",
        body=lambda w: {"project": w["project"].pk, "name": "r3", "grader": RULE_SPEC},
    ),
    Case("api-reward-rule", "get", "view", rule),
    Case("api-reward-rule", "patch", "edit", rule, body=lambda w: {"description": "changed"}),
    Case("api-reward-rule", "delete", "edit", rule),
    Case("api-reward-rule-versions", "get", "view", rule),
    Case("api-reward-rule-version", "get", "view", rule_version),
    Case("api-reward-rule-version-openai", "get", "view", rule_version),
    Case("api-reward-rule-diff", "get", "view", rule, query=lambda w: {"from": 1, "to": 1}),
    Case("api-reward-rule-dry-run", "post", "edit", rule, body=dry_run_body),
    Case("api-reward-rule-backtest", "post", "edit", rule, body=backtest_body),
    Case("reward-rule-list", "get", "view", pid),
    Case("reward-rule-create", "get", "edit", pid),
    Case("reward-rule-create", "post", "edit", pid, body=rule_form),
    Case("reward-rule-import", "get", "edit", pid),
    Case(
        "reward-rule-import",
        "post",
        "edit",
        pid,
        body=lambda w: {"name": "imported", "grader": json.dumps(RULE_SPEC)},
    ),
    Case("reward-rule-detail", "get", "view", prule),
    Case("reward-rule-edit", "get", "edit", prule),
    Case("reward-rule-edit", "post", "edit", prule, body=rule_form),
    Case("reward-rule-delete", "post", "edit", prule),
    Case("reward-rule-diff", "get", "view", prule, query=lambda w: {"from": 1, "to": 1}),
    Case("reward-rule-dry-run", "get", "edit", prule),
    Case(
        "reward-rule-dry-run",
        "post",
        "edit",
        prule,
        body=lambda w: {"items": json.dumps(ITEM | {"kind": "answer"}), "samples": json.dumps(["2"])},
    ),
    Case("reward-rule-version", "get", "view", lambda w: {"rule_id": w["rule"].pk, "number": 1}),
    Case("reward-rule-backtest", "get", "edit", prule),
    Case("reward-rule-backtest", "post", "edit", prule, body=backtest_body),
]


def fine_tuning_job_of(w):
    """A supervised fine-tuning job of the project, made through its services the first time."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    from finetuning import services as fine_tuning

    if "fine_tuning_job" not in w:
        line = {"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]}
        upload = SimpleUploadedFile("t.jsonl", (json.dumps(line) + "\n").encode())
        owner = w[Role.OWNER]
        file = fine_tuning.file_upload(project=w["project"], by=owner, upload=upload, purpose="fine-tune")
        body = {"model": f"tier-{w['tier'].pk}", "training_file": file.pk}
        job = fine_tuning.job_create(project=w["project"], by=owner, body=body)
        w["fine_tuning_job"] = fine_tuning.job_launch(job_id=job.id)  # as its task does, after commit
    return w["fine_tuning_job"]


def checkpoint_name_of(w) -> str:
    """A checkpoint of the fine-tuning job, by the name /v1 serves it under."""
    from runs.models import Checkpoint

    job = fine_tuning_job_of(w)
    Checkpoint.objects.get_or_create(run=job.run, step=1, defaults={"policy_version": 1, "path": "x"})
    return f"{job.fine_tuned_model}:ckpt-step-1"


def checkpoint_permission_of(w) -> dict:
    """The checkpoint shared with the outsider's project: its name and the permission's id."""
    from finetuning.models import CheckpointPermission
    from runs.models import Checkpoint

    name = checkpoint_name_of(w)
    job = fine_tuning_job_of(w)
    permission, _ = CheckpointPermission.objects.get_or_create(
        job=job, checkpoint=Checkpoint.objects.get(run=job.run, step=1), project=w["other_project"]
    )
    return {"checkpoint": name, "permission_id": permission.id}


def run_of(w):
    """The project's run with one of each record, made through the ORM the first time a case
    needs it (the run loop that writes them is the workers' part)."""
    from runs.models import Checkpoint, MetricPoint, Run, RunEvent, Trajectory, TrajectoryStep

    if "run" not in w:
        run = Run.objects.create(
            project=w["project"],
            name="matrix-run",
            task_set_version=w["item"].version,
            eval_split="train",  # the world's one item
            reward_rule_version=w["rule"].versions.get(),
            tier=w["tier"],
            tier_config={"name": "cap"},
            max_steps=3,
        )
        RunEvent.objects.create(run=run, kind="status", message="queued", data={"status": "queued"})
        MetricPoint.objects.create(run=run, name="reward_mean", step=1, value=0.5)
        trajectory = Trajectory.objects.create(
            run=run, item=w["item"], policy_version=0, outcome="scored", reward=1.0, completion_text="2"
        )
        payload, size = TrajectoryStep.pack({"action": "2"})
        TrajectoryStep.objects.create(
            trajectory=trajectory, index=0, kind="completion", payload=payload, raw_size=size
        )
        checkpoint = Checkpoint.objects.create(run=run, step=1, policy_version=1, path="/tmp/ck")
        w.update(run=run, trajectory=trajectory, checkpoint=checkpoint)
    return w["run"]


NO_EPISODE = "00000000-0000-0000-0000-000000000000"


def run_id(w):
    return {"id": run_of(w).pk}


def trajectory_id(w):
    run_of(w)
    return {"id": w["trajectory"].pk}


def checkpoint_id(w):
    run_of(w)
    return {"id": w["checkpoint"].pk}


def launch_body(w):
    return {
        "project": w["project"].pk,
        "name": "launched",
        "task_set_version": w["item"].version_id,
        "reward_rule_version": w["rule"].versions.get().pk,
        "tier": w["tier"].pk,
        "eval_split": "train",
    }


def launch_form(w):
    body = launch_body(w)
    del body["project"]
    return body | {
        "method": "grpo",
        "train_split": "train",
        "max_steps": 2,
        "priority": 0,
    }


RUN_CASES = [
    Case("api-runs", "get", SELF, query=lambda w: {"project": run_of(w).project_id}),
    Case("api-runs", "post", "edit", body=launch_body),
    Case("api-run", "get", "view", run_id),
    Case("api-run-pause", "post", "edit", run_id),
    Case("api-run-resume", "post", "edit", run_id),
    Case("api-run-cancel", "post", "edit", run_id),
    Case("api-run-retry", "post", "edit", run_id),
    Case("api-run-clone", "post", "edit", run_id, body=lambda w: {"name": "copy"}),
    Case("api-run-events", "get", "view", run_id),
    Case("api-run-metrics", "get", "view", run_id, query=lambda w: {"max_points": 2}),
    Case("api-run-heldout-compare", "get", "view", run_id),
    Case("api-trajectories", "get", SELF, query=lambda w: {"run": run_of(w).pk}),
    Case("api-trajectory", "get", "view", trajectory_id),
    Case("api-trajectory-steps", "get", "view", trajectory_id),
    Case("api-checkpoints", "get", SELF, query=lambda w: {"run": run_of(w).pk}),
    Case("api-checkpoint", "get", "view", checkpoint_id),
    Case("api-checkpoint-fork", "post", "edit", checkpoint_id, body=lambda w: {}),
    # The matrix's checkpoint has no weights on disk: a caller who may export it is told so (409).
    Case("api-checkpoint-export", "get", "view", lambda w: {"id": run_of(w).pk, "step": 1}),
    Case("playground", "get", SELF),
    # The OpenAI-compatible endpoint (serving/openai_urls.py), signed in by session as the playground is.
    Case("openai-models", "get", SELF),
    Case("openai-model", "get", "view", lambda w: {"model_id": f"tier-{w['tier'].pk}"}),
    # OpenAI's fine-tuning API (finetuning/urls.py): a listing acts in the caller's own project.
    Case("openai-files", "get", SELF),
    Case("openai-file", "get", "view", lambda w: {"file_id": fine_tuning_job_of(w).training_file}),
    Case("openai-file", "delete", "edit", lambda w: {"file_id": fine_tuning_job_of(w).training_file}),
    Case("openai-file-content", "get", "view", lambda w: {"file_id": fine_tuning_job_of(w).training_file}),
    Case("openai-fine-tuning-jobs", "get", SELF),
    Case("openai-fine-tuning-job", "get", "view", lambda w: {"job_id": fine_tuning_job_of(w).id}),
    Case("openai-fine-tuning-events", "get", "view", lambda w: {"job_id": fine_tuning_job_of(w).id}),
    Case("openai-fine-tuning-checkpoints", "get", "view", lambda w: {"job_id": fine_tuning_job_of(w).id}),
    Case("openai-checkpoint-permissions", "get", "manage", lambda w: {"checkpoint": checkpoint_name_of(w)}),
    Case(
        "openai-checkpoint-permissions",
        "post",
        "manage",
        lambda w: {"checkpoint": checkpoint_name_of(w)},
        body=lambda w: {"project_ids": [str(w["other_project"].pk)]},
    ),
    Case("openai-checkpoint-permission", "delete", "manage", checkpoint_permission_of),
    Case("openai-fine-tuning-pause", "post", "edit", lambda w: {"job_id": fine_tuning_job_of(w).id}),
    Case("openai-fine-tuning-resume", "post", "edit", lambda w: {"job_id": fine_tuning_job_of(w).id}),
    Case("openai-fine-tuning-cancel", "post", "edit", lambda w: {"job_id": fine_tuning_job_of(w).id}),
    # Graders act in the caller's own project; a viewer's refusal to run one is in test_finetuning.
    Case("openai-graders-validate", "post", SELF),
    Case("openai-graders-run", "post", SELF),
    Case("run-create", "get", "edit", pid),
    Case("run-create", "post", "edit", pid, body=launch_form),
    Case("run-detail", "get", "view", lambda w: {"run_id": run_of(w).pk}),
    Case("run-pause", "post", "edit", lambda w: {"run_id": run_of(w).pk}),
    Case("run-resume", "post", "edit", lambda w: {"run_id": run_of(w).pk}),
    Case("run-cancel", "post", "edit", lambda w: {"run_id": run_of(w).pk}),
    Case("run-retry", "post", "edit", lambda w: {"run_id": run_of(w).pk}),
    Case("run-clone", "post", "edit", lambda w: {"run_id": run_of(w).pk}),
    Case("checkpoint-fork", "post", "edit", lambda w: {"checkpoint_id": checkpoint_id(w)["id"]}),
    Case("trajectory-detail", "get", "view", lambda w: {"trajectory_id": trajectory_id(w)["id"]}),
    Case("api-trajectory-group", "get", "view", trajectory_id),
    Case("api-run-monitors", "get", "view", run_id),
    Case(
        "api-run-monitors", "patch", "edit", run_id, body=lambda w: {"thresholds": {"errored_rate_max": 0.3}}
    ),
    Case("run-compare", "get", "view", query=lambda w: {"runs": run_of(w).pk}),
    Case("run-monitors", "post", "edit", lambda w: {"run_id": run_of(w).pk}, body=lambda w: {"window": "6"}),
    Case("trajectory-list", "get", "view", lambda w: {"run_id": run_of(w).pk}),
    Case("trajectory-group", "get", "view", lambda w: {"trajectory_id": trajectory_id(w)["id"]}),
    Case("run-list", "get", SELF),
    Case("run-queue", "get", SELF),
    Case("readme", "get", SELF),
    Case("docs-page", "get", SELF),
    Case("docs-page", "get", SELF, lambda w: {"name": "guides/launch-a-run"}),
    Case("docs-asset", "get", SELF, lambda w: {"name": "screenshots/run-1400-light.png"}),
    Case("demo-start", "post", SELF),
    Case(
        "trajectory-bulk-review",
        "post",
        "review",
        lambda w: {"run_id": run_of(w).pk},
        body=lambda w: {"trajectory": [trajectory_id(w)["id"]], "label": "good"},
    ),
]


def review_of(w):
    """A review and a queue of the world's run, made through the services the first time."""
    from reviews import services as review_services

    if "review" not in w:
        run_of(w)
        w["review"] = review_services.review_save(trajectory=w["trajectory"], by=w[Role.OWNER], label="good")
        w["queue"] = review_services.queue_create(run=w["run"], name="q", filters={}, by=w[Role.OWNER])
    return w["review"]


def review_id(w):
    return {"id": review_of(w).pk}


def queue_id(w):
    review_of(w)
    return {"id": w["queue"].pk}


def preference_body(w):
    """A second sample for the same prompt, so the two can be compared."""
    from runs.models import Trajectory

    run_of(w)
    other = Trajectory.objects.create(
        run=w["run"], item=w["item"], sample_index=1, policy_version=0, outcome="scored", reward=0.0
    )
    return {"chosen": w["trajectory"].pk, "rejected": other.pk}


def review_training_id(w):
    """A Train on reviews of the world's run: the run itself stands in as the reviews run (no
    second run is needed to check who may read the result)."""
    from reviews.models import ReviewTraining

    run = run_of(w)
    if "review_training" not in w:
        w["review_training"] = ReviewTraining.objects.create(
            run=run,
            parent=run,
            checkpoint=w["checkpoint"],
            method="dpo",
            counts={
                "pairs": 1,
                "from_preferences": 1,
                "from_labels": 0,
                "heldout_items": 1,
                "skipped": {"empty": 0, "identical": 0, "duplicate": 0, "multi_step": 0},
            },
        )
    return {"id": w["review_training"].pk}


REVIEW_CASES = [
    Case("api-reviews", "get", SELF, query=lambda w: {"run": run_of(w).pk}),
    Case(
        "api-reviews", "post", "review", body=lambda w: {"trajectory": trajectory_id(w)["id"], "label": "bad"}
    ),
    Case("api-review", "get", "view", review_id),
    Case("api-review", "delete", "manage", review_id),  # another's label: only an owner withdraws it
    Case("api-review-export", "get", "view", query=lambda w: {"run": run_of(w).pk, "kind": "sft"}),
    Case("api-preferences", "get", SELF, query=lambda w: {"run": run_of(w).pk}),
    Case("api-preferences", "post", "review", body=preference_body),
    Case("api-review-queues", "get", SELF, query=lambda w: {"run": run_of(w).pk}),
    Case("api-review-queues", "post", "review", body=lambda w: {"run": run_of(w).pk, "name": "mine"}),
    Case("api-review-queue", "get", "view", queue_id),
    Case("api-review-training", "get", "view", review_training_id),
    Case("api-review-queue-items", "get", "view", queue_id),
    Case(
        "api-review-queue-assign",
        "post",
        "edit",
        queue_id,
        body=lambda w: {"reviewers": [w[Role.REVIEWER].pk]},
    ),
    Case("api-review-queue-next", "post", "review", queue_id),
    Case(
        "trajectory-review",
        "post",
        "review",
        lambda w: {"trajectory_id": trajectory_id(w)["id"]},
        body=lambda w: {"label": "good"},
    ),
    Case(
        "trajectory-prefer",
        "post",
        "review",
        lambda w: {"trajectory_id": trajectory_id(w)["id"]},
        body=lambda w: {"other": preference_body(w)["rejected"]},
    ),
    Case("review-queue-list", "get", "view", lambda w: {"run_id": run_of(w).pk}),
    Case(
        "review-queue-list",
        "post",
        "review",
        lambda w: {"run_id": run_of(w).pk},
        body=lambda w: {"name": "q2"},
    ),
    Case("review-queue-detail", "get", "view", lambda w: {"queue_id": queue_id(w)["id"]}),
    Case(
        "review-queue-assign",
        "post",
        "edit",
        lambda w: {"queue_id": queue_id(w)["id"]},
        body=lambda w: {"reviewers": [w[Role.REVIEWER].pk]},
    ),
    Case("review-queue-next", "post", "review", lambda w: {"queue_id": queue_id(w)["id"]}),
    Case("run-export", "get", "view", lambda w: {"run_id": run_of(w).pk, "export_format": "dpo"}),
    Case("run-labels-export", "get", "view", lambda w: {"run_id": run_of(w).pk, "extension": "csv"}),
    Case("api-train-on-reviews", "get", "view", run_id),
    Case("api-train-on-reviews", "post", "edit", run_id, body=lambda w: {"method": "sft"}),
    Case(
        "train-on-reviews",
        "post",
        "edit",
        lambda w: {"run_id": run_of(w).pk},
        body=lambda w: {"method": "sft"},
    ),
    Case(
        "trace-review",
        "post",
        "review",
        lambda w: {"trace_id": trace_of(w).pk},
        body=lambda w: {"label": "good"},
    ),
    Case("trace-queue-create", "post", "review", pid, body=lambda w: {"name": "traces"}),
]


def trace_of(w):
    """A trace of the project, made through the ORM the first time."""
    from traces.models import Trace

    if "trace" not in w:
        w["trace"] = Trace.objects.create(
            project=w["project"], external_id="matrix", prompt="1+1?", completion="2", thumbs="up"
        )
    return w["trace"]


def trace_id(w):
    return {"id": trace_of(w).pk}


TRACE_CASES = [
    # OTLP/HTTP trace export (traces/otlp_urls.py): a bearer token, the project named by a resource attribute.
    Case("otlp-traces", "post", "edit", body=otlp_export),
    Case("api-traces", "get", SELF, query=lambda w: {"project": w["project"].pk}),
    Case(
        "api-traces",
        "post",
        "edit",
        body=lambda w: {
            "project": w["project"].pk,
            "traces": [{"id": "t", "prompt": "p", "completion": "c"}],
        },
    ),
    Case("api-trace", "get", "view", trace_id),
    Case("api-trace", "delete", "edit", trace_id),
    Case(
        "api-traces-promote",
        "post",
        "edit",
        body=lambda w: {"project": w["project"].pk, "traces": [trace_of(w).pk], "task_set_name": "promoted"},
    ),
    Case("trace-list", "get", "view", pid),
    Case("trace-promote", "post", "edit", pid, body=lambda w: {"traces": [trace_of(w).pk]}),
    Case("trace-detail", "get", "view", lambda w: {"trace_id": trace_of(w).pk}),
]


def webhook_of(w):
    """A webhook of the project with one failed delivery, made through the ORM the first time."""
    from webhooks.models import Webhook, WebhookDelivery

    if "webhook" not in w:
        w["webhook"] = Webhook.objects.create(
            project=w["project"], url="http://127.0.0.1:9/hook", secret="whsec_matrix"
        )
        w["delivery"] = WebhookDelivery.objects.create(
            webhook=w["webhook"], type="ping", payload={"id": 0}, status="failed", attempts=8
        )
    return w["webhook"]


def webhook_id(w):
    return {"id": webhook_of(w).pk}


def delivery_ids(w):
    return {"id": webhook_of(w).pk, "delivery_id": w["delivery"].pk}


WEBHOOK_CASES = [
    Case("api-webhooks", "get", "manage_webhooks", query=lambda w: {"project": w["project"].pk}),
    Case(
        "api-webhooks",
        "post",
        "manage_webhooks",
        body=lambda w: {"project": w["project"].pk, "url": "https://hooks.example.com/flywheel"},
    ),
    Case("api-webhook", "get", "manage_webhooks", webhook_id),
    Case("api-webhook", "patch", "manage_webhooks", webhook_id, body=lambda w: {"description": "changed"}),
    Case("api-webhook", "delete", "manage_webhooks", webhook_id),
    Case("api-webhook-deliveries", "get", "manage_webhooks", webhook_id),
    Case("api-webhook-redeliver", "post", "manage_webhooks", delivery_ids),
    Case("api-webhook-ping", "post", "manage_webhooks", webhook_id),
    Case("api-webhook-rotate", "post", "manage_webhooks", webhook_id),
    Case("webhook-list", "get", "manage_webhooks", pid),
    Case(
        "webhook-list",
        "post",
        "manage_webhooks",
        pid,
        body=lambda w: {"url": "https://hooks.example.com/flywheel", "description": ""},
    ),
    Case("webhook-delete", "post", "manage_webhooks", lambda w: {"webhook_id": webhook_of(w).pk}),
    Case("webhook-ping", "post", "manage_webhooks", lambda w: {"webhook_id": webhook_of(w).pk}),
    Case("webhook-rotate", "post", "manage_webhooks", lambda w: {"webhook_id": webhook_of(w).pk}),
    Case(
        "webhook-redeliver",
        "post",
        "manage_webhooks",
        lambda w: {"webhook_id": webhook_of(w).pk, "delivery_id": w["delivery"].pk},
    ),
]


def suite_of(w):
    """An evaluation suite of the project with one version, and a finished evaluation of it on the
    world's tier, made through the ORM the first time."""
    from evaluations.models import DEFAULT_SAMPLING, Suite, SuiteEntry, SuiteEvaluation, SuiteVersion

    if "suite" not in w:
        w["suite"] = Suite.objects.create(project=w["project"], name="suite")
        version = SuiteVersion.objects.create(suite=w["suite"], number=1, sampling=DEFAULT_SAMPLING)
        SuiteEntry.objects.create(
            version=version,
            position=0,
            task_set_version=w["item"].version,
            split=w["item"].split,
            reward_rule_version=w["rule"].versions.get(),
        )
        w["suite_evaluation"] = SuiteEvaluation.objects.create(
            project=w["project"],
            suite_version=version,
            target="tier",
            tier=w["tier"],
            model="org/model",
            status="succeeded",
        )
    return w["suite"]


def suite_entry(w):
    return {
        "task_set_version": w["item"].version_id,
        "split": w["item"].split,
        "reward_rule_version": w["rule"].versions.get().pk,
    }


def suite_evaluation_id(w):
    suite_of(w)
    return {"id": w["suite_evaluation"].pk}


EVALUATION_CASES = [
    Case("api-eval-suites", "get", SELF),
    Case("api-eval-suites", "post", "edit", body=lambda w: {"project": w["project"].pk, "name": "fresh"}),
    Case("api-eval-suite", "get", "view", lambda w: {"id": suite_of(w).pk}),
    Case(
        "api-eval-suite-versions",
        "post",
        "edit",
        lambda w: {"id": suite_of(w).pk},
        body=lambda w: {"entries": [suite_entry(w)]},
    ),
    Case(
        "api-eval-suite-evaluate",
        "post",
        "edit",
        lambda w: {"id": suite_of(w).pk},
        body=lambda w: {"tier": w["tier"].pk},
    ),
    Case("api-suite-evaluation", "get", "view", suite_evaluation_id),
    Case("api-suite-evaluation-results", "get", "view", suite_evaluation_id),
    Case(
        "api-suite-evaluation-compare",
        "get",
        "view",
        suite_evaluation_id,
        query=lambda w: {"against": w["suite_evaluation"].pk},
    ),
    Case("eval-suite-list", "get", "view", pid),
    Case("eval-suite-create", "post", "edit", pid, body=lambda w: {"name": "fresh"}),
    Case("eval-suite-detail", "get", "view", lambda w: {"suite_id": suite_of(w).pk}),
    Case(
        "eval-suite-version-create",
        "post",
        "edit",
        lambda w: {"suite_id": suite_of(w).pk},
        body=lambda w: {"entries": json.dumps([suite_entry(w)])},
    ),
    Case(
        "eval-suite-evaluate",
        "post",
        "edit",
        lambda w: {"suite_id": suite_of(w).pk},
        body=lambda w: {"target": f"tier:{w['tier'].pk}"},
    ),
    Case(
        "suite-evaluation-detail",
        "get",
        "view",
        lambda w: {"evaluation_id": suite_evaluation_id(w)["id"]},
    ),
]

OPS_CASES = [
    Case("api-ops-overview", "get", OPERATE),
    Case("ops", "get", OPERATE),
]

COST_CASES = [
    Case("api-run-cost", "get", "view", run_id),
    Case("api-run-estimate", "post", "view", body=launch_body),
    Case("api-run-estimate", "post", "edit", body=lambda w: launch_body(w) | {"calibrate": True}),
    Case("api-run-episodes", "get", "view", run_id),
    Case("api-run-episodes", "post", "edit", run_id),
    Case("api-run-episode-counts", "get", "view", run_id),
    Case("api-run-episode", "get", "view", lambda w: run_id(w) | {"key": NO_EPISODE}),
    Case(
        "api-run-episode-outcome",
        "post",
        "edit",
        lambda w: run_id(w) | {"key": NO_EPISODE},
        body=lambda w: {"reward": 1.0},
    ),
    Case("api-run-budget", "patch", "manage", run_id, body=lambda w: {"budget_money": "5"}),
    Case("api-project-costs", "get", "view", project),
    Case("api-project-budget", "get", "view", project),
    Case("api-project-budget", "patch", "manage", project, body=lambda w: {"monthly": "5"}),
    Case("api-project-quota", "get", "view", project),
    Case("api-project-quota", "patch", "manage", project, body=lambda w: {"max_active_runs": 2}),
    Case("api-project-quota", "patch", "manage", project, body=lambda w: {"max_gpu_workers": 2}),
    Case("api-prices", "get", SELF),
    Case("api-prices", "post", STAFF, body=lambda w: {"unit": "cpu_hour", "amount": "1"}),
]


def sweep_body(w):
    template = launch_body(w)
    del template["project"], template["name"]
    return {
        "name": "lr",
        "template": template,
        "parameters": [{"name": "hyperparameters.learning_rate", "values": [1e-4, 3e-4]}],
        "search": "grid",
    }


def sweep_id(w):
    """A sweep of the world's project, made through its service (its first pass not run)."""
    if "sweep" not in w:
        body = sweep_body(w)
        w["sweep"] = sweep_services.sweep_create(
            project=w["project"],
            by=w[Role.OWNER],
            name=body["name"],
            template=body["template"],
            parameters=body["parameters"],
            search_kind="grid",
        )
    return {"id": w["project"].pk, "sweep_id": w["sweep"].pk}


SWEEP_CASES = [
    Case("api-sweeps", "get", "view", project),
    Case("api-sweeps", "post", "edit", project, body=sweep_body),
    Case("api-sweep", "get", "view", sweep_id),
    Case("api-sweep-cancel", "post", "edit", sweep_id),
    Case("sweep-list", "get", "view", lambda w: {"project_id": w["project"].pk}),
    Case("sweep-detail", "get", "view", lambda w: {"sweep_id": sweep_id(w)["sweep_id"]}),
    Case("sweep-cancel", "post", "edit", lambda w: {"sweep_id": sweep_id(w)["sweep_id"]}),
]

CASES = (
    SWEEP_CASES
    + OPS_CASES
    + COST_CASES
    + API_CASES
    + PAGE_CASES
    + REWARD_CASES
    + RUN_CASES
    + REVIEW_CASES
    + WEBHOOK_CASES
    + TRACE_CASES
    + EVALUATION_CASES
)


def route_names(module) -> set[str]:
    return {pattern.name for pattern in module.urlpatterns}


def test_every_route_is_in_the_matrix():
    covered = {case.name for case in CASES}
    assert sorted(route_names(project_api_urls) - covered) == []
    assert sorted(route_names(project_urls) - covered) == []
    assert sorted(route_names(api_urls) - covered) == []
    assert sorted(route_names(urls) - covered) == []
    assert sorted(route_names(reward_api_urls) - covered) == []
    assert sorted(route_names(reward_urls) - covered) == []
    assert sorted(route_names(review_api_urls) - covered) == []
    assert sorted(route_names(review_urls) - covered) == []
    assert sorted(route_names(webhook_api_urls) - covered) == []
    assert sorted(route_names(webhook_urls) - covered) == []
    assert sorted(route_names(trace_api_urls) - covered) == []
    assert sorted(route_names(trace_urls) - covered) == []
    assert sorted(route_names(trace_otlp_urls) - covered) == []
    assert sorted(route_names(evaluation_api_urls) - covered) == []
    assert sorted(route_names(evaluation_urls) - covered) == []
    assert sorted(route_names(fine_tuning_urls) - covered) == []
    assert sorted(route_names(ops_api_urls) - covered) == []
    assert sorted(route_names(ops_urls) - covered) == []
    assert sorted(route_names(cost_api_urls) - covered) == []
    assert sorted(route_names(sweep_api_urls) - covered) == []
    assert sorted(route_names(sweep_urls) - covered) == []


@pytest.fixture
def world(team):
    """The team's project with one of everything, acted on by `actor`."""
    owner = team[Role.OWNER]
    task_set = project_services.task_set_create(project=team["project"], name="set", by=owner)
    report = project_services.task_set_import(
        task_set=task_set, stream=[(json.dumps(ITEM) + "\n").encode()], file_format="jsonl", by=owner
    )
    tier = tier_services.tier_create(project=team["project"], by=owner, name="cap", base_model="org/model")
    make_user("newcomer")
    reward_rule = reward_services.reward_rule_create(
        project=team["project"], name="rule", by=owner, spec=RULE_SPEC
    )
    return team | {
        "rule": reward_rule,
        "task_set": task_set,
        "item": report.version.items.get(),
        "tier": tier,
        "viewer_id": team[Role.VIEWER].pk,
    }


def expected(case: Case, role: str) -> str:
    if role == "anonymous":
        return "unauthenticated"
    if case.permission == SELF:
        return "allowed"
    if case.permission == OPERATE:
        return "allowed" if role in (Role.OWNER, "outsider") else "forbidden"
    if case.permission == STAFF:
        return "forbidden"
    if role == "outsider":
        return "not_found"
    return "allowed" if role in ALLOWED[case.permission] else "forbidden"


def call(case: Case, world: dict, role: str):
    actor = None if role == "anonymous" else world[role]
    owner_of_things = actor or world[Role.OWNER]
    world["own_token"], _ = project_services.api_token_create(user=owner_of_things, name="own")
    world["staged"] = StagedImport.objects.create(
        task_set=world["task_set"],
        user=owner_of_things,
        file=SimpleUploadedFile("s.jsonl", (json.dumps(ITEM) + "\n").encode()),
        original_name="s.jsonl",
        file_format="jsonl",
    )
    url = reverse(case.name, kwargs=case.kwargs(world) if case.kwargs else None)
    if case.query:
        url += "?" + "&".join(f"{key}={value}" for key, value in case.query(world).items())
    data = case.body(world) if case.body else None
    if case.api:
        client = api_client_for(actor) if actor else APIClient()
        send = getattr(client, case.method)
        return send(url, data, format="multipart" if case.multipart else "json")
    client = Client()
    if actor:
        client.force_login(actor)
    return getattr(client, case.method)(url, data or {})


def outcome(case: Case, response) -> str:
    status = response.status_code
    if status == 404:
        return "not_found"
    if status == 403:
        return "forbidden"
    if status == 401 or (
        not case.api and status == 302 and "/accounts/login/" in response.get("Location", "")
    ):
        return "unauthenticated"
    if status < 500:
        return "allowed"
    return f"error {status}"


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_role_matrix(world, case, role):
    response = call(case, world, role)
    assert (outcome(case, response), response.status_code) == (expected(case, role), response.status_code)
    if case.name.startswith("otlp-") and response.status_code in (401, 403, 404):
        assert set(response.json()) == {"code", "message"}
    elif case.api and response.status_code in (401, 403, 404):
        assert set(response.json()["error"]) == {"code", "message", "param", "details"}


@pytest.mark.parametrize("case", [c for c in CASES if c.permission == SELF and c.method == "get"], ids=str)
def test_an_outsider_lists_nothing_of_the_project(world, case):
    response = call(case, world, "outsider")
    body = b"".join(response.streaming_content) if response.streaming else response.content
    text = body.decode(errors="replace")
    for secret in (world["task_set"].name + '"', ITEM["prompt"], world["tier"].base_model):
        assert secret not in text

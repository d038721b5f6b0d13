"""Artifacts through the artifact storage: policy versions published by one host and read by
another with its own FLYWHEEL_HOME (real worker processes), each host's bounded cache, and a
version published again after a rollback never served from an old cached copy; on a folder (a
shared mount) and in an S3-compatible bucket (django-storages against moto's S3 server, a separate
process: a real HTTP hop)."""

import socket
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest
import torch
from django.conf import settings
from django.test import override_settings

from core.artifacts import ArtifactMissingError, artifact_exists, cache_root
from inference.policy import policy_load
from runs.models import Checkpoint, Run
from runs.run_store import policies_discard_after, policy_dir, policy_prefix, policy_publish
from tests.conftest import api_client_for
from tests.run_harness import (
    Host,
    demo_project,
    hosts_killed,
    run_body,
    tiny_model,
    wait_for_terminal,
    wait_until,
    web_answers,
    worker_env,
)
from webapp.artifact_storage import folder_storage, s3_storage

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["tiny_model"]


S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "flywheel",
    "AWS_SECRET_ACCESS_KEY": "flywheel-test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    """moto's S3-compatible server in a process of its own; boto3 finds the credentials in the
    environment, as on a deployment (AWS_*), for this process and the workers it starts."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "ab") as output:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    endpoint = f"http://127.0.0.1:{port}"
    with pytest.MonkeyPatch.context() as patch:
        for name, value in S3_CREDENTIALS.items():
            patch.setenv(name, value)
        try:
            wait_until(lambda: web_answers(f"{endpoint}/moto-api/"), "moto's S3 server", timeout=60)
            yield endpoint
        finally:
            server.terminate()
            server.wait(timeout=30)


def s3_bucket(endpoint: str) -> str:
    name = f"flywheel-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=name)
    return name


def s3_keys(endpoint: str, bucket: str) -> set[str]:
    listed = boto3.client("s3", endpoint_url=endpoint).list_objects_v2(Bucket=bucket)
    return {entry["Key"] for entry in listed.get("Contents", [])}


@pytest.fixture(params=["folder", "s3"])
def storage_at(request, tmp_path):
    """The artifact storage in a folder of its own (standing for a shared mount), or in a bucket
    of its own, configured as settings.py does for FLYWHEEL_ARTIFACTS_S3_BUCKET; a fresh cache."""
    if request.param == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        artifacts = s3_storage(bucket=s3_bucket(endpoint), endpoint=endpoint)
    else:
        artifacts = folder_storage(str(tmp_path / "shared-artifacts"))
    home = tmp_path / "home"
    home.mkdir()
    with override_settings(STORAGES=settings.STORAGES | {"artifacts": artifacts}, FLYWHEEL_HOME=home):
        yield artifacts


def a_run(tiny_model) -> Run:
    setup = demo_project(tiny_model)
    response = api_client_for(setup["owner"]).post("/api/v1/runs", run_body(setup, steps=1), format="json")
    assert response.status_code == 201, response.json()
    return Run.objects.get(pk=response.json()["id"])


def shifted(model_path: Path, seed: int):
    policy = policy_load(model_path)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in policy.model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return policy


def first_weight(folder: Path) -> torch.Tensor:
    return next(policy_load(folder).model.parameters()).detach().clone()


def test_the_cache_keeps_the_versions_used_last_and_fetches_evicted_ones_again(tiny_model, storage_at):
    run = a_run(tiny_model)
    policy = policy_load(tiny_model)
    with override_settings(FLYWHEEL_ARTIFACT_CACHE_VERSIONS=2):
        folders = [policy_publish(run.pk, version, policy.model, policy.tokenizer) for version in range(3)]
        assert [folder.is_dir() for folder in folders] == [False, True, True]
        assert all(artifact_exists(policy_prefix(run.pk, version)) for version in range(3))
        again = policy_dir(run.pk, 0)  # evicted: fetched again from the storage, evicting v1
        assert again == folders[0] and again.is_dir() and not folders[1].is_dir()
        assert (again / "config.json").read_bytes() == (tiny_model / "config.json").read_bytes()
        cached = sorted(path.name for path in (cache_root() / "runs").glob("*/policies/v*"))
        assert [name.split(".")[0] for name in cached] == ["v0", "v2"]
    with pytest.raises(ArtifactMissingError, match="policies/v7 is not in the artifact storage"):
        policy_dir(run.pk, 7)


def test_a_version_published_again_after_a_rollback_is_never_read_from_the_old_cached_copy(
    tiny_model, storage_at
):
    run = a_run(tiny_model)
    old, new = shifted(tiny_model, 1), shifted(tiny_model, 2)
    policy_publish(run.pk, 0, old.model, old.tokenizer)
    stale = policy_publish(run.pk, 1, old.model, old.tokenizer)
    policies_discard_after(run.pk, 0)
    assert not artifact_exists(policy_prefix(run.pk, 1)) and artifact_exists(policy_prefix(run.pk, 0))
    fresh = policy_publish(run.pk, 1, new.model, new.tokenizer)
    assert fresh != stale
    assert torch.equal(first_weight(policy_dir(run.pk, 1)), next(new.model.parameters()))


@pytest.mark.backend_independent
def test_workers_with_their_own_flywheel_home_get_policies_and_checkpoints_through_the_storage(
    tiny_model, tmp_path
):
    """A learner host and a rollout/eval host, each with its own FLYWHEEL_HOME, sharing only the
    database, Redis and the artifact storage (a folder standing for a shared mount)."""
    shared = settings.FLYWHEEL_ARTIFACTS_DIR
    homes = {name: tmp_path / name for name in ("learner-host", "rollout-host")}
    hosts = [
        Host(worker_env(FLYWHEEL_HOME=str(home), FLYWHEEL_ARTIFACTS_DIR=str(shared)))
        for home in homes.values()
    ]
    run, name, rollout_cache = two_host_run(tiny_model, hosts, homes["rollout-host"])
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert not (homes["rollout-host"] / "runs").exists()  # it wrote nothing of its own for the run
    assert sorted(Checkpoint.objects.filter(run=run).values_list("path", flat=True)) == [
        f"runs/{name}/checkpoints/step-1",
        f"runs/{name}/checkpoints/step-2",
    ]
    assert all(artifact_exists(f"runs/{name}/policies/v{version}") for version in range(3))


@pytest.mark.backend_independent
def test_workers_share_policies_and_checkpoints_through_an_s3_bucket_and_nothing_on_disk(
    tiny_model, tmp_path, s3_endpoint
):
    """The same two hosts with the artifact storage in an S3-compatible bucket
    (FLYWHEEL_ARTIFACTS_S3_BUCKET and _ENDPOINT, as a deployment sets them): a GRPO run publishes
    every policy version and checkpoint there, and the rollout host fetches what it samples with."""
    bucket = s3_bucket(s3_endpoint)
    s3 = {"FLYWHEEL_ARTIFACTS_S3_BUCKET": bucket, "FLYWHEEL_ARTIFACTS_S3_ENDPOINT": s3_endpoint}
    homes = {name: tmp_path / name for name in ("learner-host", "rollout-host")}
    hosts = [Host(worker_env(FLYWHEEL_HOME=str(home), **s3)) for home in homes.values()]
    run, name, rollout_cache = two_host_run(tiny_model, hosts, homes["rollout-host"])
    assert run.status == Run.Status.SUCCEEDED, run.error
    manifests = {key for key in s3_keys(s3_endpoint, bucket) if key.endswith(".manifest.json")}
    assert manifests == {
        *(f"flywheel/runs/{name}/policies/v{version}.manifest.json" for version in range(3)),
        *(f"flywheel/runs/{name}/checkpoints/step-{step}.manifest.json" for step in (1, 2)),
    }
    for home in homes.values():
        assert not (home / "artifacts").exists()  # no folder storage on either host
    (cached_v2,) = [path for path in rollout_cache.iterdir() if path.name.startswith("v2.")]
    stored = settings.STORAGES | {"artifacts": s3_storage(bucket=bucket, endpoint=s3_endpoint)}
    with override_settings(STORAGES=stored, FLYWHEEL_HOME=tmp_path / "reader"):
        fetched = policy_dir(run.pk, 2)  # this host's own copy, fetched from the bucket
    assert fetched != cached_v2
    assert torch.equal(first_weight(fetched), first_weight(cached_v2))


def two_host_run(tiny_model, hosts: list[Host], rollout_home: Path) -> tuple[Run, str, Path]:
    """A 2-step GRPO run with a learner host and a rollout/eval host: the run, its artifact name
    and the rollout host's cache of its policies. Steps 0 and 1 sample with v0 (staleness 1);
    evaluations read v0 and the final v2, which may be fetched after the run has ended."""
    with hosts_killed(*hosts):
        hosts[0].worker("learner,control")
        hosts[1].worker("rollout,eval")
        setup = demo_project(tiny_model)
        body = run_body(setup, steps=2, checkpoint_every=1, eval_every=100)
        response = api_client_for(setup["owner"]).post("/api/v1/runs", body, format="json")
        assert response.status_code == 201, response.json()
        run = wait_for_terminal(response.json()["id"])
        name = f"{run.pk}-{run.key}"
        rollout_cache = rollout_home / "cache" / "artifacts" / "runs" / name / "policies"
        wait_until(lambda: cached_versions(rollout_cache) == {"v0", "v2"}, "the final evaluation's fetch")
    return run, name, rollout_cache


def cached_versions(folder: Path) -> set[str]:
    """The versions in a host's cache (a name starting with a dot is a fetch still in progress)."""
    if not folder.is_dir():
        return set()
    return {path.name.split(".")[0] for path in folder.iterdir() if not path.name.startswith(".")}

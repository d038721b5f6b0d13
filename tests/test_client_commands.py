"""The `flywheel` command's listing and showing commands, the async client and the client's build,
against a live server as tests/test_client.py runs it (its fixtures)."""

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connections

import flywheel as client_package
from flywheel import AsyncFlywheel, Client, NotFoundError, Record
from flywheel._endpoints import endpoints_of
from flywheel.cli import main, parser
from projects.models import TaskSetVersion
from rewards.models import RewardRuleVersion
from runs import lifecycle
from runs.models import Checkpoint, Run
from tests.run_harness import wait_until
from tests.test_client import TASKS, flywheel, launchable, owner_token, server_url  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db(transaction=True)
CLIENT = Path(settings.BASE_DIR) / "client"


def column(stdout: str, header: str) -> list[str]:
    """The cells of one column of a table the command printed (cells hold no spaces here)."""
    lines = stdout.splitlines()
    headers = lines[0].split("  ")
    names = [name.strip() for name in headers if name.strip()]
    index = names.index(header)
    return [line.split()[index] for line in lines[1:]]


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_command_line_lists_and_shows_the_ids_other_commands_take(
    server_url,  # noqa: F811
    owner_token,  # noqa: F811
    tmp_path,
    capsys,
    monkeypatch,
):
    ids = launchable(owner_token)
    project = str(ids["project"])
    version = TaskSetVersion.objects.get(pk=ids["task_set_version"])
    task_set, rule_version = str(version.task_set_id), ids["reward_rule_version"]
    monkeypatch.setenv("FLYWHEEL_URL", server_url)
    monkeypatch.setenv("FLYWHEEL_TOKEN", owner_token["token"])
    assert ok(
        flywheel(server_url, owner_token["token"], "projects", "list", "--json")
    )  # the installed command

    def cli(*args: str) -> subprocess.CompletedProcess:
        """The command's main in this process (as the installed `flywheel` runs it, but seconds faster)."""
        code = main(list(args))
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, captured.out, captured.err)

    projects = ok(cli("projects", "list"))
    assert projects.splitlines()[0].split() == ["ID", "NAME", "CREATED"]
    assert column(projects, "ID") == [project] and column(projects, "NAME") == ["client"]
    assert json.loads(ok(cli("projects", "show", project, "--json")))["name"] == "client"
    assert column(ok(cli("task-sets", "list", "--project", project)), "ID") == [task_set]
    assert [s["id"] for s in json.loads(ok(cli("task-sets", "list", "--json")))] == [int(task_set)]

    # Importing says which id runs launch takes; the versions table has it in its ID column.
    path = tmp_path / "more.jsonl"
    path.write_bytes(TASKS + b'{"id": "c", "prompt": "3+3?", "reference": "6"}\n')
    imported = ok(cli("tasks", "import", task_set, str(path)))
    second = TaskSetVersion.objects.get(task_set_id=task_set, number=2)
    assert imported.strip() == (
        f"imported 3 items as version 2 of task set {task_set}; its id is {second.pk}"
        f" (runs launch --task-set-version {second.pk})"
    )
    versions = cli("task-sets", "versions", task_set)
    assert column(ok(versions), "ID") == [str(second.pk), str(version.pk)]
    assert column(versions.stdout, "VERSION") == ["2", "1"] and "ID column" in versions.stderr
    shown = json.loads(ok(cli("task-sets", "version", task_set, "1", "--json")))
    assert (shown["id"], shown["item_count"]) == (version.pk, 2)
    assert "versions:" in ok(cli("task-sets", "show", task_set))

    assert column(ok(cli("tiers", "list", "--project", project)), "ID") == [str(ids["tier"])]
    assert json.loads(ok(cli("tiers", "show", str(ids["tier"]), "--json")))["base_model"] == "org/model"
    rule = str(RewardRuleVersion.objects.get(pk=rule_version).rule_id)
    rules = ok(cli("reward-rules", "list", "--project", project))
    assert column(rules, "ID") == [rule] and column(rules, "LATEST ID") == [str(rule_version)]
    assert column(ok(cli("reward-rules", "versions", rule)), "ID") == [str(rule_version)]
    assert (
        json.loads(ok(cli("reward-rules", "version", rule, "1", "--json")))["spec"]["type"] == "string_check"
    )
    assert "string_check" in ok(cli("reward-rules", "show", rule))

    launch = [
        "runs", "launch", "--project", project, "--name", "listed", "--task-set-version", str(second.pk),
        "--reward-rule-version", str(rule_version), "--tier", str(ids["tier"]), "--eval-split", "train",
        "--budget-money", "7.50", "--json",
    ]  # fmt: skip
    run = json.loads(ok(cli(*launch)))
    costed = ok(cli("runs", "cost", str(run["id"]))).splitlines()
    assert (costed[0], costed[-1]) == (
        f"run {run['id']}: 0 USD, 0.0000 device-hours",
        "budget: 7.50 USD, - device-hours",
    )
    assert [r["id"] for r in json.loads(ok(cli("runs", "list", "--json", "--project", project)))] == [
        run["id"]
    ]
    checkpoint = Checkpoint.objects.create(run_id=run["id"], step=2, policy_version=2, path="ckpt-2")
    checkpoints = ok(cli("checkpoints", "list", "--run", str(run["id"])))
    assert column(checkpoints, "ID") == [str(checkpoint.pk)] and column(checkpoints, "STEP") == ["2"]
    assert json.loads(ok(cli("checkpoints", "show", str(checkpoint.pk), "--json")))["step"] == 2

    # A run that stops early says why, from its error: the reason, where, and the log's last line.
    log = "learner died (exit 1); gave up after 2 restarts\nstep 1\nRuntimeError: CUDA out of memory"
    lifecycle.run_fail(run=Run.objects.get(pk=run["id"]), message=log, where="learner, step 1")
    why = "learner died (exit 1); gave up after 2 restarts; the log ends: RuntimeError: CUDA out of memory"
    assert f"stopped: {why} (learner, step 1)" in ok(cli("runs", "show", str(run["id"])))
    followed = cli("runs", "follow", str(run["id"]))
    assert followed.returncode == 1
    assert f"run {run['id']} failed at step 0/" in followed.stderr and why in followed.stderr
    as_json = json.loads(cli("runs", "follow", str(run["id"]), "--json").stdout)
    assert as_json["stop_reason"] == f"{why} (learner, step 1)"
    missing = cli("runs", "show", "999999", "--json")
    assert missing.returncode == 2 and json.loads(missing.stdout)["error"]["status"] == 404


def undocumented(command: argparse.ArgumentParser, name: str) -> list[str]:
    """Every argument, option and subcommand under `command` that has no help text."""
    missing = []
    for action in command._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            missing += [f"{name} {choice.dest}" for choice in action._choices_actions if not choice.help]
            for sub_name, sub in action.choices.items():
                missing += undocumented(sub, f"{name} {sub_name}")
        elif not action.help:
            missing.append(f"{name} {action.dest}")
    return missing


def test_every_option_and_command_of_the_command_line_has_help_text():
    assert undocumented(parser(), "flywheel") == []


def test_the_async_client_makes_the_same_calls_and_answers_records(server_url, owner_token, tmp_path):  # noqa: F811
    sync = Client(url=server_url, token=owner_token["token"])
    project = owner_token["project"].pk
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(TASKS)

    async def calls() -> dict:
        async with AsyncFlywheel(url=server_url, token=owner_token["token"]) as client:
            assert endpoints_of(client) == endpoints_of(sync)  # the same methods, declared once
            me = await client.me.get()
            task_set = await client.task_sets.create(project, "async")
            version, again = await asyncio.gather(
                client.task_sets.import_file(task_set.id, path), client.task_sets.get(task_set.id)
            )
            versions = [v async for v in client.task_sets.versions(task_set.id, limit=1)]
            lines = [line.id async for line in client.task_sets.export(task_set.id, 1)]
            with pytest.raises(NotFoundError):
                await client.runs.get(999_999)
            doomed = await client.projects.create("async-delete")
            assert await client.projects.delete(doomed.id) is None  # a delete is awaited like any call
            with pytest.raises(NotFoundError):
                await client.projects.get(doomed.id)
            return {
                "me": me,
                "set": task_set,
                "again": again,
                "version": version,
                "versions": versions,
                "lines": lines,
            }

    answers = asyncio.run(calls())
    assert answers["me"].username == answers["me"]["username"] == "client-owner"
    assert isinstance(answers["version"], client_package.TaskSetVersion) and isinstance(
        answers["version"], dict
    )
    assert isinstance(answers["set"], client_package.TaskSet) and isinstance(answers["me"], Record)
    assert [type(v) for v in answers["versions"]] == [client_package.TaskSetVersion]
    assert (answers["version"].number, answers["version"].item_count) == (1, 2)
    assert answers["again"].name == "async" and [v.id for v in answers["versions"]] == [answers["version"].id]
    assert answers["lines"] == ["a", "b"]
    synced = sync.task_sets.version(answers["set"].id, 1)  # the sync client reads the same, the same way
    assert (synced.id, synced.item_count) == (answers["version"].id, 2)
    assert synced.split_counts == synced["split_counts"] and json.loads(json.dumps(synced)) == synced
    with pytest.raises(AttributeError, match="no field 'nope'"):
        synced.nope  # noqa: B018
    sync.close()


def untracked() -> list[str]:
    """What `git status --porcelain client/` lists as untracked (in a clean checkout: nothing)."""
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all", "client/"],
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        check=True,
    )
    return [line for line in status.stdout.splitlines() if line.startswith("??")]


def test_building_the_client_leaves_nothing_untracked_in_the_source_tree(tmp_path):
    if shutil.which("git") is None or not (Path(settings.BASE_DIR) / ".git").exists():
        pytest.skip("not a git checkout")
    had_build = (CLIENT / "build").exists()
    before = untracked()
    try:
        built = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "-q",
                "-w",
                str(tmp_path),
                str(CLIENT),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert built.returncode == 0, built.stderr
        assert untracked() == before  # every build output is ignored (client/.gitignore)
        wheel = next(tmp_path.glob("flywheel_client-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            metadata = archive.read(next(n for n in archive.namelist() if n.endswith("/METADATA"))).decode()
        requires = sorted(
            line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Dist")
        )
        assert requires == [  # ranges, not pins; the cookbook only for flywheel.cookbook
            "httpx<1,>=0.27",
            'tinker-cookbook<0.7,>=0.6; extra == "cookbook"',
            "tqdm<5,>=4.60",
            "websockets<18,>=13",
        ]
    finally:
        if not had_build:
            shutil.rmtree(CLIENT / "build", ignore_errors=True)


def test_the_clients_doctests_pass():
    import doctest

    from flywheel import _follow, _records, cli, client

    assert [doctest.testmod(module).failed for module in (_records, cli, client, _follow)] == [0, 0, 0, 0]


def test_the_async_client_follows_a_run_live_until_it_ends(server_url, owner_token):  # noqa: F811
    ids = launchable(owner_token)
    with Client(url=server_url, token=owner_token["token"]) as client:
        run = client.runs.launch(name="followed", eval_split="train", **ids)
    Run.objects.filter(pk=run.id).update(status=Run.Status.RUNNING)
    # Cancelled once the follower's websocket has joined the run's group (its pub/sub channel).
    group = f"{settings.CHANNEL_LAYERS['default']['CONFIG']['prefix']}__group__run-{run.id}"
    broker = redis.Redis.from_url(settings.REDIS_URL)

    def stop_when_followed() -> None:
        wait_until(
            lambda: dict(broker.pubsub_numsub(group)).get(group.encode(), 0) > 0, "the websocket", timeout=60
        )
        lifecycle.run_cancel(run=Run.objects.get(pk=run.id))
        lifecycle.run_transition(
            Run.objects.get(pk=run.id), allowed=("cancelling",), to="cancelled", message="cancelled at step 0"
        )
        connections.close_all()

    async def follow() -> list:
        async with AsyncFlywheel(url=server_url, token=owner_token["token"]) as client:
            return [message async for message in client.follow(run)]

    stopper = threading.Thread(target=stop_when_followed)
    stopper.start()
    seen = asyncio.run(follow())
    stopper.join()
    messages = [m["payload"]["message"] for m in seen if m["event"] == "event"]
    assert messages[0].startswith("queued") and messages[-2:] == ["cancelling", "cancelled at step 0"]
    assert [m["payload"].status for m in seen if m["event"] == "status"] == ["cancelling", "cancelled"]
    assert seen[-1]["event"] == "run" and seen[-1]["payload"].status == "cancelled"

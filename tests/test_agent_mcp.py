"""MCP tools in agent episodes: servers an item names run INSIDE the episode's sandbox, their tools
are offered beside the built-ins (`<server>__<tool>`), a call goes to the server's `tools/call`
through the mcp SDK's client, and the call and its result are steps like a built-in's. A server
that hangs, exits or writes garbage answers with a tool error within its timeout; a bad
declaration is refused at import by line and field."""

import dataclasses
import json
import os
import secrets
import time
from pathlib import Path

import pytest
from django.test import Client

from inference.mcp_tools import SHIPPED, mcp_servers_problems
from projects import services as project_services
from projects.models import TaskItem
from rewards import services as reward_services
from runs import lifecycle
from runs.lifecycle import RunRequest
from runs.models import RolloutBatch, Trajectory, TrajectoryStep
from sandboxes import services as sandbox_services
from sandboxes.config import sandbox_settings
from sandboxes.pool import SandboxPool
from sandboxes.runtime import mcp_server
from tests.conftest import api_client_for
from tests.sandbox_fixtures import BACKENDS, backend_ready
from tests.test_agent_episodes import CHECK_RULE, call, scripted
from tiers import services as tier_services
from workers.agent import episodes_play
from workers.run_rollout import _agent_played, _store, item_dicts

SHIPPED_SERVERS = [{"name": "calc", "shipped": "calc"}, {"name": "files", "shipped": "files"}]
# A server of the item's own, in its files: standard library only (the sandbox has no mcp package).
# `where` says where it runs; hang, die and garbage misbehave the three ways a server can.
OWN_SERVER = r"""
import json, os, socket, sys, time

TOOLS = {
    "where": "the server's host name, uid and working directory",
    "hang": "never answers",
    "die": "exits",
    "garbage": "writes a line that is not JSON-RPC",
}


def result(text):
    return {"content": [{"type": "text", "text": text}], "isError": False}


for line in sys.stdin:
    message = json.loads(line)
    method, ident = message.get("method"), message.get("id")
    if ident is None:
        continue
    if method == "initialize":
        answer = {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "own", "version": "1"}}
    elif method == "tools/list":
        answer = {"tools": [{"name": name, "description": text, "inputSchema": {"type": "object"}}
                            for name, text in TOOLS.items()]}
    elif method == "tools/call":
        name = message["params"]["name"]
        if name == "hang":
            time.sleep(600)
        if name == "die":
            sys.stderr.write("own server: giving up\n")
            sys.exit(3)
        if name == "garbage":
            print("this is not JSON-RPC", flush=True)
            continue
        answer = result(f"{socket.gethostname()} {os.getuid()} {os.getcwd()}")
    else:
        answer = None
    reply = {"jsonrpc": "2.0", "id": ident}
    reply.update({"result": answer} if answer is not None else {"error": {"code": -32601, "message": method}})
    print(json.dumps(reply), flush=True)
"""
AGENT = {
    "kind": "agent",
    "id": "sum",
    "instructions": "Add 2 and 3 with the calculator and write the sum into answer.txt.",
    "check_command": 'test "$(cat answer.txt)" = 5',
    "max_steps": 5,
    "files": {"notes.txt": "use the calculator\n"},
    "mcp_servers": SHIPPED_SERVERS,
}


def own_item(**server) -> dict:
    entry = {"name": "own", "command": "python3", "args": ["own_server.py"], "timeout_seconds": 1} | server
    return AGENT | {"files": {"own_server.py": OWN_SERVER}, "mcp_servers": [entry]}


def names(tools: list[dict]) -> list[str]:
    return [tool["function"]["name"] for tool in tools]


def test_an_episode_calls_mcp_tools_in_its_sandbox_and_each_call_is_a_step():
    nonce = secrets.token_hex(8)
    generate = scripted(
        call("calc__add", a=2, b=3),
        call("files__write_file", path="answer.txt", content="5"),
        call("files__write_file", path=f"/tmp/flywheel-mcp-{nonce}.txt", content="sandboxed"),
        call("shell", command=f"cat /tmp/flywheel-mcp-{nonce}.txt"),
        call("submit"),
    )
    [episode] = episodes_play([AGENT], generate, rule=CHECK_RULE)
    assert names(episode.tools) == [
        "shell",
        "read_file",
        "write_file",
        "run_tests",
        "calc__add",
        "calc__subtract",
        "calc__multiply",
        "calc__divide",
        "calc__accumulate",
        "files__read_file",
        "files__write_file",
        "files__list_files",
        "submit",
    ]
    assert "calc__add(a: number, b: number): a + b" in generate.calls[0][0]  # offered in the prompt
    add, write, _, cat, _ = (turn.record() for turn in episode.turns)
    assert add["tool_calls"] == [{"name": "calc__add", "arguments": {"a": 2, "b": 3}}]
    assert add["tool_result"] == {
        "tool": "calc__add",
        "mcp": {"server": "calc", "tool": "add"},
        "is_error": False,
        "stdout": "5",
        "content": [{"type": "text", "text": "5"}],
    }
    assert episode.messages[3] == {"role": "tool", "name": "calc__add", "content": "5"}
    # the server wrote in the sandbox's workspace: the diff shows it, the check grades it
    assert write["files_changed"][0]["path"] == "answer.txt"
    assert write["files_changed"][0]["status"] == "added"
    assert episode.grade.total == 1.0 and episode.submitted and episode.mcp_failures == 0
    # ... and in the sandbox's /tmp, where the sandbox's shell reads it; never on the host
    assert cat["tool_result"]["stdout"] == "sandboxed"
    assert not Path(f"/tmp/flywheel-mcp-{nonce}.txt").exists()
    assert not (Path.cwd() / "answer.txt").exists()


def test_a_server_lives_through_the_episode_and_runs_as_the_sandbox():
    generate = scripted(
        call("calc__accumulate", value=2),
        call("shell", command="echo between > between.txt"),  # the sandbox's commands spare it
        call("calc__accumulate", value=5),
        call("submit"),
    )
    [episode] = episodes_play([AGENT], generate, rule=CHECK_RULE)
    totals = [episode.turns[0].results[0]["stdout"], episode.turns[2].results[0]["stdout"]]
    assert totals == ["2", "7"] and episode.turns[1].results[0]["exit_code"] == 0
    [own] = episodes_play([own_item()], scripted(call("own__where"), call("submit")), rule=CHECK_RULE)
    host, uid, cwd = own.turns[0].results[0]["stdout"].split()
    assert (host, cwd) == ("sandbox", "/workspace") and int(uid) != os.getuid()


def test_an_items_tools_list_keeps_only_the_server_tools_it_names():
    item = AGENT | {"mcp_servers": [{"name": "math", "shipped": "calc", "tools": ["add", "divide"]}]}
    generate = scripted(call("math__divide", a=1, b=0), call("math__multiply", a=2, b=2), call("submit"))
    [episode] = episodes_play([item], generate, rule=CHECK_RULE)
    assert names(episode.tools) == [
        "shell",
        "read_file",
        "write_file",
        "run_tests",
        "math__add",
        "math__divide",
        "submit",
    ]
    divide = episode.turns[0].record()["tool_result"]
    assert (divide["is_error"], divide["stdout"]) == (True, "division by zero")  # the tool's own error
    assert episode.messages[3]["content"] == "error: division by zero"
    assert episode.turns[1].error.kind == "unknown_tool"  # not offered: an invalid action
    assert episode.mcp_failures == 0


@pytest.mark.parametrize(
    ("tool", "kind", "said"),
    [
        ("hang", "timeout", "it did not answer within 1 s"),
        ("die", "exited", "it exited (code 3); its stderr: own server: giving up"),
        ("garbage", "garbage", "it wrote a line that is not JSON-RPC: 'this is not JSON-RPC'"),
    ],
)
def test_a_server_that_hangs_exits_or_writes_garbage_answers_with_a_tool_error_in_time(tool, kind, said):
    generate = scripted(
        call(f"own__{tool}"), call("own__where"), call("shell", command="echo 5 > answer.txt")
    )
    started = time.monotonic()
    [episode] = episodes_play([own_item() | {"max_steps": 3}], generate, rule=CHECK_RULE)
    assert time.monotonic() - started < 8  # the 1 s timeout, a talk, the sandbox and the grading
    first, second, shell = (turn.record()["tool_result"] for turn in episode.turns)
    message = f"error: MCP server 'own' failed ({kind}): {said}"
    assert (first["error"], first["mcp_failure"], first["is_error"]) == (message, kind, True)
    assert episode.messages[3] == {"role": "tool", "name": f"own__{tool}", "content": message}
    assert second["mcp_failure"] == kind and "stopped earlier" in second["error"]  # not tried again
    assert shell["exit_code"] == 0  # the episode goes on; its sandbox is fine
    assert episode.mcp_failures == 2 and [s["mcp_failures"] for s in episode.sample().steps] == [1, 1, 0]
    assert episode.grade.total == 1.0 and not episode.grade.errored


def test_a_server_that_does_not_start_errors_the_episode_with_why():
    item = own_item() | {"files": {"own_server.py": "import sys\nsys.exit('no tools today')\n"}}
    [episode] = episodes_play([item], scripted(call("submit")), rule=CHECK_RULE)
    assert episode.turns == [] and episode.grade.errored
    [error] = episode.grade.errors
    assert error.kind == "mcp_server_error"
    assert error.message == ("MCP server 'own' did not start: it exited (code 1); its stderr: no tools today")
    missing = AGENT | {"mcp_servers": [{"name": "calc", "shipped": "calc", "tools": ["sqrt"]}]}
    [episode] = episodes_play([missing], scripted(call("submit")), rule=CHECK_RULE)
    assert episode.grade.errors[0].message.startswith(
        "MCP server 'calc' did not start: it lists no tool sqrt"
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_mcp_servers_run_on_either_sandbox_backend(backend, monkeypatch):
    backend_ready(backend)
    pool = SandboxPool(
        settings=dataclasses.replace(sandbox_settings(), backend=backend), max_sandboxes=2, warm=0
    )
    monkeypatch.setattr(sandbox_services, "_pool", pool)
    generate = scripted(
        call("calc__multiply", a=2.5, b=2),
        call("files__write_file", path="answer.txt", content="5"),
        call("files__read_file", path="answer.txt"),
        call("submit"),
    )
    try:
        [episode] = episodes_play([AGENT], generate, rule=CHECK_RULE)
    finally:
        pool.close()
    assert [turn.results[0]["stdout"] for turn in episode.turns[:3]] == [
        "5",
        "wrote 1 bytes to answer.txt",
        "5",
    ]
    assert episode.grade.total == 1.0


def test_the_shipped_toolsets_are_the_ones_declarations_may_name():
    assert tuple(mcp_server.TOOLSETS) == SHIPPED


# --- declarations at import -----------------------------------------------------------------------


@pytest.fixture
def task_set(db):
    from tests.conftest import make_project, make_user

    user = make_user("importer")
    return project_services.task_set_create(project=make_project(user), name="mcp", by=user)


def jsonl(*items) -> list[bytes]:
    return [(json.dumps(item) + "\n").encode() for item in items]


def test_bad_declarations_are_refused_at_import_by_line_and_field(task_set):
    servers = [
        [{"name": "calc", "shipped": "abacus"}],
        [{"name": "Calc", "command": "python3"}, {"name": "x", "command": "python3", "args": ["srv.py"]}],
        [{"name": "a", "shipped": "calc"}, {"name": "a", "shipped": "files", "timeout_seconds": 0}],
        [{"name": "a__b", "command": "", "env": {"1X": "y"}, "tools": []}],
        [{"name": "calc", "shipped": "calc", "cwd": "/"}],
        {"name": "calc"},
    ]
    lines = [AGENT | {"id": f"i{n}", "mcp_servers": entry} for n, entry in enumerate(servers)]
    report = project_services.task_set_import(
        task_set=task_set, stream=jsonl(AGENT, *lines), file_format="jsonl", by=task_set.created_by
    )
    assert not report.ok
    assert [(e.line, e.field, e.message) for e in report.errors] == [
        (2, "mcp_servers.0.shipped", "must be one of the servers Flywheel ships: calc, files"),
        (3, "mcp_servers.0.name", "must be lower-case letters, digits, single _ (at most 24), from a letter"),
        (3, "mcp_servers.1.args.0", "names srv.py, which is not one of the item's files"),
        (4, "mcp_servers.1.name", "'a' names two servers"),
        (4, "mcp_servers.1.timeout_seconds", "must be a number of seconds between 0.5 and 300"),
        (5, "mcp_servers.0.name", "must be lower-case letters, digits, single _ (at most 24), from a letter"),
        (5, "mcp_servers.0.command", "must be a non-empty string"),
        (5, "mcp_servers.0.env.1X", "must be a variable name with a string value"),
        (5, "mcp_servers.0.tools", "must be a non-empty list of the server's tool names, each once"),
        (
            6,
            "mcp_servers.0.cwd",
            "unknown field (known: name, shipped, command, args, env, tools, timeout_seconds)",
        ),
        (7, "mcp_servers", "must be a list"),
    ]
    assert TaskItem.objects.count() == 0
    report = project_services.task_set_import(
        task_set=task_set,
        stream=jsonl(AGENT, own_item() | {"id": "own"}),
        file_format="jsonl",
        by=task_set.created_by,
    )
    assert report.ok and TaskItem.objects.get(external_id="sum").data["mcp_servers"] == SHIPPED_SERVERS


def test_declaration_problems_are_plain_data():
    assert mcp_servers_problems([]) == [("", "must be a non-empty list of servers")]
    assert mcp_servers_problems([{"name": "f", "shipped": "files", "command": "python3"}]) == [
        ("0.shipped", "give either shipped or command (with args), not both")
    ]


# --- stored, and replayed -------------------------------------------------------------------------


def mcp_run_create(owner, project, home: Path):
    """A run over the MCP item (train) and its held-out twin, on a tier whose model is a folder."""
    task_set = project_services.task_set_create(project=project, name="mcp agents", by=owner)
    version = project_services.task_set_import(
        task_set=task_set,
        stream=jsonl(AGENT | {"split": "train"}, AGENT | {"id": "held", "split": "heldout"}),
        file_format="jsonl",
        by=owner,
    ).version
    rule = reward_services.reward_rule_create(project=project, name="check", spec=CHECK_RULE, by=owner)
    model_dir = home / "model"
    model_dir.mkdir()
    tier = tier_services.tier_create(project=project, by=owner, name="t", base_model=str(model_dir))
    request = RunRequest(
        project=project,
        name="mcp",
        task_set_version=version,
        reward_rule_version=rule.versions.get(),
        tier=tier,
        hyperparameters={"group_size": 2},
        max_steps=1,
    )
    return lifecycle.run_create(request=request, by=owner)


def mcp_episode_store(run) -> Trajectory:
    """The train item played by a scripted policy (calc__add, files__write_file, submit) and
    stored as a rollout batch stores it."""
    item_ids = list(run.task_set_version.items.filter(split="train").values_list("pk", flat=True))
    batch = RolloutBatch.objects.create(run=run, index=0, step=0, policy_version=0, item_ids=item_ids)
    generate = scripted(
        call("calc__add", a=2, b=3), call("files__write_file", path="answer.txt", content="5"), call("submit")
    )
    stored = []
    episodes_play(
        item_dicts(item_ids),
        generate,
        rule=CHECK_RULE,
        on_done=lambda first, wave: stored.append(_store(batch, [_agent_played(e, 0) for e in wave])),
    )
    assert stored == [1]
    return Trajectory.objects.get(batch=batch)


def test_a_stored_episode_keeps_each_mcp_call_and_result_for_the_replay(team, tmp_path, settings):
    settings.FLYWHEEL_HOME = tmp_path
    trajectory = mcp_episode_store(mcp_run_create(team["owner"], team["project"], tmp_path))
    assert (trajectory.outcome, trajectory.reward, trajectory.step_count) == ("scored", 1.0, 3)
    steps = [step.data() for step in TrajectoryStep.objects.filter(trajectory=trajectory).order_by("index")]
    assert steps[0]["tool_calls"] == [{"name": "calc__add", "arguments": {"a": 2, "b": 3}}]
    assert steps[0]["tool_result"]["mcp"] == {"server": "calc", "tool": "add"}
    assert steps[1]["observation"] == "[tool calc__add]\n5"  # the result, as the model read it
    assert steps[1]["files_changed"][0]["path"] == "answer.txt"
    assert steps[-1]["final_workspace"]["files"]["answer.txt"] == "5"
    assert steps[-1]["mcp_failures"] == 0  # counted on the last step, as invalid actions are
    assert [tool["function"]["name"] for tool in steps[0]["mcp_tools"]][:2] == ["calc__add", "calc__subtract"]
    # what the replay page reads, step by step
    client = api_client_for(team["owner"])
    page = client.get(f"/api/v1/trajectories/{trajectory.pk}/steps?index=0").json()
    [step] = page["results"]
    assert step["data"]["tool_result"]["stdout"] == "5" and step["data"]["tool_result"]["is_error"] is False
    browser = Client()
    browser.force_login(team["owner"])
    html = browser.get(f"/trajectories/{trajectory.pk}/")
    assert html.status_code == 200 and b"replay-step" in html.content


def test_the_guides_example_server_serves_an_episode_as_printed():
    guide = (Path(__file__).resolve().parent.parent / "docs" / "guides" / "agents.md").read_text()
    source = guide.split("### Writing a server", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    entry = {"name": "shout", "command": "python3", "args": ["shout.py"], "timeout_seconds": 5}
    assert json.dumps(entry) in guide  # the entry the guide gives for it
    item = AGENT | {"files": {"shout.py": source}, "mcp_servers": [entry]}
    [episode] = episodes_play(
        [item], scripted(call("shout__shout", text="hi"), call("submit")), rule=CHECK_RULE
    )
    assert episode.turns[0].results[0]["stdout"] == "HI" and episode.mcp_failures == 0

"""MCP servers an agent item names (`mcp_servers`), and their tools as the model is offered them.

An entry is a stdio server started inside the episode's sandbox (never on the host):

    {"name": "calc", "shipped": "calc"}
    {"name": "notes", "command": "python3", "args": ["tools/notes_server.py"],
     "env": {"NOTES_DIR": "notes"}, "tools": ["add_note"], "timeout_seconds": 10}

`name` namespaces its tools (`calc__add`), so they never clash with the built-ins or with another
server's; `shipped` names a server Flywheel ships (`sandboxes/runtime/mcp_server.py`: calc, files),
else `command` and `args` start one from the item's files; `env` is added to its environment;
`tools` keeps only the tools it names; `timeout_seconds` bounds each request to it.

Pure functions, no `mcp` import: the web process checks items at import with `mcp_servers_problems`
(`workers.mcp_client` runs the servers).
"""

import re
from dataclasses import dataclass, field
from typing import Any

SEPARATOR = "__"
SHIPPED = ("calc", "files")  # the toolsets of sandboxes/runtime/mcp_server.py
MAX_SERVERS = 8
MAX_ARGS = 64
MAX_ARG_CHARS = 4096
DEFAULT_TIMEOUT = 10.0
TIMEOUT_BOUNDS = (0.5, 300.0)
FIELDS = ("name", "shipped", "command", "args", "env", "tools", "timeout_seconds")
SERVER_NAME = re.compile(r"^[a-z][a-z0-9_]{0,23}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# What an OpenAI function name may be (and so a namespaced MCP tool's)
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class McpServerSpec:
    """One checked `mcp_servers` entry."""

    name: str
    shipped: str = ""
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    tools: tuple[str, ...] | None = None  # None: every tool it lists
    timeout_seconds: float = DEFAULT_TIMEOUT


def mcp_servers_of(item: dict) -> list[McpServerSpec]:
    """The item's servers (checked at import: `mcp_servers_problems`).

    >>> [spec.name for spec in mcp_servers_of({"mcp_servers": [{"name": "calc", "shipped": "calc"}]})]
    ['calc']
    """
    specs = []
    for entry in item.get("mcp_servers") or []:
        tools = entry.get("tools")
        specs.append(
            McpServerSpec(
                name=entry["name"],
                shipped=entry.get("shipped", ""),
                command=entry.get("command", ""),
                args=tuple(entry.get("args") or ()),
                env=dict(entry.get("env") or {}),
                tools=tuple(tools) if tools is not None else None,
                timeout_seconds=float(entry.get("timeout_seconds", DEFAULT_TIMEOUT)),
            )
        )
    return specs


def namespaced(server: str, tool: str) -> str:
    """The name the model calls a server's tool by.

    >>> namespaced("calc", "add")
    'calc__add'
    """
    return f"{server}{SEPARATOR}{tool}"


def mcp_tool_function(server: str, tool: str, description: str, input_schema: dict[str, Any]) -> dict:
    """A listed MCP tool in the tools format the built-ins use (OpenAI's function objects)."""
    parameters = dict(input_schema) if isinstance(input_schema, dict) else {}
    parameters.setdefault("type", "object")
    parameters.setdefault("properties", {})
    return {
        "type": "function",
        "function": {"name": namespaced(server, tool), "description": description, "parameters": parameters},
    }


def mcp_servers_problems(raw: object, files: dict | None = None) -> list[tuple[str, str]]:
    """What is wrong with an item's `mcp_servers`, as (field under it, message) pairs; [] when
    nothing is. `files` (the item's) are where a server's script must be.

    >>> mcp_servers_problems([{"name": "calc", "shipped": "abacus"}, {"name": "x", "command": ""}])[1]
    ('1.command', 'must be a non-empty string')
    >>> mcp_servers_problems([{"name": "a", "command": "python3", "args": ["srv.py"]}], {})
    [('0.args.0', "names srv.py, which is not one of the item's files")]
    """
    if not isinstance(raw, list) or not raw:
        return [("", "must be a non-empty list of servers")]
    if len(raw) > MAX_SERVERS:
        return [("", f"at most {MAX_SERVERS} servers")]
    problems: list[tuple[str, str]] = []
    seen: set[str] = set()
    for index, entry in enumerate(raw):
        found = []
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            if entry["name"] in seen:
                found.append(("name", f"{entry['name']!r} names two servers"))
            seen.add(entry["name"])
        found += _entry_problems(entry, files or {})
        problems += [(f"{index}.{name}".rstrip("."), message) for name, message in found]
    return problems


def _entry_problems(entry: object, files: dict) -> list[tuple[str, str]]:
    if not isinstance(entry, dict):
        return [("", "must be an object with name, and shipped or command")]
    unknown = [name for name in entry if name not in FIELDS]
    if unknown:
        return [(unknown[0], f"unknown field (known: {', '.join(FIELDS)})")]
    problems = []
    name = entry.get("name")
    if not isinstance(name, str) or not SERVER_NAME.match(name) or SEPARATOR in name:
        problems.append(("name", "must be lower-case letters, digits, single _ (at most 24), from a letter"))
    problems += _command_problems(entry, files)
    env = entry.get("env", {})
    if not isinstance(env, dict):
        problems.append(("env", "must be an object of variable names to strings"))
    else:
        for key, value in env.items():
            if not ENV_NAME.match(key) or not isinstance(value, str) or "\0" in value:
                problems.append((f"env.{key}", "must be a variable name with a string value"))
    tools = entry.get("tools")
    if tools is not None and (
        not isinstance(tools, list)
        or not tools
        or not all(isinstance(tool, str) and tool for tool in tools)
        or len(set(tools)) != len(tools)
    ):
        problems.append(("tools", "must be a non-empty list of the server's tool names, each once"))
    timeout = entry.get("timeout_seconds", DEFAULT_TIMEOUT)
    low, high = TIMEOUT_BOUNDS
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not low <= timeout <= high:
        problems.append(("timeout_seconds", f"must be a number of seconds between {low:g} and {high:g}"))
    return problems


def _command_problems(entry: dict, files: dict) -> list[tuple[str, str]]:
    if "shipped" in entry:
        if "command" in entry or "args" in entry:
            return [("shipped", "give either shipped or command (with args), not both")]
        if entry["shipped"] not in SHIPPED:
            return [("shipped", f"must be one of the servers Flywheel ships: {', '.join(SHIPPED)}")]
        return []
    command = entry.get("command")
    if not isinstance(command, str) or not command.strip() or "\0" in command:
        return [("command", "must be a non-empty string")]
    args = entry.get("args", [])
    if not isinstance(args, list) or len(args) > MAX_ARGS:
        return [("args", f"must be a list of at most {MAX_ARGS} strings")]
    for index, arg in enumerate(args):
        if not isinstance(arg, str) or "\0" in arg or len(arg) > MAX_ARG_CHARS:
            return [(f"args.{index}", f"must be a string of at most {MAX_ARG_CHARS} characters")]
    script = next((arg for arg in args if not arg.startswith("-")), None)
    if script is not None and script.endswith(".py") and not script.startswith("/") and script not in files:
        return [
            (
                "args.0" if script == args[0] else f"args.{args.index(script)}",
                f"names {script}, which is not one of the item's files",
            )
        ]
    return []

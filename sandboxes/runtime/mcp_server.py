"""The MCP servers shipped with Flywheel, run inside an episode's sandbox as
`python3 -I -c <this source> <toolset>` (an agent item's `mcp_servers` entry `{"shipped": "calc"}`).

The sandbox images are Debian's python3 and nothing else (no `mcp` package: Debian has none, and
its pydantic is too old for the SDK), so this speaks MCP's stdio transport with the standard
library: one JSON-RPC 2.0 message a line on stdin and stdout, `initialize`, `ping`, `tools/list`
and `tools/call`. Never imported by the host.

Toolsets:
- calc: add, subtract, multiply, divide, and accumulate (a running total this process keeps,
  which shows the server lives across calls).
- files: read_file, write_file, list_files: paths relative to the workspace, or absolute inside
  the sandbox (its /tmp, say); what it writes stays in the sandbox.
"""

import json
import os
import sys
from typing import Any

PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
NUMBER = {"type": "number"}
STRING = {"type": "string"}


def tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    schema = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return {"name": name, "description": description, "inputSchema": schema}


class ToolError(Exception):
    """The tool ran and failed: the caller gets its message with isError."""


# -- calc --------------------------------------------------------------------------------------

TOTAL = [0.0]


def divide(a: float, b: float) -> float:
    if b == 0:
        raise ToolError("division by zero")
    return a / b


def accumulate(value: float) -> float:
    TOTAL[0] += value
    return TOTAL[0]


def number_text(value: float) -> str:
    """3.0 -> '3', 2.5 -> '2.5'."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


CALC = {
    "add": (tool("add", "a + b", {"a": NUMBER, "b": NUMBER}, ["a", "b"]), lambda a, b: a + b),
    "subtract": (tool("subtract", "a - b", {"a": NUMBER, "b": NUMBER}, ["a", "b"]), lambda a, b: a - b),
    "multiply": (tool("multiply", "a * b", {"a": NUMBER, "b": NUMBER}, ["a", "b"]), lambda a, b: a * b),
    "divide": (tool("divide", "a / b", {"a": NUMBER, "b": NUMBER}, ["a", "b"]), divide),
    "accumulate": (
        tool("accumulate", "Add value to a running total; the total so far.", {"value": NUMBER}, ["value"]),
        accumulate,
    ),
}


# -- files -------------------------------------------------------------------------------------

READ_LIMIT = 64_000


def read_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(READ_LIMIT)
    except OSError as exc:
        raise ToolError(f"{path}: {exc.strerror}") from None


def write_file(path: str, content: str) -> str:
    try:
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(content)
    except OSError as exc:
        raise ToolError(f"{path}: {exc.strerror}") from None
    return f"wrote {len(content.encode())} bytes to {path}"


def list_files(path: str = ".") -> str:
    try:
        return "\n".join(sorted(os.listdir(path)))
    except OSError as exc:
        raise ToolError(f"{path}: {exc.strerror}") from None


FILES = {
    "read_file": (tool("read_file", "Read a text file.", {"path": STRING}, ["path"]), read_file),
    "write_file": (
        tool(
            "write_file",
            "Create or replace a text file.",
            {"path": STRING, "content": STRING},
            ["path", "content"],
        ),
        write_file,
    ),
    "list_files": (tool("list_files", "The names in a directory.", {"path": STRING}, []), list_files),
}
TOOLSETS = {"calc": CALC, "files": FILES}


# -- the protocol ------------------------------------------------------------------------------


def tool_result(tools: dict, params: dict) -> dict:
    name, arguments = params.get("name"), params.get("arguments") or {}
    if name not in tools:
        raise LookupError(f"unknown tool: {name}")
    try:
        value = tools[name][1](**arguments)
    except ToolError as exc:
        return {"content": [{"type": "text", "text": str(exc)}], "isError": True}
    except TypeError as exc:  # arguments that do not fit the function
        return {"content": [{"type": "text", "text": f"bad arguments: {exc}"}], "isError": True}
    text = number_text(value) if isinstance(value, (int, float)) else str(value)
    return {"content": [{"type": "text", "text": text}], "isError": False}


def answer(toolset: str, message: dict) -> dict | None:
    """The response to one message (None for a notification)."""
    method, params, ident = message.get("method"), message.get("params") or {}, message.get("id")
    if ident is None:
        return None
    tools = TOOLSETS[toolset]
    try:
        if method == "initialize":
            asked = params.get("protocolVersion")
            result = {
                "protocolVersion": asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[-1],
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": f"flywheel-{toolset}", "version": "1"},
            }
        elif method == "ping":
            result = {}
        elif method == "tools/list":
            result = {"tools": [spec for spec, _ in tools.values()]}
        elif method == "tools/call":
            result = tool_result(tools, params)
        else:
            return {
                "jsonrpc": "2.0",
                "id": ident,
                "error": {"code": -32601, "message": f"no method {method}"},
            }
    except LookupError as exc:
        return {"jsonrpc": "2.0", "id": ident, "error": {"code": -32602, "message": str(exc)}}
    return {"jsonrpc": "2.0", "id": ident, "result": result}


def main() -> None:
    toolset = sys.argv[1] if len(sys.argv) > 1 else ""
    if toolset not in TOOLSETS:
        sys.exit(f"usage: mcp_server.py {{{','.join(TOOLSETS)}}}")
    for line in sys.stdin:
        reply: dict[str, Any] | None
        try:
            message = json.loads(line)
        except ValueError:
            reply = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error"}}
        else:
            reply = answer(toolset, message) if isinstance(message, dict) else None
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()

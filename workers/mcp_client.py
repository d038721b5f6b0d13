"""The MCP servers of an agent episode (`inference.mcp_tools`), each run INSIDE the episode's
sandbox as a sandbox service (`Sandbox.service_start`: a long-lived process in a session of its
own, which the sandbox's executions leave running), spoken to with the official `mcp` SDK's
`ClientSession` over a transport made of the service's stdin and stdout (`sandbox_stdio`).

At the episode's start each server is started, initialised and asked for its tools
(`tools/list`); those the entry's `tools` keeps are offered to the model beside the built-ins,
named `<server>__<tool>`. A call of one goes to `tools/call`; its result (each content block's
text, and isError) is the tool's answer, recorded in the step as a built-in's is.

A server that does not answer within its `timeout_seconds`, exits, or writes something that is
not JSON-RPC is stopped: the call that found it is answered with a tool error saying which, and
counted (`mcp_failure` in the step's record); its later calls are answered the same way. Nothing
waits longer than a request's timeout plus one talk (`TALK_SLICE`): a worker never hangs on a
server. The servers stop with the episode, and with the sandbox in any case.

The SDK's event loop runs in a thread of its own (an anyio blocking portal), shared by a wave's
episodes; the episode loop calls into it and waits.
"""

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from anyio.from_thread import BlockingPortal, start_blocking_portal
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import ClientSession
from mcp import types as mcp_types
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from inference.mcp_tools import FUNCTION_NAME, McpServerSpec, mcp_servers_of, mcp_tool_function, namespaced
from sandboxes.interface import InfrastructureError
from sandboxes.sandbox import ServiceOutput
from workers.agent_tools import RECORD_CHARS, ToolOutcome

SHIPPED_SOURCE = (
    Path(__file__).resolve().parent.parent / "sandboxes" / "runtime" / "mcp_server.py"
).read_text()
TALK_SLICE = 0.5  # seconds one talk waits for the server's next line
STDERR_CHARS = 1000  # of a failed server's stderr, in the error the model sees
QUEUE = 64  # messages buffered each way between the session and the pump


class McpServerError(Exception):
    """A server failed (`kind`: start, timeout, exited, garbage, error); the call is a tool error."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def server_argv(spec: McpServerSpec) -> list[str]:
    """How the sandbox starts the server: a shipped one from its source, else the item's command."""
    if spec.shipped:
        return ["python3", "-I", "-c", SHIPPED_SOURCE, spec.shipped]
    return [spec.command, *spec.args]


# -- the transport: a sandbox service's stdin and stdout ----------------------------------------


@dataclass
class ServiceLink:
    """A server running as a sandbox service, and why its connection ended (None while it lives)."""

    sandbox: Any
    handle: int
    ended: McpServerError | None = None

    def talk(self, data: bytes, wait: float) -> ServiceOutput:
        return self.sandbox.service_talk(self.handle, data, wait=wait)

    async def pump(
        self,
        outgoing: MemoryObjectReceiveStream[SessionMessage],
        incoming: MemoryObjectSendStream[SessionMessage | Exception],
    ) -> None:
        """Carry the session's messages to the server and its lines back; while a request waits
        for its response, talk again each slice. Ends (closing `incoming`, which fails the waiting
        requests) when the session closes or the server fails."""
        async with incoming:
            waiting: set[Any] = set()  # ids of the requests not answered yet
            while self.ended is None:
                batch = [] if waiting else [await _next_or_none(outgoing)]
                if None in batch:
                    return  # the session closed
                batch += _queued(outgoing)
                requests = [m.message for m in batch if m is not None]
                waiting |= {r.id for r in requests if isinstance(r, mcp_types.JSONRPCRequest)}
                data = b"".join(_line(message) for message in batch if message is not None)
                try:
                    output = await anyio.to_thread.run_sync(self.talk, data, TALK_SLICE if waiting else 0.0)
                except InfrastructureError as exc:
                    self.ended = McpServerError("sandbox", f"the sandbox failed: {exc}")
                    return
                for message in self._messages(output):
                    if isinstance(message, (mcp_types.JSONRPCResponse, mcp_types.JSONRPCError)):
                        waiting.discard(message.id)
                    await incoming.send(SessionMessage(message))
                self.ended = self.ended or _ending(output)

    def _messages(self, output: ServiceOutput) -> list[mcp_types.JSONRPCMessage]:
        messages = []
        for line in output.lines.splitlines():
            if not line.strip():
                continue
            try:
                messages.append(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
            except ValueError:  # pydantic's ValidationError included
                shown = line[:200].decode(errors="replace")
                self.ended = McpServerError("garbage", f"it wrote a line that is not JSON-RPC: {shown!r}")
                break
        return messages


async def _next_or_none(stream: MemoryObjectReceiveStream[SessionMessage]) -> SessionMessage | None:
    try:
        return await stream.receive()
    except (anyio.EndOfStream, anyio.ClosedResourceError):
        return None


def _queued(stream: MemoryObjectReceiveStream[SessionMessage]) -> list[SessionMessage]:
    messages = []
    while True:
        try:
            messages.append(stream.receive_nowait())
        except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
            return messages


def _line(message: SessionMessage) -> bytes:
    return message.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"


def _ending(output: ServiceOutput) -> McpServerError | None:
    if output.overflow:
        return McpServerError(
            "garbage", "it wrote a line of more than 4 MiB without a newline; it was stopped"
        )
    if not output.exited:
        return None
    how = f"signal {output.signal}" if output.signal is not None else f"code {output.exit_code}"
    tail = output.stderr.strip()[-STDERR_CHARS:]
    return McpServerError("exited", f"it exited ({how})" + (f"; its stderr: {tail}" if tail else ""))


@asynccontextmanager
async def sandbox_stdio(link: ServiceLink) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's transport (a read and a write stream of SessionMessage) over the service."""
    incoming_send, incoming = anyio.create_memory_object_stream[SessionMessage | Exception](QUEUE)
    outgoing, outgoing_receive = anyio.create_memory_object_stream[SessionMessage](QUEUE)
    async with anyio.create_task_group() as group:
        group.start_soon(link.pump, outgoing_receive, incoming_send)
        try:
            yield incoming, outgoing
        finally:
            group.cancel_scope.cancel()
            await outgoing.aclose()
            await incoming.aclose()


# -- one server, and an episode's servers ---------------------------------------------------------


@dataclass
class McpServer:
    """A started server: its session, its offered tools (namespaced name -> its own name)."""

    spec: McpServerSpec
    link: ServiceLink
    session: ClientSession
    tools: dict[str, str] = field(default_factory=dict)
    functions: list[dict] = field(default_factory=list)
    failure: McpServerError | None = None  # once set, the server is stopped and every call fails


@asynccontextmanager
async def _connected(spec: McpServerSpec, sandbox: Any) -> AsyncIterator[McpServer]:
    """Start the server in the sandbox, initialise it and list its tools; stop it on leaving."""
    handle = await anyio.to_thread.run_sync(lambda: sandbox.service_start(server_argv(spec), env=spec.env))
    link = ServiceLink(sandbox, handle)
    try:
        async with sandbox_stdio(link) as (read, write), ClientSession(read, write) as session:
            server = McpServer(spec, link, session)
            try:
                with anyio.fail_after(spec.timeout_seconds):
                    await session.initialize()
                    listed = await _tools_listed(session)
            except Exception as exc:  # noqa: BLE001  (whatever went wrong, the start failed)
                raise _failure(link, exc, spec, "start") from None
            _offer(server, listed)
            yield server
    finally:
        await anyio.to_thread.run_sync(_stop_quietly, sandbox, handle)


async def _tools_listed(session: ClientSession) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(100):  # pages
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def _offer(server: McpServer, listed: list[mcp_types.Tool]) -> None:
    """The tools the entry keeps, in the tools format; an allow-listed tool it lacks fails the start."""
    by_name = {tool.name: tool for tool in listed}
    wanted = server.spec.tools if server.spec.tools is not None else tuple(by_name)
    missing = [name for name in wanted if name not in by_name]
    if missing:
        raise McpServerError(
            "start", f"it lists no tool {', '.join(missing)} (it lists: {', '.join(by_name)})"
        )
    for name in wanted:
        function = mcp_tool_function(
            server.spec.name, name, by_name[name].description or "", by_name[name].input_schema
        )
        if not FUNCTION_NAME.match(function["function"]["name"]):
            raise McpServerError(
                "start", f"its tool {name!r} cannot be named {function['function']['name']!r}"
            )
        server.tools[function["function"]["name"]] = name
        server.functions.append(function)


def _innermost(exc: BaseException) -> BaseException:
    """The exception inside the task groups' exception groups (each holds one here)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _stop_quietly(sandbox: Any, handle: int) -> None:
    try:
        sandbox.service_stop(handle)
    except InfrastructureError:  # the sandbox is gone, and the server with it
        pass


def _failure(link: ServiceLink, exc: BaseException, spec: McpServerSpec, stage: str) -> McpServerError:
    """What the model (or the episode) is told: the link's own reason where it ended, else the
    exception's."""
    if isinstance(exc, McpServerError):
        return exc
    if link.ended is not None:
        return link.ended
    if isinstance(exc, TimeoutError):
        return McpServerError("timeout", f"it did not answer within {spec.timeout_seconds:g} s")
    if isinstance(exc, ValidationError):
        return McpServerError(
            "garbage", f"its answer is not a valid MCP result: {exc.errors()[0].get('msg', exc)}"
        )
    return McpServerError("error" if stage != "start" else "start", f"{type(exc).__name__}: {exc}")


async def _call(server: McpServer, tool: str, arguments: dict) -> mcp_types.CallToolResult:
    with anyio.fail_after(server.spec.timeout_seconds):
        return await server.session.call_tool(tool, arguments)


class McpServers:
    """An episode's servers in its sandbox: their tools, and calls routed to them."""

    def __init__(self, portal: BlockingPortal, stack: ExitStack) -> None:
        self.portal = portal
        self.stack = stack
        self.servers: list[McpServer] = []
        self.routes: dict[str, McpServer] = {}  # namespaced tool name -> its server

    @property
    def functions(self) -> list[dict]:
        return [function for server in self.servers for function in server.functions]

    def start(self, specs: list[McpServerSpec], sandbox: Any) -> None:
        """Start each server; McpServerError (kind start) names the first that failed, and why."""
        for spec in specs:
            try:
                server = self.stack.enter_context(
                    self.portal.wrap_async_context_manager(_connected(spec, sandbox))
                )
            except Exception as exc:  # noqa: BLE001  (the SDK's, anyio's: the start failed all the same)
                cause = _innermost(exc)
                if isinstance(cause, InfrastructureError):
                    raise cause from None
                raise McpServerError("start", f"MCP server {spec.name!r} did not start: {cause}") from None
            self.servers.append(server)
            self.routes |= dict.fromkeys(server.tools, server)

    def call(self, name: str, arguments: dict) -> ToolOutcome:
        """Run a call of one of the servers' tools; a failure is the call's own (error) result."""
        server = self.routes[name]
        tool = server.tools[name]
        record: dict[str, Any] = {"mcp": {"server": server.spec.name, "tool": tool}}
        if server.failure is not None:
            return _failed(
                record, server, McpServerError(server.failure.kind, f"stopped earlier: {server.failure}")
            )
        try:
            result = self.portal.call(_call, server, tool, arguments)
        except Exception as exc:  # noqa: BLE001  (a timeout, a closed connection, an invalid result)
            failure = _failure(server.link, _innermost(exc), server.spec, "call")
            if failure.kind == "sandbox":
                raise InfrastructureError(str(failure)) from None
            server.failure = failure
            _stop_quietly(server.link.sandbox, server.link.handle)
            return _failed(record, server, failure)
        text = result_text(result)
        record |= {"is_error": result.is_error, "stdout": text[:RECORD_CHARS]}
        record["content"] = [block.model_dump(mode="json", exclude_none=True) for block in result.content][
            :20
        ]
        if result.structured_content is not None:
            record["structured_content"] = result.structured_content
        return ToolOutcome(f"error: {text}" if result.is_error else text, record, mutates=True)


def _failed(record: dict, server: McpServer, failure: McpServerError) -> ToolOutcome:
    message = f"error: MCP server {server.spec.name!r} failed ({failure.kind}): {failure}"
    record |= {"is_error": True, "error": message[:RECORD_CHARS], "mcp_failure": failure.kind}
    return ToolOutcome(message, record)


def result_text(result: mcp_types.CallToolResult) -> str:
    """What the model reads of a result: its text blocks, and a note for each other block."""
    parts = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        else:
            parts.append(f"[{block.type} content]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


@contextmanager
def mcp_portal() -> Iterator[BlockingPortal]:
    """The SDK's event loop, in a thread of its own, for a wave's servers."""
    with start_blocking_portal() as portal:
        yield portal


def mcp_start(portal: BlockingPortal, stack: ExitStack, item: dict, sandbox: Any) -> McpServers | None:
    """The item's servers started in its sandbox (None when it names none); McpServerError if one
    does not start."""
    specs = mcp_servers_of(item)
    if not specs:
        return None
    servers = McpServers(portal, stack)
    servers.start(specs, sandbox)
    return servers


__all__ = [
    "McpServerError",
    "McpServers",
    "mcp_portal",
    "mcp_start",
    "namespaced",
    "sandbox_stdio",
    "server_argv",
]

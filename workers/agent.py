"""Multi-step agent episodes: the policy calls tools in a sandbox, turn by turn, until it submits
or spends the item's step budget; the reward rule then grades the final workspace.

The prompt is a multi-turn chat (system, the item's instructions as the user's message, then each
assistant turn with its tool calls and each tool's result), rendered with the policy's chat
template (`inference.tool_chat`: its `tools=` support where it has one, else the text protocol).
Each completion is parsed into tool calls, checked against the tools' JSON schemas (the item's
`tools`, built-ins by default: `workers.agent_tools`). A malformed call, an unknown tool or
arguments that fail the schema is an **invalid action**: recorded as a step (`valid: false`),
answered with an error message, and counted by the `invalid_actions` (and for a malformed one,
`format_errors`) reward terms. `submit` ends the episode.

Context limits are explicit: a tool's output is truncated (head and tail kept, a marker between)
and the record says by how much; when the conversation would not leave the model room to answer,
the oldest tool results are elided first, and each step records which were.

An item may also name MCP servers (`mcp_servers`, `workers.mcp_client`): they start inside the
episode's sandbox, their tools are offered beside the built-ins (`<server>__<tool>`), and a call of
one is answered by the server's `tools/call` and recorded as a built-in's is (with `mcp`: server
and tool). A server that fails mid-episode answers with a tool error (counted: `mcp_failure`); one
that does not start errors the episode.

Episodes of a batch advance together, one batched generation a turn, as many at once as the
sandbox pool lends sandboxes. Model output is untrusted: it only ever runs inside the sandbox.
"""

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from inference.generation import Completion
from inference.tool_chat import ToolCall, ToolCallError, chat_render, tool_calls_parse
from rewards.engine import Sample, ScoreResult, score
from rewards.graders.base import GraderError
from sandboxes.interface import InfrastructureError, Limits, task_spec
from sandboxes.services import sandbox_acquire, sandbox_pool
from workers.agent_tools import (
    SUBMIT,
    ToolOutcome,
    Workspace,
    item_tools,
    tool_run,
    truncated,
    workspace_diff,
    workspace_initial,
    workspace_read,
)

if TYPE_CHECKING:  # the SDK takes a second to import: only waves with MCP servers load it
    from workers.mcp_client import McpServers

COMMAND_SECONDS = 5.0
LIMITS = Limits(wall_seconds=COMMAND_SECONDS, cpu_seconds=COMMAND_SECONDS)
SYSTEM = "You are an agent working in a sandboxed workspace. Use the tools; call submit when you are done."
ELIDED = "[tool result elided: {chars} characters, to fit the context]"

Generate = Callable[[list[str]], list[Completion]]


class WaveTurns(Protocol):
    """A wave's multi-turn generator (a ChatSessions, reusing each episode's cache)."""

    def turn(self, keys: list[int], prompts: list[str]) -> list[Completion]:
        """One completion per episode index in `keys`."""
        ...


Sessions = Callable[[], WaveTurns]  # a factory: one per wave
Render = Callable[[list[dict], list[dict]], str]  # (messages, tools) -> prompt text


def plain_render(messages: list[dict], tools: list[dict]) -> str:
    """The text protocol without a chat template (for policies with none, and scripted tests)."""
    return chat_render(None, messages, tools)


def policy_render(policy, *, chat: bool = True) -> Render:
    """The conversation through the policy's chat template; a tier with `chat` off reads the text
    protocol's raw rendering."""
    if not chat:
        return plain_render
    return lambda messages, tools: chat_render(policy.tokenizer, messages, tools)


@dataclass
class Turn:
    """One step: what the policy was shown, what it answered, and what its calls did."""

    new_messages: list[dict]  # the messages since the previous turn (its observation)
    prompt: str  # the rendered prompt it answered
    completion: Completion
    calls: list[ToolCall] = field(default_factory=list)
    error: ToolCallError | None = None  # an invalid action
    results: list[dict] = field(default_factory=list)  # one record per call, in order
    files_changed: list[dict] = field(default_factory=list)
    elided: list[int] = field(default_factory=list)  # message indices elided from this prompt
    truncated_chars: int = 0  # cut from the tool outputs this turn produced

    @property
    def valid(self) -> bool:
        return self.error is None

    @property
    def submitted(self) -> bool:
        return any(call.name == SUBMIT for call in self.calls) and self.valid

    @property
    def mcp_failures(self) -> int:
        """Calls an MCP server failed (timed out, exited, wrote garbage, or had stopped before)."""
        return sum(bool(result.get("mcp_failure")) for result in self.results)

    def reply(self) -> dict:
        """The assistant's message: its text, and its calls when they parsed."""
        raw = self.completion.text  # rendered as written, so the next prompt extends this one
        if not self.valid:
            return {"role": "assistant", "content": raw, "raw": raw}
        text = raw.split("<tool_call>", 1)[0].strip()
        return {
            "role": "assistant",
            "content": text,
            "tool_calls": [call.message_part(index) for index, call in enumerate(self.calls)],
            "raw": raw,
        }

    def record(self) -> dict:
        """The turn as a trajectory step stores it (the replay's observation / action / result)."""
        data = {
            "observation": observation_text(self.new_messages),
            "messages": self.new_messages,
            "action": self.completion.text,
            "reply": self.reply(),
            "tool_calls": [{"name": call.name, "arguments": call.arguments} for call in self.calls],
            "valid": self.valid,
            "format_ok": self.error is None or self.error.kind != "format",
            "prompt_token_ids": self.completion.prompt_token_ids,
            "token_ids": self.completion.token_ids,
            "logprobs": self.completion.logprobs,
            "finish_reason": self.completion.finish_reason,
        }
        if self.error is not None:
            data["error"] = {"kind": self.error.kind, "message": str(self.error)}
        if self.results:
            data["tool_results"] = self.results
            data["tool_result"] = self.results[-1]
        if self.files_changed:
            data["files_changed"] = self.files_changed
        if self.elided:
            data["elided_messages"] = self.elided
        if self.truncated_chars:
            data["truncated_chars"] = self.truncated_chars
        return data


def observation_text(messages: list[dict]) -> str:
    """What a turn's new messages said, as the replay shows it."""
    parts = []
    for message in messages:
        role = message["role"]
        label = f"tool {message.get('name', '')}".strip() if role == "tool" else role
        parts.append(f"[{label}]\n{message.get('content') or ''}")
    return "\n".join(parts)


@dataclass
class AgentEpisode:
    item: dict
    tools: list[dict] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    submitted: bool = False
    error: str | None = None  # the infrastructure failed; the episode is errored
    error_kind: str = "sandbox_error"  # or mcp_server_error: a server of the item's did not start
    grade: ScoreResult | None = None
    workspace: Workspace = field(default_factory=Workspace)  # the latest snapshot
    seconds: float = 0.0  # wall time, acting and graded
    seen: int = 0  # messages already shown to the policy
    mcp: "McpServers | None" = None  # the item's MCP servers, running in its sandbox

    def __post_init__(self) -> None:
        if not self.tools:
            self.tools = item_tools(self.item)
        if not self.messages:
            system = self.item.get("system") or SYSTEM
            instructions = self.item["instructions"]
            self.messages = [{"role": "system", "content": system}, {"role": "user", "content": instructions}]
        self.workspace = workspace_initial(self.item)

    @property
    def done(self) -> bool:
        return self.submitted or self.error is not None or len(self.turns) >= int(self.item["max_steps"])

    @property
    def invalid_actions(self) -> int:
        return sum(not turn.valid for turn in self.turns)

    @property
    def mcp_failures(self) -> int:
        return sum(turn.mcp_failures for turn in self.turns)

    def mcp_started(self, servers: "McpServers | None") -> None:
        """Offer the servers' tools beside the built-ins (before submit, which stays last)."""
        self.mcp = servers
        if servers is None:
            return
        at = next(
            (i for i, tool in enumerate(self.tools) if tool["function"]["name"] == SUBMIT), len(self.tools)
        )
        self.tools = [*self.tools[:at], *servers.functions, *self.tools[at:]]

    @property
    def final_grade(self) -> ScoreResult:
        """The grade of a played episode (episodes_play grades each one it returns)."""
        if self.grade is None:
            raise ValueError("this episode has not been graded: episodes_play plays and grades episodes")
        return self.grade

    def sample(self) -> Sample:
        """What the reward rule sees: the last action, every step (for trajectory checks) and the
        final workspace's files."""
        steps = [
            {
                "kind": "tool_call",
                "valid": turn.valid,
                "format_ok": turn.error is None or turn.error.kind != "format",
                "tools": [call.name for call in turn.calls],
                # the shell commands, for the detectors that look for tampering with the checks
                "action": "\n".join(c.arguments["command"] for c in turn.calls if c.name == "shell"),
                "tokens": len(turn.completion.token_ids),
                "mcp_failures": turn.mcp_failures,
            }
            for turn in self.turns
        ]
        last = self.turns[-1].completion.text if self.turns else ""
        return Sample(
            output_text=last,
            steps=steps,
            files=dict(self.workspace.files),
            tokens=sum(len(turn.completion.token_ids) for turn in self.turns),
        )

    def conversation(self) -> list[dict]:
        """The whole conversation: system, instructions, each reply and each tool result."""
        return list(self.messages)


def context_fits(policy, max_new_tokens: int) -> Callable[[str], bool]:
    """Whether a rendered prompt leaves the policy room to answer."""
    budget = policy.max_context - int(max_new_tokens)
    return lambda text: len(policy.tokenizer(text)["input_ids"]) <= budget


def prompt_fitted(
    messages: list[dict], tools: list[dict], render: Render, fits: Callable[[str], bool]
) -> tuple[str, list[int]]:
    """The prompt, with the oldest tool results elided first until it fits; and which were."""
    shown = [dict(message) for message in messages]
    elided: list[int] = []
    prompt = render(shown, tools)
    candidates = [index for index, message in enumerate(shown) if _is_result(message)]
    for index in candidates:
        if fits(prompt):
            break
        shown[index]["content"] = ELIDED.format(chars=len(shown[index].get("content") or ""))
        elided.append(index)
        prompt = render(shown, tools)
    return prompt, elided


def _is_result(message: dict) -> bool:
    return message["role"] == "tool" or bool(message.get("error_observation"))


def episodes_play(
    items: list[dict],
    generate: Generate,
    *,
    rule: dict,
    render: Render = plain_render,
    fits: Callable[[str], bool] = lambda text: True,
    judge=None,
    on_done: Callable[[int, list[AgentEpisode]], None] | None = None,
    sessions: Sessions | None = None,
) -> list[AgentEpisode]:
    """Play one episode per item (repeat an item for a group) and grade each with `rule`; waves
    one smaller than the sandbox pool. `on_done(first item's index, wave)` gets each wave as it
    finishes, to store it early. With `sessions` (a ChatSessions factory, one per wave) each
    turn reuses its episode's key/value cache instead of calling `generate` on whole prompts."""
    # One sandbox stays free for graders that need a fresh one (the episodes' own are all held).
    wave = max(1, sandbox_pool().max_sandboxes - 1)
    episodes: list[AgentEpisode] = []
    for start in range(0, len(items), wave):
        turn = _turns(generate, sessions)
        played = _wave_play(items[start : start + wave], turn, rule, render, fits, judge)
        if on_done is not None:
            on_done(start, played)
        episodes += played
    return episodes


def _turns(
    generate: Generate, sessions: Sessions | None
) -> Callable[[list[int], list[str]], list[Completion]]:
    if sessions is None:
        return lambda keys, prompts: generate(prompts)
    return sessions().turn


def _wave_play(items, turn, rule: dict, render: Render, fits, judge) -> list[AgentEpisode]:
    started = time.monotonic()
    episodes = [AgentEpisode(item) for item in items]
    with ExitStack() as stack:
        specs = [task_spec(item.get("files") or {}, LIMITS, item.get("sandbox")) for item in items]
        sandboxes = [stack.enter_context(sandbox_acquire(spec)) for spec in specs]
        # The servers stop (their stack closes) before the portal, and before the graders run.
        with _mcp_portal(items) as portal, ExitStack() as servers:
            if portal is not None:
                for episode, sandbox in zip(episodes, sandboxes, strict=True):
                    _mcp_start(episode, sandbox, portal, servers)
            while live := [index for index, episode in enumerate(episodes) if not episode.done]:
                prompts = [prompt_fitted(episodes[i].messages, episodes[i].tools, render, fits) for i in live]
                completions = turn(live, [prompt for prompt, _ in prompts])
                for index, (prompt, elided), completion in zip(live, prompts, completions, strict=True):
                    episode_step(episodes[index], sandboxes[index], prompt, elided, completion)
        for episode, sandbox in zip(episodes, sandboxes, strict=True):
            episode.grade = _grade(episode, sandbox, rule, judge)
    for episode in episodes:  # a wave's episodes play side by side: each took the wave's time
        episode.seconds = time.monotonic() - started
    return episodes


def _mcp_portal(items: list[dict]) -> AbstractContextManager[Any]:
    """The MCP client's event loop, for a wave where an item names servers; else None."""
    if not any(item.get("mcp_servers") for item in items):
        return nullcontext(None)
    from workers.mcp_client import mcp_portal  # the MCP SDK loads only for items that name servers

    return mcp_portal()


def _mcp_start(episode: AgentEpisode, sandbox, portal, servers: ExitStack) -> None:
    """Start the item's MCP servers in its sandbox; one that does not start errors the episode
    (its tools would be missing: the episode would not be the task its author wrote)."""
    from workers.mcp_client import McpServerError, mcp_start  # as in _mcp_portal

    try:
        episode.mcp_started(mcp_start(portal, servers, episode.item, sandbox))
    except McpServerError as exc:
        episode.error, episode.error_kind = str(exc), "mcp_server_error"
    except InfrastructureError as exc:
        episode.error = f"the sandbox failed starting the MCP servers: {exc}"


def episode_step(
    episode: AgentEpisode, sandbox, prompt: str, elided: list[int], completion: Completion
) -> Turn:
    """Parse the completion, run its calls, and extend the conversation with what they returned."""
    turn = Turn(episode.messages[episode.seen :], prompt, completion, elided=elided)
    episode.turns.append(turn)
    try:
        turn.calls = tool_calls_parse(completion.text, episode.tools)
    except ToolCallError as exc:
        turn.error = exc
    episode.messages.append(turn.reply())
    episode.seen = len(episode.messages)
    if not turn.valid:
        episode.messages.append(
            {"role": "user", "content": f"Invalid action: {turn.error}", "error_observation": True}
        )
        return turn
    try:
        _calls_run(episode, sandbox, turn)
    except InfrastructureError as exc:  # the machinery failed, not the policy: the episode is errored
        episode.error = f"the sandbox failed at turn {len(episode.turns)}: {exc}"
    return turn


def _calls_run(episode: AgentEpisode, sandbox, turn: Turn) -> None:
    seconds = sandbox.limits.wall_seconds
    for call in turn.calls:
        if call.name == SUBMIT:
            turn.results.append({"submitted": True})
            episode.submitted = True
            break
        outcome = _tool_outcome(episode, call, sandbox, seconds)
        text, cut = truncated(outcome.output)
        turn.truncated_chars += cut
        record = {"tool": call.name, **outcome.record}
        if cut:
            record["truncated_chars"] = cut
        turn.results.append(record)
        if outcome.mutates:
            after = workspace_read(sandbox)
            turn.files_changed += workspace_diff(episode.workspace, after)
            episode.workspace = after
        episode.messages.append({"role": "tool", "name": call.name, "content": text})


def _tool_outcome(episode: AgentEpisode, call: ToolCall, sandbox, seconds: float) -> ToolOutcome:
    """A built-in runs in the sandbox; an MCP server's tool goes to its server (in the sandbox)."""
    if episode.mcp is not None and call.name in episode.mcp.routes:
        return episode.mcp.call(call.name, call.arguments)
    return tool_run(call, sandbox, episode.item, seconds)


def _grade(episode: AgentEpisode, sandbox, rule: dict, judge) -> ScoreResult:
    if episode.error is not None:
        return ScoreResult(
            total=None, errors=[GraderError("", episode.error_kind, episode.error)], errored=True
        )
    try:
        episode.workspace = workspace_read(sandbox)  # the final workspace, before a grader touches it
    except InfrastructureError as exc:
        episode.error = f"the sandbox failed reading the final workspace: {exc}"
        return ScoreResult(total=None, errors=[GraderError("", "sandbox_error", episode.error)], errored=True)
    item = {key: value for key, value in episode.item.items() if key != "pk"}
    return score(rule, item, episode.sample(), judge=judge, sandbox=sandbox)

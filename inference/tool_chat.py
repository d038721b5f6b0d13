"""Tool calls in chat: render a multi-turn conversation with tools, parse a completion's calls.

Tools are declared as JSON schemas in the OpenAI function format
(`{"type": "function", "function": {"name", "description", "parameters"}}`). A conversation is a
list of messages: `system`, `user`, `assistant` (with `tool_calls`) and `tool` (a call's result).

Rendering goes through the tokenizer's chat template. A template that takes `tools=` (it names
`tools`) gets the conversation as it is. Any other template gets the **text protocol**: the tools
are described in the system message, an assistant's calls are written into its content as
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, and a tool's result is a user
message `<tool_result name="...">...</tool_result>`; an assistant message that keeps the model's
own text under `raw` is rendered as that text, so each turn's prompt extends the last one and
its key/value cache can be reused. Either way a model answers with the same
tagged blocks (the format of Hermes, Qwen 2.5 and most open tool-calling models), which
`tool_calls_parse` reads back. Model output is untrusted text: it is only parsed, never run here.
"""

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inference.chat import template_text

if TYPE_CHECKING:  # the web process checks items' tools without loading transformers
    from transformers import PreTrainedTokenizerBase

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
MAX_CALL_CHARS = 200_000  # a call's JSON past this is refused unread
PROTOCOL = (
    'Call a tool as <tool_call>{{"name": "<tool>", "arguments": {{<arguments>}}}}</tool_call>\n'
    "Tools:\n{tools}"
)


class ToolCallError(ValueError):
    """A completion's action is invalid: `kind` is `format` (no call, or a call that is not the
    JSON object the protocol asks for), `unknown_tool` or `arguments` (they fail the schema)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def message_part(self, index: int) -> dict:
        """The call as an assistant message's `tool_calls` entry (OpenAI's shape)."""
        return {
            "id": f"call_{index}",
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def template_takes_tools(tokenizer: "PreTrainedTokenizerBase") -> bool:
    """Whether the tokenizer's chat template renders a `tools=` list (it refers to `tools`)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = " ".join(template.values())
    return "tools" in template


def tool_line(tool: dict) -> str:
    """One tool in the text protocol: its name, parameters (required ones marked) and description.

    >>> tool_line({"type": "function", "function": {"name": "shell", "description": "Run a command.",
    ...     "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
    ...     "required": ["command"]}}})
    '- shell(command: string): Run a command.'
    """
    function = tool["function"]
    parameters = function.get("parameters") or {}
    required = set(parameters.get("required") or [])
    names = [
        f"{name}{'' if name in required else '?'}: {spec.get('type', 'any')}"
        for name, spec in (parameters.get("properties") or {}).items()
    ]
    return f"- {function['name']}({', '.join(names)}): {function.get('description', '')}".rstrip(": ")


def text_protocol_messages(messages: list[dict], tools: list[dict]) -> list[dict]:
    """The conversation in the text protocol: only system, user and assistant roles, plain content."""
    protocol = PROTOCOL.format(tools="\n".join(tool_line(tool) for tool in tools))
    out: list[dict] = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "system":
            out.append({"role": "system", "content": f"{content}\n\n{protocol}".strip()})
        elif role == "assistant" and "raw" in message:  # the model's own words, as it wrote them
            out.append({"role": "assistant", "content": message["raw"]})
        elif role == "assistant":
            calls = [call["function"] for call in message.get("tool_calls") or []]
            blocks = "".join(f"{CALL_OPEN}{call_json(call)}{CALL_CLOSE}" for call in calls)
            out.append({"role": "assistant", "content": content + blocks})
        elif role == "tool":
            name = message.get("name", "")
            out.append({"role": "user", "content": f'<tool_result name="{name}">\n{content}\n</tool_result>'})
        else:
            out.append({"role": role, "content": content})
    if not out or out[0]["role"] != "system":
        out.insert(0, {"role": "system", "content": protocol})
    return out


def call_json(function: dict) -> str:
    return json.dumps({"name": function["name"], "arguments": function["arguments"]}, ensure_ascii=False)


def chat_render(
    tokenizer: "PreTrainedTokenizerBase | None",
    messages: list[dict],
    tools: list[dict],
    *,
    generation: bool = True,
) -> str:
    """The conversation as prompt text, through the chat template (see the module's docstring).
    `generation` appends the template's assistant header, ready for the next turn."""
    if tokenizer is not None and template_takes_tools(tokenizer):
        return template_text(tokenizer, messages, tools=tools, add_generation_prompt=generation)
    plain = text_protocol_messages(messages, tools)
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return _plain_text(plain, generation)
    return template_text(tokenizer, plain, add_generation_prompt=generation)


def reply_render(
    tokenizer: "PreTrainedTokenizerBase | None", messages: list[dict], reply: dict, tools: list[dict]
) -> tuple[str, str]:
    """(prompt, completion) text to train `reply` (an assistant message, maybe with tool calls)
    after `messages` with `tools`: both rendered as `chat_render` renders the conversation, the
    completion being what the reply adds to the prompt, without the template's end of turn (the
    trainer closes every completion with it, `inference.chat.turn_end_text`)."""
    from inference.chat import turn_end_text  # light; kept local so the web process imports less

    prompt = chat_render(tokenizer, messages, tools, generation=True)
    full = chat_render(tokenizer, [*messages, reply], tools, generation=False)
    if full.startswith(prompt):
        completion = full[len(prompt) :]
    else:  # a template that renders the last turn apart (it drops earlier reasoning, say)
        completion = text_protocol_messages([reply], tools)[-1]["content"]
    end = turn_end_text(tokenizer, chat=True) if tokenizer is not None else ""
    if end and end in completion:
        return prompt, completion[: completion.rindex(end)]
    return prompt, completion.rstrip("\n")


def _plain_text(messages: list[dict], generation: bool) -> str:
    text = "".join(f"<|{message['role']}|>\n{message['content']}\n" for message in messages)
    return text + ("<|assistant|>\n" if generation else "")


def tool_calls_parse(text: str, tools: list[dict]) -> list[ToolCall]:
    """The calls in a completion, each checked against its tool's schema; ToolCallError if any is
    invalid (the whole action is then invalid: none of its calls run).

    >>> shell = {"type": "function", "function": {"name": "shell", "parameters": {"type": "object",
    ...     "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
    >>> tool_calls_parse('<tool_call>{"name": "shell", "arguments": {"command": "ls"}}</tool_call>', [shell])
    [ToolCall(name='shell', arguments={'command': 'ls'})]
    >>> try:
    ...     tool_calls_parse('<tool_call>{"name": "shell", "arguments": {}}</tool_call>', [shell])
    ... except ToolCallError as exc:
    ...     print(exc.kind, exc)
    arguments shell: 'command' is required
    """
    blocks = CALL_BLOCK.findall(text)
    if not blocks:
        raise ToolCallError("format", f"no tool call: answer with {CALL_OPEN}{{...}}{CALL_CLOSE}")
    schemas = {tool["function"]["name"]: tool["function"].get("parameters") or {} for tool in tools}
    return [_call(block, schemas) for block in blocks]


def _call(block: str, schemas: dict[str, dict]) -> ToolCall:
    if len(block) > MAX_CALL_CHARS:
        raise ToolCallError("format", f"a tool call is {len(block)} characters (at most {MAX_CALL_CHARS})")
    text = block.strip()
    try:
        raw, end = json.JSONDecoder().raw_decode(text)
    except (ValueError, RecursionError) as exc:
        raise ToolCallError("format", f"a tool call is not valid JSON: {exc}") from None
    if text[end:].strip():
        raise ToolCallError("format", f"a tool call has text after its JSON: {text[end:].strip()[:80]!r}")
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise ToolCallError("format", 'a tool call must be {"name": "<tool>", "arguments": {...}}')
    arguments = raw.get("arguments", raw.get("parameters", {}))
    if isinstance(arguments, str):  # OpenAI's wire shape: arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise ToolCallError("format", f"{raw['name']}: arguments are not valid JSON") from None
    if not isinstance(arguments, dict):
        raise ToolCallError("format", f"{raw['name']}: arguments must be a JSON object")
    name = raw["name"]
    if name not in schemas:
        known = ", ".join(sorted(schemas))
        raise ToolCallError("unknown_tool", f"unknown tool {name[:80]!r} (tools: {known})")
    problem = schema_problem(schemas[name], arguments)
    if problem:
        raise ToolCallError("arguments", f"{name}: {problem}")
    return ToolCall(name, arguments)


TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


def schema_problem(schema: dict, value: Any, where: str = "") -> str | None:
    """What is wrong with `value` under a JSON schema (the subset function parameters use: type,
    properties, required, additionalProperties, enum, items), or None.

    >>> schema_problem({"type": "object", "properties": {"n": {"type": "integer"}}}, {"n": "2"})
    "'n' must be integer"
    >>> schema_problem({"type": "object", "additionalProperties": False}, {"x": 1})
    "'x' is not a parameter"
    """
    kind = schema.get("type")
    label = f"{where!r}" if where else "arguments"
    if kind in TYPES:
        wrong_bool = isinstance(value, bool) and kind in ("integer", "number")
        if not isinstance(value, TYPES[kind]) or wrong_bool:
            return f"{label} must be {kind}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{label} must be one of {schema['enum']}"
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        for name in schema.get("required") or []:
            if name not in value:
                return f"{_join(where, name)!r} is required"
        for name, inner in value.items():
            if name in properties:
                if problem := schema_problem(properties[name], inner, _join(where, name)):
                    return problem
            elif schema.get("additionalProperties") is False:
                return f"{_join(where, name)!r} is not a parameter"
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, inner in enumerate(value):
            if problem := schema_problem(schema["items"], inner, f"{where}[{index}]"):
                return problem
    return None


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


# --- the built-in tools of agent items ------------------------------------------------------


def _function(name: str, description: str, properties: dict, required: list[str]) -> dict:
    parameters: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    parameters["additionalProperties"] = False
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


STRING = {"type": "string"}
BUILTIN_TOOLS: dict[str, dict] = {
    "shell": _function("shell", "Run a shell command in the workspace.", {"command": STRING}, ["command"]),
    "read_file": _function("read_file", "Read a file of the workspace.", {"path": STRING}, ["path"]),
    "write_file": _function(
        "write_file", "Create or replace a file.", {"path": STRING, "content": STRING}, ["path", "content"]
    ),
    "run_tests": _function("run_tests", "Run the task's tests; each test's result.", {"path": STRING}, []),
    "submit": _function("submit", "Finish: the workspace is graded as it is.", {}, []),
}
SUBMIT = "submit"


def tool_name(entry: object) -> str | None:
    """A tool entry's name: a built-in's name, or an OpenAI function object naming one."""
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("function"), dict):
        name = entry["function"].get("name")
        return name if isinstance(name, str) else None
    return None


def item_tools(item: dict) -> list[dict]:
    """The tools an agent item offers: the built-ins it names in `tools` (by name, or as OpenAI
    function objects, the format exports write), else all of them.

    >>> [tool["function"]["name"] for tool in item_tools({"tools": ["write_file", "submit"]})]
    ['write_file', 'submit']
    """
    tools = []
    for entry in item.get("tools") or list(BUILTIN_TOOLS):
        name = tool_name(entry)
        if name is None or name not in BUILTIN_TOOLS:  # task import refuses such an item (tools_problem)
            raise KeyError(f"unknown tool {entry!r} (built-ins: {', '.join(BUILTIN_TOOLS)})")
        tools.append(BUILTIN_TOOLS[name])
    return tools


def tools_problem(tools: object) -> str | None:
    """What is wrong with an item's `tools` field, or None (task import checks it).

    >>> tools_problem(["shell", "browse"])
    "unknown tool 'browse' (built-ins: shell, read_file, write_file, run_tests, submit)"
    """
    if not isinstance(tools, list) or not tools:
        return "must be a non-empty list of tool names or OpenAI function objects"
    names = [tool_name(entry) for entry in tools]
    for entry, name in zip(tools, names, strict=True):
        if name not in BUILTIN_TOOLS:
            shown = name if name is not None else json.dumps(entry)[:80]
            return f"unknown tool {shown[:80]!r} (built-ins: {', '.join(BUILTIN_TOOLS)})"
    if SUBMIT not in names:
        return "must include submit (an episode ends with it)"
    return None

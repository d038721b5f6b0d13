"""OpenAI's fine-tuning JSONL lines, checked and mapped onto Flywheel task items. Pure: no database.

Three line formats, one per method (OpenAI's published formats):

- supervised: `{"messages": [...], "tools"?: [...], "parallel_tool_calls"?: bool, "functions"?: [...]}`;
  messages may carry `tool_calls`, `function_call`, `tool_call_id`, `name` and, on assistant
  messages, `weight` (0 or 1). As OpenAI does, Flywheel trains every assistant message whose
  weight is not 0, each on the conversation before it; a weight-0 one is context only.
- dpo: `{"input": {"messages": [...], "tools"?: ...}, "preferred_output": [assistant message],
  "non_preferred_output": [assistant message]}`.
- reinforcement: `{"messages": [...], ...}` where every other field is the item's own, reached by a
  grader as `{{ item.<field> }}` (or `item["<field>"]` in a `python` grader). A line that carries
  `tests` or `io_tests` (Flywheel's extension) is a Flywheel code item: its code fields (`tests`,
  `entry_point`, `setup_files`, ...) are checked as the task library checks them, and a
  `unit_tests` grader runs its tests in a sandbox.

An item is an `answer` task item (a `code` one for a reinforcement line with tests): its `messages`
are the prompt as Flywheel's chat rendering takes them (system first, user last): `developer`
becomes `system`, a tool's or function's result a user message marked `[tool result <id>]`, an
assistant's tool calls their JSON. Its `reference` is the
trained reply (supervised), the preferred reply (dpo, with `metadata.chosen` / `metadata.rejected`),
or the line's `reference_answer` / `reference` / `answer` field (reinforcement). The line as sent is
kept in `metadata.openai_line`, so the item says where it came from. A supervised line with tools
or tool calls also keeps `tool_chat` (`tool_chat_of`): the conversation as chat templates take it,
which the SFT learner renders with `tools=` so that it trains on what the model reads.
"""

import json
import re
from dataclasses import dataclass
from typing import Any

from inference.chat import messages_problems
from projects.task_format import KIND_FIELDS, validate_item

SUPERVISED, DPO, REINFORCEMENT = "supervised", "dpo", "reinforcement"
METHODS = (SUPERVISED, DPO, REINFORCEMENT)
CHAT, PREFERENCE = "chat", "preference"
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
MESSAGE_FIELDS = {"role", "content", "name", "weight", "tool_calls", "function_call", "tool_call_id"}
LINE_FIELDS = {
    SUPERVISED: {"messages", "tools", "parallel_tool_calls", "functions"},
    DPO: {"input", "preferred_output", "non_preferred_output"},
}
REFERENCE_FIELDS = ("reference_answer", "reference", "answer", "correct_answer")
# What an answer item holds of its own: a grader template that names another field reaches it in
# the item's metadata, where the reinforcement item keeps a line's own fields.
ITEM_FIELDS = {"kind", "id", "split", "metadata", "prompt", "messages", "reference"}
# A reinforcement line with one of these is a code item; these are the fields it may carry as one.
CODE_LINE_MARKS = ("tests", "io_tests")
CODE_FIELDS = tuple(name for name in KIND_FIELDS["code"] if name not in ("prompt", "messages"))


@dataclass(frozen=True)
class LineError:
    line: int
    field: str | None
    message: str

    def __str__(self) -> str:
        return f"line {self.line}" + (f", field '{self.field}'" if self.field else "") + f": {self.message}"


def format_of(method: str) -> str:
    return PREFERENCE if method == DPO else CHAT


def line_format(raw: Any) -> str:
    """chat (supervised and reinforcement lines) or preference (dpo lines), from a line's fields."""
    return PREFERENCE if isinstance(raw, dict) and "input" in raw else CHAT


def is_code_line(raw: Any) -> bool:
    """Whether a reinforcement line (or a grader's item) is a code item: it carries tests.

    >>> is_code_line({"messages": [], "tests": "assert f(1) == 2"}), is_code_line({"answer": "4"})
    (True, False)
    """
    return isinstance(raw, dict) and any(name in raw for name in CODE_LINE_MARKS)


def item_kind(raw: Any, method: str) -> str:
    return "code" if method == REINFORCEMENT and is_code_line(raw) else "answer"


def code_fields(line: int, raw: dict) -> tuple[dict[str, Any], list[LineError]]:
    """(the code fields as the task library keeps them, their problems) of a code line."""
    fields = {name: raw[name] for name in CODE_FIELDS if name in raw}
    parsed, errors = validate_item(line, {"kind": "code", "prompt": "-"} | fields, "flywheel")
    if parsed is None:
        return {}, [LineError(line, error.field, error.message) for error in errors]
    return {name: value for name, value in parsed.data.items() if name in CODE_FIELDS}, []


def line_problems(line: int, raw: Any, method: str) -> list[LineError]:
    """Every problem of one decoded line for `method` (or, for CHAT, of a chat line whatever it
    will train: an upload's check, before a job names the method); empty when it trains."""
    if not isinstance(raw, dict):
        return [LineError(line, None, "each line must be a JSON object")]
    if method == DPO:
        return _dpo_problems(line, raw)
    problems = []
    if method == CHAT:
        return _tools_problems(line, raw, "") + _messages_problems(line, raw.get("messages"), "messages")
    if method == SUPERVISED:
        problems += [
            LineError(
                line, name, "unknown field of a supervised line (known: messages, tools, parallel_tool_calls)"
            )
            for name in sorted(set(raw) - LINE_FIELDS[SUPERVISED])
        ]
    problems += _tools_problems(line, raw, "")
    problems += _messages_problems(line, raw.get("messages"), "messages")
    if problems:
        return problems
    if method == SUPERVISED:
        if _trained_index(raw["messages"]) is None:
            return [LineError(line, "messages", "holds no assistant message with a weight of 1 to train on")]
        empty = [i for i in _trained_indices(raw["messages"]) if not _reply_text(raw["messages"][i]).strip()]
        if empty:
            where = f"messages[{empty[0]}].content"
            return [
                LineError(
                    line, where, "a trained assistant reply is empty (give it weight 0 to keep it as context)"
                )
            ]
        prompt = _prompt_of(raw["messages"][: _trained_index(raw["messages"])])
    else:
        prompt = _prompt_of(raw["messages"])
        if is_code_line(raw):
            problems += code_fields(line, raw)[1]
    return problems + [
        LineError(line, "messages", _rendered(place, message)) for place, message in messages_problems(prompt)
    ]


def _rendered(place: str, message: str) -> str:
    return f"{message} (as Flywheel renders the conversation: {place})"


def _dpo_problems(line: int, raw: dict) -> list[LineError]:
    problems = [
        LineError(
            line, name, "unknown field of a dpo line (known: input, preferred_output, non_preferred_output)"
        )
        for name in sorted(set(raw) - LINE_FIELDS[DPO])
    ]
    source = raw.get("input")
    if not isinstance(source, dict):
        return problems + [LineError(line, "input", "is required: an object with messages")]
    problems += [
        LineError(line, f"input.{name}", "unknown field (known: messages, tools, parallel_tool_calls)")
        for name in sorted(set(source) - {"messages", "tools", "parallel_tool_calls"})
    ]
    problems += _tools_problems(line, source, "input.")
    problems += _messages_problems(line, source.get("messages"), "input.messages")
    for name in ("preferred_output", "non_preferred_output"):
        output = raw.get(name)
        if not isinstance(output, list) or len(output) != 1:
            problems.append(LineError(line, name, "is required: a list of one assistant message"))
            continue
        problems += _messages_problems(line, output, name)
        if not problems and output[0].get("role") != "assistant":
            problems.append(LineError(line, f"{name}[0].role", "must be assistant"))
    if problems:
        return problems
    if _reply_text(raw["preferred_output"][0]) == _reply_text(raw["non_preferred_output"][0]):
        return [
            LineError(
                line, "non_preferred_output", "is the same reply as preferred_output: it teaches nothing"
            )
        ]
    prompt = _prompt_of(source["messages"])
    return [LineError(line, "input.messages", _rendered(p, m)) for p, m in messages_problems(prompt)]


def _tools_problems(line: int, raw: dict, prefix: str) -> list[LineError]:
    problems = []
    for key in ("tools", "functions"):
        tools = raw.get(key)
        if tools is None:
            continue
        if not isinstance(tools, list):
            problems.append(LineError(line, f"{prefix}{key}", "must be a list"))
            continue
        for index, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, dict) and key == "tools" else tool
            if key == "tools" and (not isinstance(tool, dict) or tool.get("type") != "function"):
                problems.append(LineError(line, f"{prefix}{key}[{index}].type", "must be function"))
            elif not isinstance(function, dict) or not _is_text(function.get("name")):
                where = f"{prefix}{key}[{index}]" + (".function" if key == "tools" else "")
                problems.append(LineError(line, f"{where}.name", "is required: the function's name"))
    if "parallel_tool_calls" in raw and not isinstance(raw["parallel_tool_calls"], bool):
        problems.append(LineError(line, f"{prefix}parallel_tool_calls", "must be true or false"))
    return problems


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _messages_problems(line: int, messages: Any, name: str) -> list[LineError]:
    if not isinstance(messages, list) or not messages:
        return [LineError(line, name, "is required: a non-empty list of messages")]
    problems = []
    for index, message in enumerate(messages):
        problems += _message_problems(line, f"{name}[{index}]", message)
    return problems


def _message_problems(line: int, where: str, message: Any) -> list[LineError]:
    if not isinstance(message, dict):
        return [LineError(line, where, "must be an object with a role")]
    problems = [
        LineError(
            line, f"{where}.{key}", f"unknown field of a message (known: {', '.join(sorted(MESSAGE_FIELDS))})"
        )
        for key in sorted(set(message) - MESSAGE_FIELDS, key=str)
    ]
    role = message.get("role")
    if role not in ROLES:
        return problems + [
            LineError(line, f"{where}.role", f"must be one of {', '.join(ROLES)}; got {role!r}")
        ]
    if "weight" in message and (
        role != "assistant" or message["weight"] not in (0, 1) or isinstance(message["weight"], bool)
    ):
        problems.append(LineError(line, f"{where}.weight", "must be 0 or 1, on an assistant message"))
    for key in ("tool_calls", "function_call"):
        if key in message and role != "assistant":
            problems.append(LineError(line, f"{where}.{key}", "only an assistant message makes calls"))
    problems += _calls_problems(line, where, message)
    if role == "tool" and not _is_text(message.get("tool_call_id")):
        problems.append(LineError(line, f"{where}.tool_call_id", "is required on a tool message"))
    if "name" in message and not isinstance(message["name"], str):
        problems.append(LineError(line, f"{where}.name", "must be a string"))
    content = message.get("content")
    if content is None and not (
        role == "assistant" and (message.get("tool_calls") or message.get("function_call"))
    ):
        problems.append(LineError(line, f"{where}.content", "is required (null only beside tool_calls)"))
    elif content is not None and _text_of(content) is None:
        problems.append(LineError(line, f"{where}.content", "must be a string or a list of text parts"))
    return problems


def _calls_problems(line: int, where: str, message: dict) -> list[LineError]:
    problems = []
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list) or not calls:
            return [LineError(line, f"{where}.tool_calls", "must be a non-empty list")]
        for index, call in enumerate(calls):
            place = f"{where}.tool_calls[{index}]"
            function = call.get("function") if isinstance(call, dict) else None
            if (
                not isinstance(call, dict)
                or call.get("type", "function") != "function"
                or not isinstance(function, dict)
            ):
                problems.append(
                    LineError(line, place, "must be {id, type: function, function: {name, arguments}}")
                )
            elif not _is_text(function.get("name")) or not isinstance(function.get("arguments"), str):
                problems.append(
                    LineError(line, f"{place}.function", "needs a name and arguments (a JSON string)")
                )
    call = message.get("function_call")
    if call is not None and (
        not isinstance(call, dict)
        or not _is_text(call.get("name"))
        or not isinstance(call.get("arguments"), str)
    ):
        problems.append(
            LineError(line, f"{where}.function_call", "needs a name and arguments (a JSON string)")
        )
    return problems


def _text_of(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        for part in content
    ):
        return "".join(part["text"] for part in content)
    return None


def _trained_indices(messages: list[dict]) -> list[int]:
    """Every assistant message with a weight other than 0: the replies Flywheel trains, in order."""
    return [
        index
        for index, message in enumerate(messages)
        if message["role"] == "assistant" and message.get("weight", 1) != 0
    ]


def _trained_index(messages: list[dict]) -> int | None:
    """The last trained reply: the item's own `reference` (the others are its `earlier_turns`)."""
    indices = _trained_indices(messages)
    return indices[-1] if indices else None


def _reply_text(message: dict) -> str:
    """An assistant message as the text the model writes: its content, then its calls as JSON."""
    text = _text_of(message.get("content")) or ""
    calls = message.get("tool_calls") or ([message["function_call"]] if message.get("function_call") else [])
    if calls:
        rendered = json.dumps({"tool_calls": calls}, ensure_ascii=False)
        text = f"{text}\n{rendered}" if text else rendered
    return text


def _prompt_of(messages: list[dict]) -> list[dict]:
    """The conversation as Flywheel's chat rendering takes it (system first, then user and assistant)."""
    rendered = []
    for index, message in enumerate(messages):
        role = message["role"]
        if role in ("tool", "function"):
            marker = message.get("tool_call_id") or message.get("name") or role
            rendered.append(
                {"role": "user", "content": f"[tool result {marker}] {_text_of(message.get('content'))}"}
            )
        elif role in ("system", "developer"):
            text = _text_of(message["content"]) or ""
            rendered.append(
                {"role": "system", "content": text}
                if index == 0
                else {"role": "user", "content": f"[system] {text}"}
            )
        elif role == "assistant":
            rendered.append({"role": "assistant", "content": _reply_text(message)})
        else:
            rendered.append({"role": "user", "content": _text_of(message["content"]) or ""})
    return rendered


def tool_chat_of(raw: dict, index: int) -> dict[str, Any] | None:
    """For a supervised line that declares tools or holds tool calls: the conversation before the
    trained reply, the reply and the tools, in the shape chat templates take (`tools=`, assistant
    `tool_calls` with arguments as objects, `tool` messages), so that the SFT learner renders them
    with the model's template (`inference.tool_chat.reply_render`) as the model will read them.
    None for a plain chat line, which trains as before."""
    tools = raw.get("tools") or [{"type": "function", "function": f} for f in raw.get("functions") or []]
    messages = raw["messages"]
    if not tools and not any(
        m.get("tool_calls") or m.get("function_call") or m["role"] in ("tool", "function") for m in messages
    ):
        return None
    converted = [_template_message(m) for m in messages[: index + 1]]
    # A tool result names its function (templates and Flywheel's protocol show it), found by its call.
    names = {c.get("id"): c["function"]["name"] for m in converted for c in m.get("tool_calls", [])}
    for message in converted:
        if message["role"] == "tool" and "name" not in message and message.get("tool_call_id") in names:
            message["name"] = names[message["tool_call_id"]]
    return {"messages": converted[:-1], "reply": converted[-1], "tools": tools}


def _template_message(message: dict) -> dict[str, Any]:
    """One OpenAI message as chat templates take it (no weight; legacy function fields as tools)."""
    role = {"developer": "system", "function": "tool"}.get(message["role"], message["role"])
    out: dict[str, Any] = {"role": role, "content": _text_of(message.get("content")) or ""}
    calls = message.get("tool_calls") or (
        [{"type": "function", "function": message["function_call"]}] if message.get("function_call") else []
    )
    if calls:
        out["tool_calls"] = [
            {key: value for key, value in call.items() if key != "function"}
            | {"type": "function", "function": _call_function(call["function"])}
            for call in calls
        ]
    for key in ("name", "tool_call_id"):
        if key in message:
            out[key] = message[key]
    return out


def _call_function(function: dict) -> dict[str, Any]:
    """A call's function with its arguments as an object when they are a JSON object's text (what
    templates, which write `arguments | tojson`, and Flywheel's tool protocol expect)."""
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            arguments = parsed
    return {"name": function["name"], "arguments": arguments}


def item_data(raw: dict, method: str) -> dict[str, Any]:
    """The answer item's data for a line `line_problems` passed."""
    if method == DPO:
        chosen = _reply_text(raw["preferred_output"][0])
        rejected = _reply_text(raw["non_preferred_output"][0])
        metadata = {"chosen": chosen, "rejected": rejected, "openai_line": raw}
        return {"messages": _prompt_of(raw["input"]["messages"]), "reference": chosen, "metadata": metadata}
    if method == SUPERVISED:
        *earlier, index = _trained_indices(raw["messages"])
        data = _supervised_turn(raw, index) | {"metadata": {"openai_line": raw}}
        if earlier:  # trained too, each on its own context (workers/learners/sft.py expands them)
            data["earlier_turns"] = [_supervised_turn(raw, turn) for turn in earlier]
        return data
    extras = {key: value for key, value in raw.items() if key not in ("messages", "tools")}
    reference = next((raw[key] for key in REFERENCE_FIELDS if key in raw), "")
    data = {key: value for key, value in extras.items() if key not in ITEM_FIELDS}
    if is_code_line(raw):
        data |= code_fields(0, raw)[0]
    return data | {
        "messages": _prompt_of(raw["messages"]),
        "reference": reference if isinstance(reference, str) else json.dumps(reference),
        "metadata": extras | {"openai_line": raw},
    }


def _supervised_turn(raw: dict, index: int) -> dict[str, Any]:
    """One trained reply of a supervised line: the conversation before it, the reply, and (for a
    line with tools) the same as chat templates take it."""
    turn: dict[str, Any] = {
        "messages": _prompt_of(raw["messages"][:index]),
        "reference": _reply_text(raw["messages"][index]),
    }
    if (tool_chat := tool_chat_of(raw, index)) is not None:
        turn["tool_chat"] = tool_chat
    return turn


ITEM_REFERENCE = re.compile(r"\bitem\s*(?:\.\s*([A-Za-z_]\w*)|\[\s*['\"]([A-Za-z_]\w*)['\"]\s*\])")
NOT_TEMPLATES = {
    "type",
    "name",
    "source",
    "operation",
    "evaluation_metric",
    "model",
    "labels",
    "passing_labels",
}


def grader_for_items(grader: Any) -> Any:
    """The grader with each template reference to a line's own field (`{{ item.answer_key }}`) read
    from the item's metadata, where a reinforcement item keeps them; a `python` grader's source is
    left as it is (its `item` holds the fields themselves)."""
    if isinstance(grader, list):
        return [grader_for_items(value) for value in grader]
    if not isinstance(grader, dict):
        return grader
    out = {}
    for key, value in grader.items():
        if isinstance(value, str) and key not in NOT_TEMPLATES:
            out[key] = ITEM_REFERENCE.sub(_metadata_reference, value)
        else:
            out[key] = grader_for_items(value)
    return out


def _metadata_reference(match: re.Match) -> str:
    name = match[1] or match[2]
    return match[0] if name in ITEM_FIELDS else f"item.metadata.{name}"

"""The OpenAI-compatible contract that vLLM and SGLang serve, for Flywheel's tiers and checkpoints.

`/v1/completions` and `/v1/chat/completions` requests are checked here (`request_parse`) into a
`ServeRequest`, decoded with the model's tier settings (request values override the tier's
temperature, top_p, top_k, stop and token budget; precision, speculation and batching stay the
tier's), and answered in OpenAI's shapes: whole (`response_body`) or as server-sent events
(`ChoiceStream` releases text and tokens as they are generated, never past a stop sequence).
Errors are OpenAI's error object (`OpenAIError.body`). Django-free and torch-free: the caller
hands in token ids, log-probs and top log-probs.
"""

import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inference.chat import MAX_MESSAGES, messages_problems
from inference.settings import MAX_NEW_TOKENS, TierSettings
from inference.tool_chat import CALL_OPEN, ToolCallError, tool_calls_parse

MAX_CHOICES = 16
MAX_TOP_LOGPROBS = 20
MAX_PROMPTS = 64
ROLES = ("system", "user", "assistant", "developer")  # developer: OpenAI's newer name for system
TOOL_ROLES = (*ROLES, "tool")  # a conversation with tools also holds the tools' results
MAX_TOOLS = 128
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
TOOL_CHOICES = ("auto", "none")
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


class OpenAIError(Exception):
    """An answer in OpenAI's error shape: the status, a message, the parameter at fault, a code."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}  # sent with the answer (Retry-After)

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error object.

    >>> error_body(404, "no model x", "model", "model_not_found")["error"]["type"]
    'invalid_request_error'
    """
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# --- requests ----------------------------------------------------------------------------------


@dataclass
class ServeRequest:
    """A checked request: the prompts (or chat messages) and how to decode them."""

    model: str
    chat: bool
    prompts: list[str | tuple[int, ...]] = field(default_factory=list)  # completions: text, or token ids
    messages: list[dict[str, Any]] = field(default_factory=list)  # chat: the conversation
    tools: list[dict] = field(default_factory=list)  # chat: OpenAI function tools offered
    tool_choice: str = "auto"  # "none": the tools are shown, the answer is never read as calls
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    seed: int | None = None
    overrides: dict[str, Any] = field(default_factory=dict)  # tier settings the request changes
    max_tokens: int | None = None
    tokens_as_ids: bool = False  # vLLM's return_tokens_as_token_ids: log-prob tokens as "token_id:<n>"
    metadata: dict[str, str] = field(default_factory=dict)  # OpenAI's: up to 16 string pairs

    def settings(self, tier: TierSettings) -> TierSettings:
        """The tier's settings with the request's decoding values in place of its own."""
        return tier.with_(**self.overrides)


def _check(condition: bool, message: str, param: str | None) -> None:
    if not condition:
        raise _invalid(message, param)


def _invalid(message: str, param: str | None) -> OpenAIError:
    """The 400 that names the parameter at fault (raised where the check also narrows a type)."""
    return OpenAIError(400, message, param, "invalid_value")


def _number(body: dict, name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    _check(isinstance(value, int | float) and not isinstance(value, bool), f"{name} must be a number", name)
    _check(low <= value <= high, f"{name} must be between {low:g} and {high:g}; got {value}", name)
    return value


def _integer(body: dict, name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    _check(isinstance(value, int) and not isinstance(value, bool), f"{name} must be an integer", name)
    _check(low <= value <= high, f"{name} must be between {low} and {high}; got {value}", name)
    return value


def _stops(body: dict) -> tuple[str, ...] | None:
    stop = body.get("stop")
    if stop is None:
        return None
    stops = [stop] if isinstance(stop, str) else stop
    _check(
        isinstance(stops, list) and all(isinstance(s, str) and s for s in stops),
        "stop must be a non-empty string or a list of them",
        "stop",
    )
    _check(len(stops) <= 16, "stop takes at most 16 sequences", "stop")
    return tuple(stops)


def _unsupported(body: dict) -> None:
    """Parameters Flywheel does not honour are refused, never silently ignored."""
    for name in ("presence_penalty", "frequency_penalty"):
        _check(body.get(name) in (None, 0, 0.0), f"{name} is not supported; leave it 0", name)
    _check(not body.get("logit_bias"), "logit_bias is not supported", "logit_bias")
    _check(not body.get("echo"), "echo is not supported", "echo")
    _check(body.get("suffix") is None, "suffix is not supported", "suffix")
    best_of = body.get("best_of")
    _check(best_of in (None, 1, body.get("n", 1)), "best_of is not supported", "best_of")
    response_format = body.get("response_format")
    _check(
        response_format in (None, {"type": "text"}),
        "response_format is not supported",
        "response_format",
    )


def _is_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value)
    )


def _prompts(body: dict) -> list[str | tuple[int, ...]]:
    """A string, a list of strings, a list of token ids, or a list of such lists (OpenAI's four
    shapes); token ids are taken as they are, never re-tokenized."""
    prompt = body.get("prompt")
    _check(prompt is not None, "prompt is required", "prompt")
    if isinstance(prompt, str) or _is_ids(prompt):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise _invalid("prompt must not be empty", "prompt")
    prompts: list[str | tuple[int, ...]] = []
    for index, one in enumerate(prompt):
        _check(
            isinstance(one, str) or _is_ids(one),
            "each prompt must be a string or a non-empty list of token ids (integers from 0)",
            f"prompt[{index}]" if len(prompt) > 1 else "prompt",
        )
        prompts.append(one if isinstance(one, str) else tuple(one))
    _check(len(prompts) <= MAX_PROMPTS, f"at most {MAX_PROMPTS} prompts a request", "prompt")
    return prompts


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    _check(isinstance(content, list), f"{where} must be a string or a list of text parts", where)
    texts = []
    for index, part in enumerate(content):
        ok = isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        _check(ok, "only text content parts are supported", f"{where}[{index}]")
        texts.append(part["text"])
    return "".join(texts)


def _messages(body: dict) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages must be a non-empty list", "messages")
    checked = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        _check(isinstance(message, dict), "each message must be an object", where)
        role = message.get("role")
        _check(role in ROLES, f"role must be one of {', '.join(ROLES)}", f"{where}.role")
        text = _content(message.get("content"), f"{where}.content")
        checked.append({"role": "system" if role == "developer" else role, "content": text})
    for param, problem in messages_problems(checked):
        raise OpenAIError(400, f"{param}: {problem}", param, "invalid_value")
    return checked


def _tools(body: dict) -> list[dict]:
    """The `tools` of a chat request: OpenAI function objects, each name unique."""
    tools = body.get("tools")
    if tools in (None, []):
        return []
    _check(isinstance(tools, list), "tools must be a list of function tools", "tools")
    _check(len(tools) <= MAX_TOOLS, f"at most {MAX_TOOLS} tools", "tools")
    names: set[str] = set()
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        _check(
            isinstance(tool, dict) and tool.get("type") == "function",
            'type must be "function"',
            f"{where}.type",
        )
        function = tool.get("function")
        _check(isinstance(function, dict), "function must be an object", f"{where}.function")
        name = function.get("name")
        _check(
            isinstance(name, str) and bool(TOOL_NAME.match(name)),
            "name must be 1 to 64 letters, digits, underscores or dashes",
            f"{where}.function.name",
        )
        _check(name not in names, f"two tools are named {name!r}", f"{where}.function.name")
        names.add(name)
        parameters = function.get("parameters", {})
        _check(
            isinstance(parameters, dict),
            "parameters must be a JSON schema object",
            f"{where}.function.parameters",
        )
        description = function.get("description", "")
        _check(isinstance(description, str), "description must be a string", f"{where}.function.description")
    return [
        {"type": "function", "function": {k: v for k, v in tool["function"].items() if k != "strict"}}
        for tool in tools
    ]


def _tool_choice(body: dict, tools: list[dict]) -> str:
    choice = body.get("tool_choice")
    if choice is None:
        return "auto" if tools else "none"
    _check(
        choice in TOOL_CHOICES,
        'tool_choice must be "auto" or "none": Flywheel does not constrain decoding to force a call '
        "(the model decides; an answer that is not a valid call comes back as content)",
        "tool_choice",
    )
    return choice


def _arguments(value: Any, where: str) -> dict:
    """A call's arguments as an object: OpenAI's wire shape is a JSON string."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            raise OpenAIError(
                400, "arguments must be a JSON object (or its text)", where, "invalid_value"
            ) from None
    _check(isinstance(value, dict), "arguments must be a JSON object (or its text)", where)
    return value


def _assistant_calls(message: dict, where: str) -> list[dict]:
    calls = message.get("tool_calls") or []
    _check(isinstance(calls, list), "tool_calls must be a list", f"{where}.tool_calls")
    checked = []
    for index, call in enumerate(calls):
        at = f"{where}.tool_calls[{index}]"
        _check(isinstance(call, dict), "each tool call must be an object", at)
        function = call.get("function")
        _check(
            isinstance(function, dict) and isinstance(function.get("name"), str),
            "function.name is required",
            f"{at}.function",
        )
        checked.append(
            {
                "id": str(call.get("id") or f"call_{index}"),
                "type": "function",
                "function": {
                    "name": function["name"],
                    "arguments": _arguments(function.get("arguments"), f"{at}.function.arguments"),
                },
            }
        )
    return checked


def _tool_messages(body: dict) -> list[dict[str, Any]]:
    """A conversation with tools, taken whole: an assistant's `tool_calls` (its content may then be
    null) and each `tool` result, named after the call it answers."""
    messages = body["messages"]
    _check(len(messages) <= MAX_MESSAGES, f"at most {MAX_MESSAGES} messages", "messages")
    checked: list[dict[str, Any]] = []
    call_names: dict[str, str] = {}
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        _check(isinstance(message, dict), "each message must be an object", where)
        role = message.get("role")
        _check(role in TOOL_ROLES, f"role must be one of {', '.join(TOOL_ROLES)}", f"{where}.role")
        calls = _assistant_calls(message, where) if role == "assistant" else []
        content = message.get("content")
        if content is None:
            _check(
                bool(calls),
                "content may be null only in an assistant message with tool_calls",
                f"{where}.content",
            )
            content = ""
        one: dict[str, Any] = {
            "role": "system" if role == "developer" else role,
            "content": _content(content, f"{where}.content"),
        }
        if calls:
            one["tool_calls"] = calls
            call_names |= {call["id"]: call["function"]["name"] for call in calls}
        if role == "tool":
            call_id = message.get("tool_call_id")
            _check(
                isinstance(call_id, str) and bool(call_id),
                "tool_call_id is required",
                f"{where}.tool_call_id",
            )
            one["tool_call_id"] = call_id
            one["name"] = message.get("name") or call_names.get(call_id, "")
        checked.append(one)
    _check(
        checked[-1]["role"] in ("user", "tool"),
        "must end with a user message or a tool result: the model writes the reply",
        "messages",
    )
    return checked


def request_parse(body: Any, *, chat: bool) -> ServeRequest:
    """Check a completions (or chat completions) body; OpenAIError names the parameter at fault."""
    _check(isinstance(body, dict), "the body must be a JSON object", None)
    model = body.get("model")
    _check(isinstance(model, str) and bool(model), "model is required", "model")
    _unsupported(body)
    request = ServeRequest(model=model, chat=chat)
    if chat:
        request.tools = _tools(body)
        request.tool_choice = _tool_choice(body, request.tools)
        messages = body.get("messages")
        _check(isinstance(messages, list) and bool(messages), "messages must be a non-empty list", "messages")
        with_tools = request.tools or any(
            isinstance(m, dict) and (m.get("role") == "tool" or m.get("tool_calls")) for m in messages
        )
        request.messages = _tool_messages(body) if with_tools else _messages(body)
        request.logprobs = bool(body.get("logprobs"))
        request.top_logprobs = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
        _check(
            request.logprobs or not request.top_logprobs,
            "top_logprobs needs logprobs set to true",
            "top_logprobs",
        )
        max_tokens = _integer(body, "max_completion_tokens", 1, MAX_NEW_TOKENS)
        request.max_tokens = max_tokens or _integer(body, "max_tokens", 1, MAX_NEW_TOKENS)
    else:
        request.prompts = _prompts(body)
        top = _integer(body, "logprobs", 0, MAX_TOP_LOGPROBS)
        request.logprobs, request.top_logprobs = top is not None, top or 0
        request.max_tokens = _integer(body, "max_tokens", 1, MAX_NEW_TOKENS)
    request.n = _integer(body, "n", 1, MAX_CHOICES) or 1
    metadata = body.get("metadata") or {}
    _check(
        isinstance(metadata, dict)
        and len(metadata) <= 16
        and all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
            for k, v in metadata.items()
        ),
        "metadata must be an object of at most 16 string values (keys up to 64 characters, values up to 512)",
        "metadata",
    )
    request.metadata = metadata
    request.seed = _integer(body, "seed", -(2**63), 2**64 - 1)
    request.stream = bool(body.get("stream"))
    request.tokens_as_ids = bool(body.get("return_tokens_as_token_ids"))
    options = body.get("stream_options") or {}
    _check(isinstance(options, dict), "stream_options must be an object", "stream_options")
    request.include_usage = bool(options.get("include_usage"))
    overrides = {
        "temperature": _number(body, "temperature", 0, 2),
        "top_p": _number(body, "top_p", 0, 1),
        "top_k": _integer(body, "top_k", -1, 1 << 20),
        "stop": _stops(body),
        "max_new_tokens": request.max_tokens,
    }
    _check(overrides["top_p"] != 0, "top_p must be more than 0", "top_p")
    if overrides["top_k"] == -1:  # vLLM's spelling of "no top-k"
        overrides["top_k"] = 0
    request.overrides = {name: value for name, value in overrides.items() if value is not None}
    return request


# --- answers -----------------------------------------------------------------------------------

TokenText = Callable[[int], str]  # a token id's text


@dataclass
class Token:
    """A generated token as the answer reports it."""

    id: int
    logprob: float
    top: list[tuple[int, float]]  # the most likely tokens at its position, best first
    offset: int = 0  # where its text starts in the choice's text


def logprobs_completion(tokens: list[Token], text_of: TokenText) -> dict[str, Any]:
    """The legacy completions shape: parallel lists."""
    return {
        "tokens": [text_of(t.id) for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [{text_of(i): lp for i, lp in t.top} for t in tokens],
        "text_offset": [t.offset for t in tokens],
    }


def _entry(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def logprobs_chat(tokens: list[Token], text_of: TokenText) -> dict[str, Any]:
    """The chat shape: one entry a token, with its bytes and its top alternatives."""
    return {
        "content": [
            _entry(text_of(t.id), t.logprob) | {"top_logprobs": [_entry(text_of(i), lp) for i, lp in t.top]}
            for t in tokens
        ],
        "refusal": None,
    }


def completion_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


@dataclass
class Reply:
    """What a chat answer says: its content and the tool calls read from it."""

    content: str | None
    tool_calls: list[dict]


def reply_read(request: ServeRequest, text: str) -> Reply:
    """The completion as an assistant message: with tools offered (and tool_choice not "none"), its
    `<tool_call>` blocks become OpenAI `tool_calls` (arguments as JSON text), the text before them
    the content. An answer whose calls are invalid (bad JSON, an unknown tool, arguments the schema
    refuses) comes back whole as content, as vLLM's tool parsers do: the agent sees what the model
    wrote, and nothing is run on its behalf.

    >>> tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    >>> request = ServeRequest(model="m", chat=True, tools=[tool])
    >>> reply = reply_read(request, 'Sure. <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    >>> reply.content, reply.tool_calls[0]["function"]
    ('Sure.', {'name': 'add', 'arguments': '{"a": 1}'})
    >>> reply_read(request, '<tool_call>{"name": "mul"}</tool_call>').tool_calls
    []
    """
    if not request.tools or request.tool_choice == "none" or CALL_OPEN not in text:
        return Reply(text, [])
    try:
        calls = tool_calls_parse(text, request.tools)
    except ToolCallError:
        return Reply(text, [])
    content = text[: text.index(CALL_OPEN)].strip()
    tool_calls = [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
        }
        for call in calls
    ]
    return Reply(content or None, tool_calls)


def choice_body(
    request: ServeRequest, index: int, text: str, tokens: list[Token], finish: str | None, text_of: TokenText
) -> dict[str, Any]:
    logprobs = None
    if request.logprobs:
        logprobs = (logprobs_chat if request.chat else logprobs_completion)(tokens, text_of)
    if request.chat:
        reply = reply_read(request, text)
        return {
            "index": index,
            "message": {
                "role": "assistant",
                "content": reply.content,
                "refusal": None,
                "tool_calls": reply.tool_calls,
            },
            "logprobs": logprobs,
            "finish_reason": "tool_calls" if reply.tool_calls else finish,
        }
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}


def usage_body(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def response_body(
    request: ServeRequest, ident: str, choices: list[dict], usage: dict[str, int]
) -> dict[str, Any]:
    return {
        "id": ident,
        "object": "chat.completion" if request.chat else "text_completion",
        "created": int(time.time()),
        "model": request.model,
        "choices": choices,
        "usage": usage,
        "system_fingerprint": None,
    }


def sse(data: dict | str) -> str:
    """One server-sent event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


DONE = sse("[DONE]")


# --- streaming ---------------------------------------------------------------------------------


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many characters at the end of `text` could still turn into a stop sequence (or are an
    unfinished UTF-8 character), and so must not be sent yet.

    >>> held_back("x = 1\\n#", ("\\n##",)), held_back("abc", ("\\n",)), held_back("ab\\ufffd", ())
    (2, 0, 1)
    """
    hold = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:size]):
                hold = size
                break
    if text.endswith("\ufffd"):
        hold = max(hold, 1)
    return hold


@dataclass
class ChoiceStream:
    """One choice as it streams: the text so far (decoded from every token emitted), what has been
    sent, and the tokens whose text has been sent. `add` takes a token and returns the new text
    and tokens to send; `finish` takes the completion's final text and returns the rest."""

    decode: Callable[[list[int]], str]
    stops: tuple[str, ...]
    ids: list[int] = field(default_factory=list)
    tokens: list[Token] = field(default_factory=list)
    sent: str = ""
    released: int = 0  # tokens sent
    stopped: bool = False  # a stop sequence appeared: nothing more is sent

    def add(self, token: Token) -> tuple[str, list[Token]]:
        if self.stopped:
            return "", []
        token.offset = len(self.decode(self.ids))
        self.ids.append(token.id)
        self.tokens.append(token)
        text = self.decode(self.ids)
        cuts = [text.find(stop) for stop in self.stops if stop in text]
        if cuts:
            self.stopped = True
            return self._release(text[: min(cuts)])
        return self._release(text[: len(text) - held_back(text, self.stops)])

    def finish(self, text: str) -> tuple[str, list[Token]]:
        """The rest of the text, and every token not sent yet: log-probs report each generated
        token (the end-of-sequence token and a stop sequence's included), as vLLM's do."""
        self.stopped = False
        delta, tokens = self._release(text)
        rest, self.released = self.tokens[self.released :], len(self.tokens)
        return delta, tokens + rest

    def _release(self, visible: str) -> tuple[str, list[Token]]:
        delta = visible[len(self.sent) :] if visible.startswith(self.sent) else ""
        self.sent += delta
        start = self.released
        while self.released < len(self.tokens) and self.tokens[self.released].offset < len(self.sent):
            self.released += 1
        return delta, self.tokens[start : self.released]


def chunk_body(
    request: ServeRequest,
    ident: str,
    created: int,
    index: int,
    text: str,
    tokens: list[Token],
    finish: str | None,
    text_of: TokenText,
    first: bool = False,
) -> dict[str, Any]:
    """One streamed chunk of one choice."""
    logprobs = None
    if request.logprobs and (tokens or not request.chat):
        logprobs = (logprobs_chat if request.chat else logprobs_completion)(tokens, text_of)
    if request.chat:
        delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {}
        if text and not first:
            delta["content"] = text
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        kind = "text_completion"
    return {
        "id": ident,
        "object": kind,
        "created": created,
        "model": request.model,
        "choices": [choice],
        "system_fingerprint": None,
    }


def reply_chunks(
    request: ServeRequest,
    ident: str,
    created: int,
    index: int,
    text: str,
    finish: str | None,
    text_of: TokenText,
) -> list[dict[str, Any]]:
    """A choice of a streamed request with tools, sent once it is whole (its calls can only be read
    then): its content, then its tool calls with their finish reason."""
    reply = reply_read(request, text)
    chunks = []
    if reply.content:
        chunks.append(chunk_body(request, ident, created, index, reply.content, [], None, text_of))
    last = chunk_body(
        request, ident, created, index, "", [], "tool_calls" if reply.tool_calls else finish, text_of
    )
    if reply.tool_calls:
        last["choices"][0]["delta"]["tool_calls"] = [
            {"index": position, **call} for position, call in enumerate(reply.tool_calls)
        ]
    return [*chunks, last]


def usage_chunk(request: ServeRequest, ident: str, created: int, usage: dict[str, int]) -> dict[str, Any]:
    return {
        "id": ident,
        "object": "chat.completion.chunk" if request.chat else "text_completion",
        "created": created,
        "model": request.model,
        "choices": [],
        "usage": usage,
        "system_fingerprint": None,
    }

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
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inference.chat import messages_problems
from inference.settings import MAX_NEW_TOKENS, TierSettings

MAX_CHOICES = 16
MAX_TOP_LOGPROBS = 20
MAX_PROMPTS = 64
ROLES = ("system", "user", "assistant", "developer")  # developer: OpenAI's newer name for system
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
    messages: list[dict[str, str]] = field(default_factory=list)  # chat: the conversation
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    seed: int | None = None
    overrides: dict[str, Any] = field(default_factory=dict)  # tier settings the request changes
    max_tokens: int | None = None
    tokens_as_ids: bool = False  # vLLM's return_tokens_as_token_ids: log-prob tokens as "token_id:<n>"

    def settings(self, tier: TierSettings) -> TierSettings:
        """The tier's settings with the request's decoding values in place of its own."""
        return tier.with_(**self.overrides)


def _check(condition: bool, message: str, param: str) -> None:
    if not condition:
        raise OpenAIError(400, message, param, "invalid_value")


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
    _check(body.get("tools") in (None, []), "tools are not supported", "tools")
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
    _check(isinstance(prompt, list) and bool(prompt), "prompt must not be empty", "prompt")
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
    _check(isinstance(messages, list) and bool(messages), "messages must be a non-empty list", "messages")
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


def request_parse(body: Any, *, chat: bool) -> ServeRequest:
    """Check a completions (or chat completions) body; OpenAIError names the parameter at fault."""
    _check(isinstance(body, dict), "the body must be a JSON object", None)
    model = body.get("model")
    _check(isinstance(model, str) and bool(model), "model is required", "model")
    _unsupported(body)
    request = ServeRequest(model=model, chat=chat)
    if chat:
        request.messages = _messages(body)
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


def choice_body(
    request: ServeRequest, index: int, text: str, tokens: list[Token], finish: str | None, text_of: TokenText
) -> dict[str, Any]:
    logprobs = None
    if request.logprobs:
        logprobs = (logprobs_chat if request.chat else logprobs_completion)(tokens, text_of)
    if request.chat:
        return {
            "index": index,
            "message": {"role": "assistant", "content": text, "refusal": None, "tool_calls": []},
            "logprobs": logprobs,
            "finish_reason": finish,
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

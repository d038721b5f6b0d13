"""The OpenAI-compatible endpoint at /v1/: `models`, `completions` and `chat/completions`, whole or
streamed as server-sent events, with log-probs, for every tier and checkpoint the caller may view.

The contract is the one vLLM and SGLang serve (inference/openai_protocol.py), so client code written
against Flywheel talks to them unchanged. Callers authenticate with a Flywheel API token as the
bearer key (the browser's playground with its session and CSRF token); every error is OpenAI's
error object, and requests count against the caller's API rate. Views are asynchronous: a model
loads in a worker thread before the view answers (so a load failure has its status), then generates
in one while the body is sent, whole or as a stream of each token's text as it is decoded; a
client that goes away stops its generation.

What a training engine needs is served as vLLM serves it: token-id prompts,
`return_tokens_as_token_ids`, and LoRA adapters loaded at run time (`load_lora_adapter`,
`unload_lora_adapter`), so an engine tier of another deployment can point at this one.
"""

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from functools import wraps
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from core import strict_json
from inference import openai_protocol as protocol
from inference.openai_protocol import OpenAIError
from inference.settings import TierSettings
from serving import served_models
from serving.openai_auth import caller

logger = logging.getLogger(__name__)
View = Callable[..., Coroutine[Any, Any, HttpResponseBase]]
_cache = None
_cache_lock = threading.Lock()


class ClientGoneError(Exception):
    """The streaming client disconnected: the generation stops at its next token."""


def models_cache():
    """This process's loaded models (torch is imported on the first request that needs a model)."""
    global _cache
    from inference.serving import ModelCache  # loads torch

    with _cache_lock:
        if _cache is None:
            _cache = ModelCache(settings.FLYWHEEL_SERVE_MODELS)
        return _cache


def openai_errors(view: View) -> View:
    """Answer OpenAIError (and anything unexpected) in OpenAI's error shape."""

    @wraps(view)
    async def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        try:
            return await view(request, *args, **kwargs)
        except OpenAIError as exc:
            return JsonResponse(exc.body(), status=exc.status, headers=exc.headers)
        except Exception:
            logger.exception("the OpenAI-compatible endpoint failed on %s", request.path)
            return JsonResponse(protocol.error_body(500, "internal error; it has been logged"), status=500)

    return csrf_exempt(wrapped)


def _model_for(user: User, model_id: str, fetch: bool = False) -> served_models.ServedModel:
    try:
        return served_models.served_model_for(user=user, model_id=model_id, fetch=fetch)
    except served_models.UnknownModelError as exc:
        raise OpenAIError(404, str(exc), "model", "model_not_found") from exc


def _method(request: HttpRequest, allowed: str) -> None:
    if request.method != allowed:
        raise OpenAIError(
            405, f"{request.method} is not allowed here; use {allowed}", None, "method_not_allowed"
        )


# --- models ------------------------------------------------------------------------------------


@openai_errors
async def models_list(request: HttpRequest) -> HttpResponse:
    _method(request, "GET")

    def listed() -> list[dict]:
        return [model.card() for model in served_models.served_models_for(user=caller(request))]

    return JsonResponse({"object": "list", "data": await sync_to_async(listed)()})


@openai_errors
async def model_detail(request: HttpRequest, model_id: str) -> HttpResponse:
    _method(request, "GET")
    user = await sync_to_async(caller)(request)
    model = await sync_to_async(_model_for)(user, model_id)
    return JsonResponse(model.card())


# --- completions -------------------------------------------------------------------------------


@openai_errors
async def completions(request: HttpRequest) -> HttpResponseBase:
    return await _complete(request, chat=False)


@openai_errors
async def chat_completions(request: HttpRequest) -> HttpResponseBase:
    return await _complete(request, chat=True)


def _parse(request: HttpRequest, chat: bool) -> protocol.ServeRequest:
    try:
        body = strict_json.loads(request.body or b"null")
    except (strict_json.JsonInputError, ValueError, UnicodeDecodeError) as exc:
        raise OpenAIError(400, f"the body is not valid JSON: {exc}", None, "invalid_json") from exc
    return protocol.request_parse(body, chat=chat)


EPISODE_HEADER = "X-Flywheel-Episode"


def _turn_keeper(
    request: HttpRequest,
    user: User,
    model: served_models.ServedModel,
    serve: protocol.ServeRequest,
) -> Callable[..., None] | None:
    """What keeps this request's turn for an external agent's episode, named by the
    X-Flywheel-Episode header or `metadata.episode_id`; None when the request names none."""
    episode = request.headers.get(EPISODE_HEADER) or serve.metadata.get("episode_id")
    if not episode:
        return None
    for keeper_for in served_models.TURN_KEEPERS:
        if (keeper := keeper_for(user=user, model=model, episode=episode, n=serve.n)) is not None:
            return keeper
    raise OpenAIError(
        400,
        f"episode {episode[:80]!r} is not an episode of `{model.id}`: an episode is played on its run's "
        "model, run-<id>, as POST /api/v1/runs/<id>/episodes handed it out",
        "metadata.episode_id",
        "invalid_value",
    )


async def _complete(request: HttpRequest, *, chat: bool) -> HttpResponseBase:
    _method(request, "POST")
    user = await sync_to_async(caller)(request)
    serve_request = _parse(request, chat)
    model = await sync_to_async(_model_for)(user, serve_request.model, fetch=True)
    keeper = await sync_to_async(_turn_keeper)(request, user, model, serve_request)
    prepared = await asyncio.to_thread(_prepare, model, serve_request)
    logger.info(
        "serving %s for user %s: %d row(s)%s",
        serve_request.model,
        user.pk,
        len(prepared.prompts),
        f", adapter {model.root}" if model.kind == "adapter" else "",
    )
    if serve_request.stream:
        events = (_events_whole if serve_request.tools else _events)(prepared, serve_request, keeper)
        response = StreamingHttpResponse(events, content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # a proxy in front must not hold the events back
        return response
    return StreamingHttpResponse(
        _whole_body(prepared, serve_request, keeper), content_type="application/json"
    )


async def _whole_body(prepared, request: protocol.ServeRequest, keeper=None) -> AsyncIterator[bytes]:
    """The whole answer as one JSON body, generated while the body is sent. The middleware chain is
    synchronous, so a view holds its process's one sync thread (which every request of the process
    passes through) until it returns; generating here, after it returned, does not."""
    try:
        body, completions = await asyncio.to_thread(_whole, prepared, request)
        await _keep(keeper, prepared, completions, body)
    except Exception:  # noqa: BLE001 - the status is sent; the body says what happened
        logger.exception("generation failed")
        body = protocol.error_body(500, "generation failed; it has been logged")
    yield json.dumps(body).encode()


async def _keep(keeper, prepared, completions: list, body: dict) -> None:
    """Hand an episode's turn to its keeper, before the agent reads the answer (so the outcome it
    reports next always finds the turn recorded)."""
    if keeper is not None:
        message = body["choices"][0].get("message") or {}
        await sync_to_async(keeper)(prompt=prepared.prompts[0], completion=completions[0], reply=message)


async def _events_whole(prepared, request: protocol.ServeRequest, keeper=None) -> AsyncIterator[str]:
    """A streamed request with tools: its calls can only be read from the whole answer, so each
    choice is sent once it is whole (its content, then its tool calls), then usage and [DONE]."""
    from inference.serving import token_text  # loads torch

    try:
        body, completions = await asyncio.to_thread(_whole, prepared, request)
        await _keep(keeper, prepared, completions, body)
    except Exception as exc:  # noqa: BLE001 - reported in the stream, as vLLM does
        logger.exception("streaming generation failed")
        yield protocol.sse(protocol.error_body(500, f"generation failed: {exc}"))
        yield protocol.DONE
        return
    ident, created = body["id"], body["created"]
    text_of = token_text(prepared.served.tier, request.tokens_as_ids)
    for index, completion in enumerate(completions):
        yield protocol.sse(
            protocol.chunk_body(request, ident, created, index, "", [], None, text_of, first=True)
        )
        for chunk in protocol.reply_chunks(
            request, ident, created, index, completion.text, completion.finish_reason, text_of
        ):
            yield protocol.sse(chunk)
    if request.include_usage:
        yield protocol.sse(protocol.usage_chunk(request, ident, created, body["usage"]))
    yield protocol.DONE


def _prepare(model: served_models.ServedModel, request: protocol.ServeRequest):
    from inference.serving import serve_prepare  # loads torch

    tier_settings = TierSettings.from_config(model.config)
    if tier_settings.remote:
        raise OpenAIError(
            400,
            f"`{model.id}` decodes on an external engine ({tier_settings.engine_url}); send requests there",
            "model",
            "model_not_served_here",
        )
    served = models_cache().get(model.source, tier_settings)
    return serve_prepare(served, request, tier_settings, adapter=model.adapter)


def _streams(prepared, request: protocol.ServeRequest) -> list[protocol.ChoiceStream]:
    from inference.serving import text_decoder  # loads torch

    decode = text_decoder(prepared.served.tier)
    return [protocol.ChoiceStream(decode, tuple(prepared.settings.stop)) for _ in prepared.prompts]


def _whole(prepared, request: protocol.ServeRequest) -> tuple[dict, list]:
    from inference.serving import serve_generate, token_text  # loads torch

    streams = _streams(prepared, request)

    def add(row: int, token: protocol.Token) -> None:
        streams[row].add(token)

    completions = serve_generate(prepared, request, add)
    text_of = token_text(prepared.served.tier, request.tokens_as_ids)
    choices = []
    for index, (stream, completion) in enumerate(zip(streams, completions, strict=True)):
        stream.finish(completion.text)
        tokens = stream.tokens[: stream.released]
        choices.append(
            protocol.choice_body(request, index, completion.text, tokens, completion.finish_reason, text_of)
        )
    generated = sum(len(completion.token_ids) for completion in completions)
    usage = protocol.usage_body(prepared.prompt_tokens, generated)
    return protocol.response_body(request, protocol.completion_id(request.chat), choices, usage), completions


async def _events(prepared, request: protocol.ServeRequest, keeper=None) -> AsyncIterator[str]:
    """The stream: each choice's text as it is released, then its finish reason, [DONE] last."""
    from inference.serving import serve_generate, token_text  # loads torch

    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    gone = threading.Event()
    streams = _streams(prepared, request)
    ident, created = protocol.completion_id(request.chat), int(time.time())
    text_of = token_text(prepared.served.tier, request.tokens_as_ids)

    def chunk(index: int, text: str, tokens: list, finish: str | None = None, first: bool = False) -> str:
        body = protocol.chunk_body(request, ident, created, index, text, tokens, finish, text_of, first)
        return protocol.sse(body)

    def sink(row: int, token: protocol.Token) -> None:
        if gone.is_set():
            raise ClientGoneError
        loop.call_soon_threadsafe(queue.put_nowait, ("token", row, streams[row].add(token)))

    def work() -> None:
        try:
            completions = serve_generate(prepared, request, sink)
            loop.call_soon_threadsafe(queue.put_nowait, ("done", None, completions))
        except ClientGoneError:
            pass
        except Exception as exc:  # noqa: BLE001 - reported in the stream, as vLLM does
            logger.exception("streaming generation failed")
            loop.call_soon_threadsafe(queue.put_nowait, ("error", None, exc))

    worker = loop.run_in_executor(None, work)
    try:
        if request.chat:  # the assistant's role first, as OpenAI sends it
            for index in range(len(streams)):
                yield chunk(index, "", [], first=True)
        while True:
            kind, row, value = await queue.get()
            if kind == "token":
                text, tokens = value
                if text or tokens:
                    yield chunk(row, text, tokens)
                continue
            if kind == "error":
                yield protocol.sse(protocol.error_body(500, f"generation failed: {value}"))
                break
            if keeper is not None:
                message = {"role": "assistant", "content": value[0].text, "tool_calls": []}
                await sync_to_async(keeper)(prompt=prepared.prompts[0], completion=value[0], reply=message)
            for index, (stream, completion) in enumerate(zip(streams, value, strict=True)):
                text, tokens = stream.finish(completion.text)
                yield chunk(index, text, tokens, completion.finish_reason)
            if request.include_usage:
                generated = sum(len(completion.token_ids) for completion in value)
                usage = protocol.usage_body(prepared.prompt_tokens, generated)
                yield protocol.sse(protocol.usage_chunk(request, ident, created, usage))
            break
        yield protocol.DONE
    finally:
        gone.set()  # a client that went away stops the generation at its next token
        with contextlib.suppress(Exception):
            await worker


# --- LoRA adapters loaded at run time (vLLM's contract) -----------------------------------------


def _body(request: HttpRequest) -> dict:
    try:
        body = strict_json.loads(request.body or b"null")
    except (strict_json.JsonInputError, ValueError, UnicodeDecodeError) as exc:
        raise OpenAIError(400, f"the body is not valid JSON: {exc}", None, "invalid_json") from exc
    if not isinstance(body, dict):
        raise OpenAIError(400, "the body must be a JSON object", None, "invalid_value")
    return body


@openai_errors
async def load_lora_adapter(request: HttpRequest) -> HttpResponse:
    """`POST /v1/load_lora_adapter {lora_name, lora_path, base_model?}`: serve a run's policy
    version (an adapter in the artifact storage, `lora_path` its name there) under `lora_name`,
    on the tier `base_model` (`tier-<id>`; by default the caller's one tier whose base model the
    adapter was trained on). Loading the same adapter under the same name again is harmless."""
    _method(request, "POST")
    user = await sync_to_async(caller)(request)
    body = _body(request)
    try:
        adapter = await sync_to_async(served_models.adapter_load)(
            user=user, name=body.get("lora_name"), artifact=body.get("lora_path"), base=body.get("base_model")
        )
    except served_models.AdapterLoadError as exc:
        raise OpenAIError(exc.status, str(exc), exc.param, "invalid_value") from exc
    return HttpResponse(
        f"Success: LoRA adapter '{adapter.name}' added successfully.", content_type="text/plain"
    )


@openai_errors
async def unload_lora_adapter(request: HttpRequest) -> HttpResponse:
    """`POST /v1/unload_lora_adapter {lora_name}`: stop serving the adapter."""
    _method(request, "POST")
    user = await sync_to_async(caller)(request)
    body = _body(request)
    try:
        name = await sync_to_async(served_models.adapter_unload)(user=user, name=body.get("lora_name"))
    except served_models.AdapterLoadError as exc:
        raise OpenAIError(exc.status, str(exc), exc.param, "not_found") from exc
    return HttpResponse(f"Success: LoRA adapter '{name}' removed successfully.", content_type="text/plain")


def openai_not_found(request: HttpRequest, path: str = "") -> JsonResponse:
    return JsonResponse(
        protocol.error_body(404, f"no such endpoint: {request.method} {request.path}", None, "not_found"),
        status=404,
    )

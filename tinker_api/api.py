"""The Tinker API at /tinker/api/v1/, as the official `tinker` SDK calls it: point a script at
Flywheel with `tinker.ServiceClient(base_url="<flywheel>/tinker")` and a Flywheel API token as the
key (`TINKER_API_KEY=tml-<token>`: the SDK wants its prefix, the server drops it).

An adapter, like the OpenAI fine-tuning API (finetuning/api.py): each view authenticates as /v1/
does, finds the session, model or sampler in a project the caller belongs to, calls a service or a
selector and answers in the SDK's shapes. Work is queued as requests (futures): `retrieve_future`
holds the poll until the answer is written or FLYWHEEL_TINKER_POLL_SECONDS pass ("try again"), so a
waiting client costs one query every few milliseconds of the server's, not a request of its own.
Refusals are 4xx with `x-should-retry: false` (the SDK retries 409 and 5xx) and a `detail`.
"""

import json
import logging
import time
from collections.abc import Callable
from functools import wraps
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from core import strict_json
from core.roles import Permission
from core.tokens import token_digest
from finetuning.selectors import NoProjectError, project_of
from inference.openai_protocol import OpenAIError
from projects import selectors as project_selectors
from projects.models import Project
from runs.models import Run
from serving.openai_auth import caller
from tinker_api import notify, selectors, services, wire
from tinker_api.models import TinkerModel, TinkerRequest, TinkerSession
from tinker_api.services import TinkerApiError

logger = logging.getLogger(__name__)
# The longest wait between looks at a pending request while a poll is held, when no wake-up comes
# (tinker_api.notify wakes it as the request finishes): 50 ms at first, doubling to 500 ms.
POLL_INTERVAL = (0.05, 0.5)

CLIENT_CONFIG = {
    # API keys, no JWT exchange; plain httpx (the SDK's pyqwest transport is for its cloud).
    "pjwt_auth_enabled": False,
    "credential_default_source": "api_key",
    "use_pyqwest_transport": False,
    # One model's requests run in the order they came: chunks of a forward_backward go one by one.
    "parallel_fwdbwd_chunks": False,
    "proto_compress_fwdbwd": False,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
}


def _refusal(status: int, message: str) -> JsonResponse:
    response = JsonResponse({"detail": message, "error": message}, status=status)
    if status < 500 and status not in (408, 429):
        response["x-should-retry"] = "false"
    return response


def tinker_api(*methods: str) -> Callable:
    """Authenticate, refuse other methods, and answer every refusal in one shape."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in methods:
                return _refusal(405, f"{request.method} is not allowed here; use {' or '.join(methods)}")
            try:
                user = _caller(request)
                return view(request, user, *args, **kwargs)
            except TinkerApiError as exc:
                return _refusal(exc.status, str(exc))
            except OpenAIError as exc:
                response = _refusal(exc.status, exc.message)
                for name, value in (exc.headers or {}).items():
                    response[name] = value
                return response
            except NoProjectError as exc:
                return _refusal(400, str(exc))
            except PermissionDenied as exc:
                return _refusal(403, str(exc))
            except wire.WireError as exc:
                return _refusal(400, str(exc))
            except Exception:
                logger.exception("the Tinker API failed on %s", request.path)
                return _refusal(500, "internal error; it has been logged")

        return csrf_exempt(wrapped)

    return decorate


def _caller(request: HttpRequest):
    """The user behind the API key (`X-API-Key: tml-<Flywheel token>`, or a bearer token)."""
    key = request.META.get("HTTP_X_API_KEY", "")
    if key and not request.META.get("HTTP_AUTHORIZATION"):
        request.META["HTTP_AUTHORIZATION"] = f"Bearer {key.removeprefix('tml-')}"
        request.__dict__.pop("headers", None)  # built from META once; read it again
    if not request.META.get("HTTP_AUTHORIZATION"):
        raise TinkerApiError(401, "send your Flywheel API token as the API key (TINKER_API_KEY=tml-<token>)")
    return caller(request)


def _body(request: HttpRequest) -> dict:
    try:
        body = strict_json.loads(request.body or b"{}")
    except (strict_json.JsonInputError, ValueError, UnicodeDecodeError) as exc:
        raise TinkerApiError(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise TinkerApiError(400, "the body must be a JSON object")
    return body


def _idempotency(request: HttpRequest) -> str:
    return request.headers.get("X-Idempotency-Key", "")[:200]


def _editable_session(user, key: Any) -> TinkerSession:
    session = selectors.session_for(user=user, key=str(key or ""))
    if session is None:
        raise TinkerApiError(404, f"no session {key!r} in a project of yours", field="session_id")
    project_selectors.require(user=user, project_id=session.project_id, permission=Permission.EDIT)
    return session


def _editable_model(user, model_id: Any) -> TinkerModel:
    model = selectors.model_for(user=user, model_id=str(model_id or ""))
    if model is None:
        raise TinkerApiError(404, f"no model {model_id!r} in a project of yours", field="model_id")
    project_selectors.require(user=user, project_id=model.session.project_id, permission=Permission.EDIT)
    return model


def _future(request: TinkerRequest, **extra: Any) -> JsonResponse:
    body = {"request_id": request.key}
    if request.model is not None:
        body["model_id"] = request.model.model_id
    return JsonResponse(body | extra)


# --- service ---------------------------------------------------------------------------------


@csrf_exempt
def healthz(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"status": "ok"})


@tinker_api("POST")
def client_config(request: HttpRequest, user) -> HttpResponse:
    # The SDK splits a forward_backward into chunks of at most this many (estimated) bytes: half the
    # server's body limit, so that no chunk is refused as too large.
    chunk = min(5_000_000, settings.FLYWHEEL_MAX_BODY_MB * 1024 * 1024 // 2)
    return JsonResponse(CLIENT_CONFIG | {"fwdbwd_max_chunk_bytes_count": chunk})


@tinker_api("POST")
def client_dynamic_config(request: HttpRequest, user) -> HttpResponse:
    return JsonResponse({"refresh_interval_sec": 300, "sample_cancel_enabled": False})


@tinker_api("POST")
def telemetry(request: HttpRequest, user) -> HttpResponse:
    """The SDK's own telemetry: accepted and dropped (Flywheel's runs record what it needs)."""
    return JsonResponse({"status": "accepted"})


def _project(request: HttpRequest, user, named: Any) -> Project:
    parts = request.headers.get("Authorization", "").split()
    digest = token_digest(parts[1]) if len(parts) == 2 else None
    named_by = "project_id (ServiceClient(project_id=...) or TINKER_PROJECT_ID)"
    return project_of(user=user, header=str(named) if named else None, token_digest=digest, named_by=named_by)


@tinker_api("GET")
def server_capabilities(request: HttpRequest, user) -> HttpResponse:
    try:
        projects = [_project(request, user, request.GET.get("project_id"))]
    except NoProjectError:  # no default: what any of the caller's projects offers
        projects = list(Project.objects.filter(pk__in=project_selectors.visible_project_ids(user=user)))
    names = list(
        dict.fromkeys(name for project in projects for name in selectors.models_offered(project=project))
    )
    return JsonResponse(
        {"supported_models": [{"model_name": name, "trainable": True, "sampleable": True} for name in names]}
    )


@tinker_api("POST")
def create_session(request: HttpRequest, user) -> HttpResponse:
    body = _body(request)
    project = _project(request, user, body.get("project_id"))
    session = services.session_create(user=user, project=project, body=body)
    return JsonResponse({"type": "create_session", "session_id": session.key})


@tinker_api("POST")
def session_heartbeat(request: HttpRequest, user) -> HttpResponse:
    session = _editable_session(user, _body(request).get("session_id"))
    services.session_heartbeat(session=session)
    return JsonResponse({"type": "session_heartbeat"})


@tinker_api("POST")
def session_finish(request: HttpRequest, user, session_id: str) -> HttpResponse:
    session = _editable_session(user, session_id)
    services.session_end(session=session)
    return JsonResponse({})


@tinker_api("GET")
def session_detail(request: HttpRequest, user, session_id: str) -> HttpResponse:
    session = selectors.session_for(user=user, key=session_id)
    if session is None:
        raise TinkerApiError(404, f"no session {session_id!r} in a project of yours")
    return JsonResponse(
        {
            "training_run_ids": [model.model_id for model in session.models.order_by("seq_id")],
            "sampler_ids": [sampler.key for sampler in session.samplers.order_by("pk")],
        }
    )


# --- training --------------------------------------------------------------------------------


@tinker_api("POST")
def create_model(request: HttpRequest, user) -> HttpResponse:
    body = _body(request)
    session = _editable_session(user, body.get("session_id"))
    queued = services.model_create(session=session, by=user, body=body, idempotency_key=_idempotency(request))
    return _future(queued)


@tinker_api("POST")
def get_info(request: HttpRequest, user) -> HttpResponse:
    model = selectors.model_for(user=user, model_id=str(_body(request).get("model_id") or ""))
    if model is None:
        raise TinkerApiError(404, "no such model in a project of yours", field="model_id")
    tier_config = model.run.tier_config
    return JsonResponse(
        {
            "type": "get_info",
            "model_id": model.model_id,
            "model_name": model.base_model,
            "is_lora": model.lora is not None,
            "lora_rank": model.lora["rank"] if model.lora else None,
            # The client loads the tokenizer itself (AutoTokenizer.from_pretrained): the tier's base
            # model, a path on this machine or a hub id.
            "model_data": {
                "arch": "causal_lm",
                "model_name": model.base_model,
                "tokenizer_id": tier_config["base_model"],
            },
        }
    )


@tinker_api("POST")
def forward_backward(request: HttpRequest, user) -> HttpResponse:
    if wire.PROTO_CONTENT_TYPE not in request.headers.get("Content-Type", ""):
        raise TinkerApiError(415, f"send forward_backward as {wire.PROTO_CONTENT_TYPE} (the SDK does)")
    if request.headers.get("Content-Encoding"):
        raise TinkerApiError(415, "send the body uncompressed (this server's client config asks for that)")
    parsed = wire.forward_backward_read(request.body)  # checked here: a bad datum fails at once
    model = _editable_model(user, parsed.model_id)
    kind = TinkerRequest.Kind.FORWARD if parsed.forward_only else TinkerRequest.Kind.FORWARD_BACKWARD
    queued = services.request_submit(
        model=model, kind=kind, body=request.body, idempotency_key=_idempotency(request)
    )
    return _future(queued)


def _submit(user, kind: str, body: dict, idempotency_key: str) -> HttpResponse:
    """Queue a JSON request for a model's learner, once its body is checked."""
    model = _editable_model(user, body.get("model_id"))
    if kind == TinkerRequest.Kind.OPTIM_STEP:
        _adam_check(body)
    elif kind in (TinkerRequest.Kind.SAVE_WEIGHTS, TinkerRequest.Kind.SAVE_WEIGHTS_FOR_SAMPLER):
        if body.get("path") is not None:
            services.name_check(str(body["path"]))
    elif kind == TinkerRequest.Kind.LOAD_WEIGHTS:
        services.weights_for(user=user, path=str(body.get("path")), kind="weights", field="path")
    queued = services.request_submit(
        model=model, kind=kind, body=json.dumps(body).encode(), idempotency_key=idempotency_key
    )
    return _future(queued)


def _model_request(kind: str) -> Callable:
    @tinker_api("POST")
    def view(request: HttpRequest, user) -> HttpResponse:
        return _submit(user, kind, _body(request), _idempotency(request))

    return view


def _adam_check(body: dict) -> None:
    params = body.get("adam_params")
    if params is None:
        if body.get("optimizer_params") is not None:
            raise TinkerApiError(
                400, "this server trains with AdamW: send adam_params", field="optimizer_params"
            )
        raise TinkerApiError(400, "is required", field="adam_params")
    for name in ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm"):
        value = params.get(name, 0.0)
        if not isinstance(value, int | float) or value != value or value < 0:
            raise TinkerApiError(400, "must be a number, 0 or more", field=f"adam_params.{name}")
    for name in ("beta1", "beta2"):
        if params.get(name, 0.9) >= 1:
            raise TinkerApiError(400, "must be below 1", field=f"adam_params.{name}")


optim_step = _model_request(TinkerRequest.Kind.OPTIM_STEP)
save_weights = _model_request(TinkerRequest.Kind.SAVE_WEIGHTS)
save_weights_for_sampler = _model_request(TinkerRequest.Kind.SAVE_WEIGHTS_FOR_SAMPLER)


@tinker_api("POST")
def load_weights(request: HttpRequest, user) -> HttpResponse:
    """Into an existing model (model_id), or a new model made from the weights (session_id and
    model_seq_id: `create_training_client_from_state`)."""
    body = _body(request)
    if body.get("model_id"):
        return _submit(user, TinkerRequest.Kind.LOAD_WEIGHTS, body, _idempotency(request))
    session = _editable_session(user, body.get("session_id"))
    source = services.weights_for(user=user, path=str(body.get("path")), kind="weights", field="path")
    queued = services.model_create(
        session=session,
        by=user,
        body=body,
        idempotency_key=_idempotency(request),
        load={"weights": source, "optimizer": bool(body.get("optimizer"))},
    )
    return _future(queued)


def _readable_model(user, model_id: str) -> TinkerModel:
    model = selectors.model_for(user=user, model_id=model_id)
    if model is None:
        raise TinkerApiError(404, f"no model {model_id!r} in a project of yours")
    return model


def _training_run(model: TinkerModel) -> dict:
    """The SDK's TrainingRun: what a resume reads to find a checkpoint's base model and LoRA."""
    saved = list(selectors.weights_of(model=model))
    last = {
        kind: next((w for w in reversed(saved) if w.kind == kind), None)
        for kind in ("weights", "sampler_weights")
    }
    last_request = model.requests.order_by("-pk").values_list("created_at", flat=True).first()
    return {
        "training_run_id": model.model_id,
        "base_model": model.base_model,
        "model_owner": model.session.created_by.get_username(),
        "is_lora": model.lora is not None,
        "lora_rank": model.lora["rank"] if model.lora else None,
        "last_request_time": (last_request or model.created_at).isoformat(),
        "last_checkpoint": _checkpoint(last["weights"]) if last["weights"] else None,
        "last_sampler_checkpoint": _checkpoint(last["sampler_weights"]) if last["sampler_weights"] else None,
        "user_metadata": None,
    }


@tinker_api("GET")
def training_run(request: HttpRequest, user, model_id: str) -> HttpResponse:
    return JsonResponse(_training_run(_readable_model(user, model_id)))


def _page(request: HttpRequest, default_limit: int) -> tuple[int, int, bool]:
    """`limit` (1 to 1000), `offset`, and whether `access_scope` asks for everything the caller can
    read ("accessible") rather than what they made ("owned", the SDK's default)."""
    try:
        limit = int(request.GET.get("limit", default_limit))
        offset = int(request.GET.get("offset", 0))
    except ValueError:
        raise TinkerApiError(400, "limit and offset must be integers", field="limit") from None
    if not 1 <= limit <= 1000 or offset < 0:
        raise TinkerApiError(400, "limit must be from 1 to 1000 and offset 0 or more", field="limit")
    scope = request.GET.get("access_scope", "owned")
    if scope not in ("owned", "accessible"):
        raise TinkerApiError(400, "access_scope must be owned or accessible", field="access_scope")
    return limit, offset, scope == "owned"


def _cursor(offset: int, limit: int, total: int) -> dict:
    return {"offset": offset, "limit": limit, "total_count": total}


def _paged(key: str, found: QuerySet, render: Callable[[Any], dict], offset: int, limit: int) -> JsonResponse:
    """One page of `found` under `key`, with the SDK's cursor (offset, limit, total)."""
    return JsonResponse(
        {
            key: [render(row) for row in found[offset : offset + limit]],
            "cursor": _cursor(offset, limit, found.count()),
        }
    )


@tinker_api("GET")
def training_runs(request: HttpRequest, user) -> HttpResponse:
    """The caller's training runs (their models), newest first; `project_id` narrows them."""
    limit, offset, owned = _page(request, 20)
    models = selectors.models_for(user=user, owned=owned, project_id=request.GET.get("project_id"))
    return _paged("training_runs", models, _training_run, offset, limit)


@tinker_api("GET")
def sessions(request: HttpRequest, user) -> HttpResponse:
    limit, offset, owned = _page(request, 20)
    found = selectors.sessions_for(user=user)
    if owned:
        found = found.filter(created_by_id=user.pk)
    keys = found.order_by("-created_at", "-pk").values_list("key", flat=True)[offset : offset + limit]
    return JsonResponse({"sessions": list(keys)})


@tinker_api("GET")
def user_checkpoints(request: HttpRequest, user) -> HttpResponse:
    """Every checkpoint of the caller's training runs, newest first."""
    limit, offset, _ = _page(request, 100)
    return _paged("checkpoints", selectors.weights_for(user=user), _checkpoint, offset, limit)


@tinker_api("POST")
def weights_info(request: HttpRequest, user) -> HttpResponse:
    """What loading saved weights needs to know: their base model and LoRA."""
    path = str(_body(request).get("tinker_path") or "")
    weights = selectors.weights_at(user=user, path=path)
    if weights is None:
        raise TinkerApiError(404, f"no saved weights at {path!r} in a project of yours", field="tinker_path")
    lora = weights.model.lora
    return JsonResponse(
        {
            "base_model": weights.model.base_model,
            "is_lora": lora is not None,
            "lora_rank": lora["rank"] if lora else None,
            "train_unembed": lora.get("train_unembed") if lora else None,
            "train_mlp": lora.get("train_mlp") if lora else None,
            "train_attn": lora.get("train_attn") if lora else None,
        }
    )


@tinker_api("GET")
def checkpoints(request: HttpRequest, user, model_id: str) -> HttpResponse:
    model = _readable_model(user, model_id)
    return JsonResponse(
        {"checkpoints": [_checkpoint(weights) for weights in selectors.weights_of(model=model)]}
    )


@tinker_api("DELETE")
def checkpoint_delete(request: HttpRequest, user, model_id: str, kind: str, name: str) -> HttpResponse:
    """Forget saved weights by name (the run keeps its checkpoints and policy versions: its history)."""
    model = _editable_model(user, model_id)
    services.weights_forget(model=model, kind=kind, name=name)
    return HttpResponse(status=204)


@tinker_api("POST", "DELETE")
def checkpoint_publish(request: HttpRequest, user, model_id: str, kind: str, name: str) -> HttpResponse:
    """Publish saved weights to every user of this server (POST), or take them back (DELETE)."""
    model = _editable_model(user, model_id)
    services.weights_publish(model=model, kind=kind, name=name, by=user, public=request.method == "POST")
    return JsonResponse(None, safe=False)


@tinker_api("PUT")
def checkpoint_ttl(request: HttpRequest, user, model_id: str, kind: str, name: str) -> HttpResponse:
    model = _editable_model(user, model_id)
    services.weights_ttl(model=model, kind=kind, name=name, ttl_seconds=_body(request).get("ttl_seconds"))
    return JsonResponse(None, safe=False)


def _checkpoint(weights) -> dict:
    return {
        "checkpoint_id": f"{weights.kind}/{weights.name}",
        "checkpoint_type": "training" if weights.kind == "weights" else "sampler",
        "time": weights.created_at.isoformat(),
        "tinker_path": weights.path,
        "public": weights.public,
        "expires_at": weights.expires_at.isoformat() if weights.expires_at else None,
    }


# --- sampling --------------------------------------------------------------------------------


@tinker_api("POST")
def create_sampling_session(request: HttpRequest, user) -> HttpResponse:
    body = _body(request)
    session = _editable_session(user, body.get("session_id"))
    sampler = services.sampler_create(session=session, user=user, body=body)
    return JsonResponse({"type": "create_sampling_session", "sampling_session_id": sampler.key})


@tinker_api("POST")
def asample(request: HttpRequest, user) -> HttpResponse:
    body = _body(request)
    sampler = _sampler(user, body)
    count = body.get("num_samples", 1)
    if not isinstance(count, int) or not 1 <= count <= 1024:
        raise TinkerApiError(400, "must be an integer from 1 to 1024", field="num_samples")
    chunks = (body.get("prompt") or {}).get("chunks") or []
    if not chunks or any(chunk.get("type", "encoded_text") != "encoded_text" for chunk in chunks):
        raise TinkerApiError(400, "send the prompt as token chunks (ModelInput.from_ints)", field="prompt")
    queued = services.sample_submit(
        sampler=sampler, body=json.dumps(body).encode(), idempotency_key=_idempotency(request)
    )
    return _future(queued, sample_sequence_ids=[f"{queued.key}:{index}" for index in range(count)])


@tinker_api("POST")
def cancel_future(request: HttpRequest, user) -> HttpResponse:
    """The SDK gave up on a sample: one not started yet is not decoded (a started one finishes)."""
    key = str(_body(request).get("request_id") or "")
    found = selectors.request_for(user=user, key=key)
    if found is None:
        raise TinkerApiError(404, f"no request {key!r} in a project of yours", field="request_id")
    project_selectors.require(user=user, project_id=found.session.project_id, permission=Permission.EDIT)
    services.request_cancel(request=found)
    return JsonResponse(None, safe=False)


@tinker_api("GET")
def sampler_detail(request: HttpRequest, user, sampler_id: str) -> HttpResponse:
    sampler = selectors.sampler_for(user=user, key=sampler_id)
    if sampler is None:
        raise TinkerApiError(404, f"no sampling session {sampler_id!r} in a project of yours")
    return JsonResponse(
        {
            "sampler_id": sampler.key,
            "base_model": sampler.base_model,
            "model_path": sampler.model_path or None,
        }
    )


def _sampler(user, body: dict):
    key = body.get("sampling_session_id")
    if key:
        sampler = selectors.sampler_for(user=user, key=str(key))
        if sampler is None:
            raise TinkerApiError(
                404, f"no sampling session {key!r} in a project of yours", field="sampling_session_id"
            )
        project_selectors.require(
            user=user, project_id=sampler.session.project_id, permission=Permission.EDIT
        )
        return sampler
    raise TinkerApiError(
        400, "create a sampling session first (the SDK's SamplingClient does)", field="sampling_session_id"
    )


# --- futures ---------------------------------------------------------------------------------


def _answer(request: TinkerRequest) -> HttpResponse | None:
    """The request's answer if it has one: its result, or its failure in the SDK's shape."""
    if request.status == TinkerRequest.Status.DONE:
        if request.result_proto:
            return HttpResponse(bytes(request.result or b""), content_type=wire.PROTO_CONTENT_TYPE)
        return HttpResponse(bytes(request.result or b""), content_type="application/json")
    if request.status == TinkerRequest.Status.FAILED:
        return JsonResponse({"error": request.error, "category": "user" if request.user_error else "server"})
    return None


def _queue_state(request: TinkerRequest) -> tuple[str, str | None]:
    """Why a request waits: its model's run is queued behind others, or paused."""
    if request.model is None:
        return "active", None
    status = Run.objects.filter(pk=request.model.run_id).values_list("status", flat=True).first()
    if status == Run.Status.QUEUED:
        return "paused_capacity", "the model's run waits for its project's run quota"
    if status in (Run.Status.PAUSING, Run.Status.PAUSED):
        return "paused_capacity", "the model's run is paused; resume it to go on"
    return "active", None


@csrf_exempt
async def retrieve_future(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _refusal(405, "POST is not allowed here; use POST")
    try:
        user = await sync_to_async(_caller)(request)
        key = str(_body(request).get("request_id") or "")
        found = await sync_to_async(selectors.request_for)(user=user, key=key)
        if found is None:
            return _refusal(404, f"request_id: no request {key!r} in a project of yours")
        deadline = time.monotonic() + settings.FLYWHEEL_TINKER_POLL_SECONDS
        interval = POLL_INTERVAL[0]
        while True:
            if (answer := _answer(found)) is not None:
                return answer
            if time.monotonic() >= deadline:
                state, reason = await sync_to_async(_queue_state)(found)
                return JsonResponse(
                    {
                        "type": "try_again",
                        "request_id": key,
                        "queue_state": state,
                        "queue_state_reason": reason,
                    }
                )
            # Woken when the request finishes (tinker_api.notify); the record is read again after
            # `interval` at the latest, whatever Redis says.
            await notify.finished_wait(key, min(interval, max(deadline - time.monotonic(), 0.0)))
            interval = min(interval * 2, POLL_INTERVAL[1])
            found = await sync_to_async(TinkerRequest.objects.select_related("model").get)(pk=found.pk)
    except TinkerApiError as exc:
        return _refusal(exc.status, str(exc))
    except OpenAIError as exc:
        return _refusal(exc.status, exc.message)
    except Exception:
        logger.exception("the Tinker API failed on %s", request.path)
        return _refusal(500, "internal error; it has been logged")

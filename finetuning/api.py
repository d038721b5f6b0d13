"""OpenAI's fine-tuning API at /v1/ (`files`, `fine_tuning/jobs`), as the official client calls it.

An adapter: each view authenticates as /v1/ does (a Flywheel API token as the bearer key, within
the caller's API rate), finds the project (the `OpenAI-Project` header, or the caller's only
project), calls a service or a selector, and answers in OpenAI's shapes, lists and error object.
"""

import logging
import re
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from core import strict_json
from core.tokens import token_digest
from finetuning import graders, permissions, selectors, serializers, services
from finetuning.errors import ApiError
from inference import openai_protocol as protocol
from inference.openai_protocol import OpenAIError
from serving.openai_auth import caller

logger = logging.getLogger(__name__)
INT64 = 2**63 - 1


def openai_api(*methods: str) -> Callable:
    """Answer every refusal in OpenAI's error shape, and other methods with 405."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                if request.method not in methods:
                    raise ApiError(
                        405,
                        f"{request.method} is not allowed here; use {' or '.join(methods)}",
                        None,
                        "method_not_allowed",
                    )
                return view(request, *args, **kwargs)
            except ApiError as exc:
                return JsonResponse(
                    protocol.error_body(exc.status, str(exc), exc.param, exc.code), status=exc.status
                )
            except OpenAIError as exc:
                return JsonResponse(exc.body(), status=exc.status, headers=exc.headers)
            except selectors.NoProjectError as exc:
                return JsonResponse(
                    protocol.error_body(400, str(exc), "OpenAI-Project", "project_required"), status=400
                )
            except PermissionDenied as exc:
                return JsonResponse(protocol.error_body(403, str(exc), None, "permission_denied"), status=403)
            except Http404:
                return JsonResponse(protocol.error_body(404, "no such object", None, "not_found"), status=404)
            except Exception:
                logger.exception("the OpenAI fine-tuning API failed on %s", request.path)
                return JsonResponse(
                    protocol.error_body(500, "internal error; it has been logged"), status=500
                )

        return csrf_exempt(wrapped)

    return decorate


def _project(request: HttpRequest, user):
    parts = request.headers.get("Authorization", "").split()
    digest = token_digest(parts[1]) if len(parts) == 2 and parts[0].lower() == "bearer" else None
    return selectors.project_of(user=user, header=request.headers.get("OpenAI-Project"), token_digest=digest)


def _limit(request: HttpRequest, default: int, most: int) -> int:
    raw = request.GET.get("limit")
    if raw is None:
        return default
    if not re.fullmatch(r"[0-9]{1,19}", raw) or not 1 <= int(raw) <= min(most, INT64):
        raise ApiError(400, f"limit must be an integer from 1 to {most}", "limit", "invalid_value")
    return int(raw)


def _page(
    objects: list, request: HttpRequest, *, ident: Callable[[Any], str], default: int, most: int
) -> tuple[list, bool]:
    """The objects after `after` (an id), at most `limit` of them, and whether more follow."""
    limit = _limit(request, default, most)
    after = request.GET.get("after")
    if after:
        ids = [ident(o) for o in objects]
        if after not in ids:
            raise ApiError(400, f"after: no object {after!r} in this list", "after", "invalid_value")
        objects = objects[ids.index(after) + 1 :]
    return objects[:limit], len(objects) > limit


def _list(data: list[dict], has_more: bool) -> JsonResponse:
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return JsonResponse(
        {"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": has_more}
    )


def _json_body(request: HttpRequest) -> Any:
    try:
        return strict_json.loads(request.body or b"{}")
    except (strict_json.JsonInputError, ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}", None, "invalid_json") from None


# --- files -------------------------------------------------------------------------------------


@openai_api("GET", "POST")
def files(request: HttpRequest) -> HttpResponse:
    user = caller(request)
    project = _project(request, user)
    if request.method == "POST":
        stored = services.file_upload(
            project=project, by=user, upload=request.FILES.get("file"), purpose=request.POST.get("purpose")
        )
        return JsonResponse(serializers.file_object(stored))
    order = request.GET.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError(400, "order must be asc or desc", "order", "invalid_value")
    listed = list(selectors.files_of(project=project, purpose=request.GET.get("purpose")))
    if order == "asc":
        listed.reverse()
    page, more = _page(listed, request, ident=lambda f: f.id, default=10000, most=10000)
    return _list([serializers.file_object(f) for f in page], more)


def _file(request: HttpRequest, file_id: str):
    user = caller(request)
    found = selectors.file_for(user=user, file_id=file_id)
    if found is None:
        raise ApiError(404, f"No such File object: {file_id}", "id", "file_not_found")
    return user, found


@openai_api("GET", "DELETE")
def file_detail(request: HttpRequest, file_id: str) -> HttpResponse:
    user, found = _file(request, file_id)
    if request.method == "DELETE":
        services.file_delete(file=found, by=user)
        return JsonResponse({"id": file_id, "object": "file", "deleted": True})
    return JsonResponse(serializers.file_object(found))


@openai_api("GET")
def file_content(request: HttpRequest, file_id: str) -> HttpResponse:
    _, found = _file(request, file_id)
    kind = "text/csv" if found.purpose == found.Purpose.RESULTS else "application/jsonl"
    return HttpResponse(services.file_bytes(found), content_type=kind)


# --- jobs --------------------------------------------------------------------------------------


@openai_api("GET", "POST")
def jobs(request: HttpRequest) -> HttpResponse:
    user = caller(request)
    project = _project(request, user)
    if request.method == "POST":
        job = services.job_create(project=project, by=user, body=_json_body(request))
        return JsonResponse(serializers.job_object(job))
    metadata = {
        key[9:-1]: value
        for key, value in request.GET.items()
        if key.startswith("metadata[") and key.endswith("]")
    }
    listed = list(selectors.jobs_of(project=project, metadata={k: str(v) for k, v in metadata.items()}))
    page, more = _page(listed, request, ident=lambda j: j.id, default=20, most=10000)
    return _list([serializers.job_object(services.job_results_ensure(job=j)) for j in page], more)


def _job(request: HttpRequest, job_id: str):
    user = caller(request)
    job = selectors.job_for(user=user, job_id=job_id)
    if job is None:
        raise ApiError(404, f"Could not find fine-tune: {job_id}", "fine_tune_id", "fine_tune_not_found")
    return user, job


@openai_api("GET")
def job_detail(request: HttpRequest, job_id: str) -> HttpResponse:
    _, job = _job(request, job_id)
    return JsonResponse(serializers.job_object(services.job_results_ensure(job=job)))


def _action(change: Callable) -> Callable:
    @openai_api("POST")
    def view(request: HttpRequest, job_id: str) -> HttpResponse:
        user, job = _job(request, job_id)
        return JsonResponse(serializers.job_object(change(job=job, by=user)))

    return view


job_cancel = _action(services.job_cancel)
job_pause = _action(services.job_pause)
job_resume = _action(services.job_resume)


@openai_api("GET")
def job_events(request: HttpRequest, job_id: str) -> HttpResponse:
    _, job = _job(request, job_id)
    page, more = _page(selectors.job_events(job=job), request, ident=lambda e: e.id, default=20, most=10000)
    return _list([serializers.event_object(e) for e in page], more)


@openai_api("GET")
def job_checkpoints(request: HttpRequest, job_id: str) -> HttpResponse:
    _, job = _job(request, job_id)
    checkpoints = selectors.job_checkpoints(job=job)
    page, more = _page(checkpoints, request, ident=lambda c: f"ftckpt-{c.pk}", default=10, most=10000)
    metrics = selectors.job_step_metrics(job=job)
    return _list([serializers.checkpoint_object(job, c, metrics.get(c.step, {})) for c in page], more)


# --- checkpoint permissions ------------------------------------------------------------------


@openai_api("GET", "POST")
def checkpoint_permissions(request: HttpRequest, checkpoint: str) -> HttpResponse:
    user = caller(request)
    permissions.checkpoint_named(user=user, name=checkpoint)  # who may share it, before what is asked
    if request.method == "POST":
        body = _json_body(request)
        project_ids = body.get("project_ids") if isinstance(body, dict) else None
        made = permissions.permissions_create(user=user, name=checkpoint, project_ids=project_ids)
        return _list([serializers.permission_object(p) for p in made], False)
    order = request.GET.get("order", "descending")
    if order not in ("ascending", "descending"):
        raise ApiError(400, "order: ascending or descending", "order", "invalid_value")
    found = permissions.permissions_of(
        user=user, name=checkpoint, project_id=request.GET.get("project_id"), descending=order == "descending"
    )
    page, more = _page(found, request, ident=lambda p: p.id, default=10, most=100)
    return _list([serializers.permission_object(p) for p in page], more)


@openai_api("DELETE")
def checkpoint_permission(request: HttpRequest, checkpoint: str, permission_id: str) -> HttpResponse:
    gone = permissions.permission_delete(user=caller(request), name=checkpoint, permission_id=permission_id)
    return JsonResponse({"id": gone, "object": "checkpoint.permission", "deleted": True})


# --- graders -----------------------------------------------------------------------------------


@openai_api("POST")
def grader_validate(request: HttpRequest) -> HttpResponse:
    user = caller(request)
    body = _json_body(request)
    grader = body.get("grader") if isinstance(body, dict) else None
    spec = graders.grader_checked(grader)
    if graders.judge_models(spec):  # a model grader's tier is the project's: only then is one needed
        graders.judges_check(spec, project=_project(request, user))
    return JsonResponse({"grader": grader})


@openai_api("POST")
def grader_run(request: HttpRequest) -> HttpResponse:
    user = caller(request)
    body = _json_body(request)
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", None, "invalid_value")
    answer = graders.grader_run(
        project=_project(request, user),
        by=user,
        grader=body.get("grader"),
        model_sample=body.get("model_sample"),
        item=body.get("item"),
    )
    return JsonResponse(answer)

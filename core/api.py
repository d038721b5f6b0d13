"""REST conventions shared by every resource (see shared API.md): bearer tokens, newest-first
cursor pagination capped by ?limit=, one error shape, and idempotency keys on creating POSTs."""

import hashlib
import json
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import IntegrityError, transaction
from django.http import Http404
from django.utils import timezone
from kombu.exceptions import OperationalError as KombuOperationalError
from redis.exceptions import RedisError
from rest_framework import exceptions, serializers
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import exception_handler

from core.exceptions import StateError, error_body
from core.leases import lease_kept, process_gone, process_identity
from core.models import IdempotencyKey

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def bounded_integers(serializer: serializers.Serializer) -> serializers.Serializer:
    """Give every integer field without bounds of its own the 64-bit ones, nested fields too.

    Ids, filters and counts end in 64-bit columns: a bigger number is the client's mistake (400
    naming the field), which the database would otherwise report as a 500.
    """
    pending = list(serializer.fields.values())
    while pending:
        field = pending.pop()
        if isinstance(field, serializers.IntegerField):
            if field.max_value is None:
                field.max_value = INT64_MAX
                message = field.error_messages["max_value"].format(max_value=INT64_MAX)
                field.validators.append(MaxValueValidator(INT64_MAX, message=message))
            if field.min_value is None:
                field.min_value = INT64_MIN
                message = field.error_messages["min_value"].format(min_value=INT64_MIN)
                field.validators.append(MinValueValidator(INT64_MIN, message=message))
        child = getattr(field, "child", None)
        if isinstance(child, serializers.Field):
            pending.append(child)
        if isinstance(field, serializers.Serializer):
            pending.extend(field.fields.values())
    return serializer


class NewestFirstCursorPagination(CursorPagination):
    ordering: tuple[str, ...] = ("-created_at", "-id")
    page_size_query_param = "limit"

    @property
    def max_page_size(self) -> int:  # type: ignore[override]  # read at request time: tests change it
        return settings.FLYWHEEL_API_MAX_LIMIT


# --- errors --------------------------------------------------------------------------------


def _flatten(detail: Any, prefix: str = "") -> list[dict[str, Any]]:
    """DRF's nested error detail as a flat list of {param, message}."""
    if isinstance(detail, dict):
        out = []
        for key, value in detail.items():
            if key in ("non_field_errors", "__all__"):
                name = prefix
            elif isinstance(key, int) and prefix:  # a list's items, as DRF keys them by index
                name = f"{prefix}[{key}]"
            else:
                name = f"{prefix}.{key}" if prefix else str(key)
            out += _flatten(value, name)
        return out
    if isinstance(detail, list):
        if all(not isinstance(v, (dict, list)) for v in detail):
            return [{"param": prefix or None, "message": str(v)} for v in detail]
        out = []
        for index, value in enumerate(detail):
            out += _flatten(value, f"{prefix}[{index}]" if prefix else str(index))
        return out
    return [{"param": prefix or None, "message": str(detail)}]


def validation_response(detail: Any, status_code: int = 400) -> Response:
    details = _flatten(detail)
    first = details[0] if details else {"param": None, "message": "invalid request"}
    where = f"{first['param']}: " if first["param"] else ""
    message = f"{where}{first['message']}"
    if len(details) > 1:
        message += f" (and {len(details) - 1} more)"
    return Response(error_body(status_code, message, first["param"], details), status=status_code)


def error_handler(exc: Exception, context: dict) -> Response | None:
    if isinstance(exc, (RedisError, KombuOperationalError)):  # Redis went away mid-request
        return Response(
            error_body(503, f"Redis is unreachable: {exc}", code="service_unavailable"), status=503
        )
    if isinstance(exc, DjangoValidationError):
        invalid = exc.message_dict if hasattr(exc, "error_dict") else {"": exc.messages}
        return validation_response(invalid)
    if isinstance(exc, StateError):
        return Response(error_body(409, str(exc)), status=409)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "not found")
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or "forbidden")
    response = exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        return validation_response(exc.detail, response.status_code)
    detail: Any = exc.detail if hasattr(exc, "detail") else str(exc)
    message = str(detail.get("detail", detail)) if isinstance(detail, dict) else str(detail)
    response.data = error_body(response.status_code, message)
    return response


# --- idempotency ---------------------------------------------------------------------------


def _fingerprint(request: Request) -> str:
    try:
        body = json.dumps(request.data, sort_keys=True, default=str)
    except Exception:  # noqa: BLE001 - an unreadable body still gets a stable fingerprint
        body = repr(request.data)
    files = sorted((name, f.name, _content_digest(f)) for name, f in getattr(request, "FILES", {}).items())
    raw = f"{request.method} {request.path}\n{body}\n{files}"
    return hashlib.sha256(raw.encode()).hexdigest()


def _content_digest(upload) -> str:
    # By content, not size: another file of the same name and size is another request (422).
    digest = hashlib.sha256()
    for chunk in upload.chunks():  # streamed; chunks() rewinds, so the view reads it from the start
        digest.update(chunk)
    return digest.hexdigest()


# An in-flight marker's lease: renewed every third of it while its request runs, so a request
# that died with its server (kill -9, a lost host) releases its key within this, not in 24 hours.
IN_FLIGHT_LEASE_SECONDS = 30


def idempotent(handler=None, *, secret_fields: tuple[str, ...] = ()):
    """Wrap a creating POST: the same Idempotency-Key replays the first response; the same key
    with another body answers 422; while the first request is still running, 409. A first
    request whose process died (its host sees the pid gone, or its lease lapsed) does not count
    as running: the key is taken over and the request runs again.

    `secret_fields` (a token shown once) are never stored with the response: a replay shows null.
    """
    if handler is None:
        return lambda handler: idempotent(handler, secret_fields=secret_fields)

    def wrapper(view, request: Request, *args, **kwargs):
        key = request.headers.get("Idempotency-Key")
        if not key:
            return handler(view, request, *args, **kwargs)
        if len(key) > 255:
            return Response(
                error_body(400, "Idempotency-Key must be at most 255 characters", "Idempotency-Key"),
                status=400,
            )
        fingerprint = _fingerprint(request)
        claimed = _claim_key(request.user, key, fingerprint)
        if isinstance(claimed, Response):
            return claimed
        every = IN_FLIGHT_LEASE_SECONDS / 3
        try:
            with lease_kept(lambda: _renew_key(claimed), every=every, name=f"idempotency-{claimed.pk}"):
                response = handler(view, request, *args, **kwargs)
        except Exception:
            claimed.delete()  # nothing was created; let the client retry with the same key
            raise
        if response.status_code >= 500:
            claimed.delete()
            return response
        body = json.loads(json.dumps(response.data, default=str))
        if isinstance(body, dict):
            body.update({name: None for name in secret_fields if name in body})
        IdempotencyKey.objects.filter(pk=claimed.pk).update(
            response_status=response.status_code, response_body=body, lease_until=None
        )
        return response

    wrapper.__name__ = handler.__name__
    wrapper.__doc__ = handler.__doc__
    return wrapper


def _lease_end():
    return timezone.now() + timedelta(seconds=IN_FLIGHT_LEASE_SECONDS)


def _renew_key(claimed: IdempotencyKey) -> bool:
    in_flight = IdempotencyKey.objects.filter(pk=claimed.pk, response_status=None, owner=claimed.owner)
    return bool(in_flight.update(lease_until=_lease_end()))


def _abandoned(marker: IdempotencyKey) -> bool:
    """The request holding this in-flight marker died: its process is gone, or it stopped renewing."""
    if process_gone(marker.owner):
        return True
    lapsed_at = marker.lease_until or marker.created_at + timedelta(seconds=IN_FLIGHT_LEASE_SECONDS)
    return lapsed_at < timezone.now()


def _take_over(marker: IdempotencyKey) -> IdempotencyKey | None:
    """Claim a dead request's marker for this request; None if another request took it first."""
    me = process_identity()
    taken = IdempotencyKey.objects.filter(
        pk=marker.pk, response_status=None, owner=marker.owner, lease_until=marker.lease_until
    ).update(owner=me, lease_until=_lease_end())
    if not taken:
        return None
    marker.owner = me
    return marker


def _claim_key(user, key: str, fingerprint: str) -> IdempotencyKey | Response:
    expired_before = timezone.now() - timedelta(hours=settings.FLYWHEEL_IDEMPOTENCY_TTL_HOURS)
    IdempotencyKey.objects.filter(user=user, key=key, created_at__lt=expired_before).delete()
    try:
        with transaction.atomic():
            return IdempotencyKey.objects.create(
                user=user,
                key=key,
                request_fingerprint=fingerprint,
                owner=process_identity(),
                lease_until=_lease_end(),
            )
    except IntegrityError:
        pass
    existing = IdempotencyKey.objects.filter(user=user, key=key).first()
    if existing is None:  # finished and expired between our two statements: rare; ask to retry
        return Response(
            error_body(409, "the request with this Idempotency-Key just expired; retry"), status=409
        )
    if existing.request_fingerprint != fingerprint:
        return Response(
            error_body(
                422,
                "this Idempotency-Key was used with a different request",
                "Idempotency-Key",
                code="idempotency_key_reused",
            ),
            status=422,
        )
    if existing.in_flight and _abandoned(existing) and (taken := _take_over(existing)) is not None:
        return taken
    if existing.in_flight:
        return Response(
            error_body(
                409,
                "a request with this Idempotency-Key is still in progress",
                "Idempotency-Key",
                code="idempotency_in_flight",
            ),
            status=409,
        )
    response = Response(existing.response_body, status=existing.response_status)
    response["Idempotent-Replayed"] = "true"
    return response

"""OTLP/HTTP trace ingestion at /otlp/v1/traces: point an OpenTelemetry exporter at Flywheel.

Spans that follow the OpenTelemetry GenAI semantic conventions become Flywheel traces, one per
OTLP trace id: the chat span's `gen_ai.input.messages` / `gen_ai.output.messages` (or the older
`gen_ai.prompt` / `gen_ai.completion` attributes and `gen_ai.*.message` / `gen_ai.choice` events)
give the conversation in OpenAI's message shape, tool calls included, and `execute_tool` spans add
the tool results a chat span did not carry. This is OTLP's own contract (like the OpenAI routes at
/v1/), so it stays out of the REST schema and answers as OTLP does: an ExportTraceServiceResponse
(protobuf or JSON, as the request came), and a 400 with a google.rpc.Status naming what is wrong.
A request is checked whole before anything is written.
"""

import base64
import json
import zlib
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from rest_framework import exceptions
from rest_framework.request import Request

from core.roles import Permission
from projects import selectors as project_selectors
from projects.token_auth import ApiTokenAuthentication
from traces import ingest
from traces.serializers import TraceBatchInputSerializer

PROTOBUF = "application/x-protobuf"
PROJECT_ATTRIBUTE = "flywheel.project"
PROJECT_HEADER = "X-Flywheel-Project"
CHAT_OPERATIONS = {"chat", "text_completion", "generate_content", "invoke_agent"}


class OtlpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _answer(message: Any, status: int, as_json: bool) -> HttpResponse:
    if as_json:
        return HttpResponse(
            json_format.MessageToJson(message), status=status, content_type="application/json"
        )
    return HttpResponse(message.SerializeToString(), status=status, content_type=PROTOBUF)


def _hex_ids(value: Any) -> Any:
    """OTLP/JSON writes trace and span ids as hex; protobuf's JSON reader expects base64."""
    if isinstance(value, dict):
        return {
            key: base64.b64encode(bytes.fromhex(item)).decode()
            if key in ("traceId", "spanId", "parentSpanId") and isinstance(item, str)
            else _hex_ids(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_hex_ids(item) for item in value]
    return value


def _gunzip(body: bytes) -> bytes:
    """The body inflated, refused past the server's body limit (a small gzip can inflate hugely)."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    inflater = zlib.decompressobj(wbits=31)  # gzip framing
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise OtlpError(400, f"body: Content-Encoding is gzip but the body is not gzip ({exc})") from exc
    if len(out) > limit:
        raise OtlpError(413, f"body: inflates past {limit} bytes; export smaller batches")
    return out


def parse_request(
    body: bytes, content_type: str, encoding: str
) -> trace_service_pb2.ExportTraceServiceRequest:
    if encoding == "gzip":
        body = _gunzip(body)
    elif encoding not in ("", "identity"):
        raise OtlpError(415, f"Content-Encoding {encoding!r} is not supported: send gzip or none")
    request = trace_service_pb2.ExportTraceServiceRequest()
    if content_type == PROTOBUF:
        try:
            request.ParseFromString(body)
        except DecodeError as exc:
            raise OtlpError(400, f"body: not an ExportTraceServiceRequest in protobuf ({exc})") from exc
    elif content_type == "application/json":
        try:
            json_format.Parse(json.dumps(_hex_ids(json.loads(body))), request, ignore_unknown_fields=True)
        except (ValueError, json_format.ParseError) as exc:
            raise OtlpError(400, f"body: not an ExportTraceServiceRequest in OTLP/JSON ({exc})") from exc
    else:
        raise OtlpError(415, f"Content-Type {content_type!r}: send {PROTOBUF} or application/json")
    return request


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in any_value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in any_value.kvlist_value.values}
    return None if kind is None else getattr(any_value, kind)


def attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


def _json(value: Any, where: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as exc:
        raise OtlpError(400, f"{where}: not JSON ({exc})") from exc


def openai_message(message: dict[str, Any], where: str) -> dict[str, Any]:
    """A GenAI semantic-conventions message (role and typed parts) as an OpenAI chat message."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise OtlpError(400, f"{where}: a message needs a role")
    if "parts" not in message:  # already OpenAI-shaped (older instrumentations)
        return {
            key: message[key]
            for key in ("role", "content", "tool_calls", "tool_call_id", "name")
            if key in message
        }
    text, calls, result = [], [], None
    for part in message["parts"] or []:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            text.append(str(part.get("content", "")))
        elif kind == "tool_call":
            arguments = part.get("arguments")
            calls.append(
                {
                    "id": str(part.get("id", "")),
                    "type": "function",
                    "function": {
                        "name": str(part.get("name", "")),
                        "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                    },
                }
            )
        elif kind == "tool_call_response":
            response = part.get("response")
            result = (
                str(part.get("id", "")),
                response if isinstance(response, str) else json.dumps(response),
            )
    if result is not None:
        return {"role": "tool", "tool_call_id": result[0], "content": result[1]}
    out: dict[str, Any] = {"role": message["role"], "content": "".join(text) if text or not calls else None}
    if calls:
        out["tool_calls"] = calls
    if message.get("name"):
        out["name"] = str(message["name"])
    return out


def _event_messages(span: Any) -> tuple[list[dict], list[dict]]:
    """The older convention: one `gen_ai.<role>.message` event per input, `gen_ai.choice` per output."""
    inputs, outputs = [], []
    for event in span.events:
        attrs = attributes(event.attributes)
        if event.name == "gen_ai.choice":
            message = _json(attrs.get("message", attrs.get("gen_ai.event.content", "{}")), "gen_ai.choice")
            outputs.append({"role": "assistant"} | (message if isinstance(message, dict) else {}))
        elif event.name.startswith("gen_ai.") and event.name.endswith(".message"):
            role = event.name.removeprefix("gen_ai.").removesuffix(".message")
            body = {
                key: _json(value, event.name) if key == "tool_calls" else value
                for key, value in attrs.items()
            }
            inputs.append({"role": body.get("role", role)} | {k: v for k, v in body.items() if k != "role"})
    return inputs, outputs


def span_messages(span: Any, attrs: dict[str, Any]) -> tuple[list[dict], list[dict]]:
    where = f"span {span.name!r}"
    if "gen_ai.input.messages" in attrs or "gen_ai.output.messages" in attrs:
        inputs = _json(attrs.get("gen_ai.input.messages", "[]"), f"{where} gen_ai.input.messages")
        outputs = _json(attrs.get("gen_ai.output.messages", "[]"), f"{where} gen_ai.output.messages")
    elif "gen_ai.prompt" in attrs or "gen_ai.completion" in attrs:
        prompt, completion = attrs.get("gen_ai.prompt"), attrs.get("gen_ai.completion")
        inputs = [{"role": "user", "content": str(prompt)}] if prompt is not None else []
        outputs = [{"role": "assistant", "content": str(completion)}] if completion is not None else []
    else:
        inputs, outputs = _event_messages(span)
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise OtlpError(400, f"{where}: gen_ai messages must be JSON arrays")
    return (
        [openai_message(m, f"{where} input message {i}") for i, m in enumerate(inputs)],
        [openai_message(m, f"{where} output message {i}") for i, m in enumerate(outputs)],
    )


def _conversation(chats: list[tuple[Any, dict]], tools: list[tuple[Any, dict]]) -> list[dict]:
    """The conversation: each chat span's input carries the history so far, so the longest wins, and
    outputs not yet in it follow; then tool results that only an execute_tool span carried."""
    messages: list[dict] = []
    for span, attrs in chats:
        inputs, outputs = span_messages(span, attrs)
        if len(inputs) >= len(messages):
            messages = inputs
        messages = messages + outputs
    answered = {m.get("tool_call_id") for m in messages if m.get("role") == "tool"}
    for _span, attrs in tools:
        call_id = str(attrs.get("gen_ai.tool.call.id", ""))
        if not call_id or call_id in answered or "gen_ai.tool.call.result" not in attrs:
            continue
        result = attrs["gen_ai.tool.call.result"]
        tool = {"role": "tool", "tool_call_id": call_id, "name": str(attrs.get("gen_ai.tool.name", ""))}
        tool["content"] = result if isinstance(result, str) else json.dumps(result)
        at = next(
            (
                i + 1
                for i, m in enumerate(messages)
                if call_id in {c.get("id") for c in m.get("tool_calls") or []}
            ),
            len(messages),
        )
        messages.insert(at, tool)
    return messages


def reports(request: trace_service_pb2.ExportTraceServiceRequest) -> tuple[list[dict], int, Any]:
    """(one trace report per OTLP trace id holding GenAI spans, spans skipped, the project named)."""
    grouped: dict[str, list[tuple[Any, dict, dict]]] = {}
    skipped, project = 0, None
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        project = resource.get(PROJECT_ATTRIBUTE, project)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                attrs = attributes(span.attributes)
                if not any(key.startswith("gen_ai.") for key in attrs) and not any(
                    e.name.startswith("gen_ai.") for e in span.events
                ):
                    skipped += 1
                    continue
                grouped.setdefault(span.trace_id.hex(), []).append((span, attrs, resource))
    out = []
    for trace_id, spans in grouped.items():
        spans.sort(key=lambda item: item[0].start_time_unix_nano)
        tools = [(s, a) for s, a, _ in spans if a.get("gen_ai.operation.name") == "execute_tool"]
        chats = [(s, a) for s, a, _ in spans if a.get("gen_ai.operation.name") != "execute_tool"]
        messages = _conversation(chats, tools)
        if not messages:  # tool spans alone (an exporter that sends spans as they end): nothing to store
            skipped += len(spans)
            continue
        start = min(s.start_time_unix_nano for s, _, _ in spans)
        end = max(s.end_time_unix_nano for s, _, _ in spans)
        model = next(
            (a.get("gen_ai.request.model") for s, a in reversed(chats) if a.get("gen_ai.request.model")), ""
        )
        report: dict[str, Any] = {
            "id": trace_id,
            "messages": messages,
            "metadata": {
                "otel": {
                    "service.name": spans[0][2].get("service.name", ""),
                    "spans": len(spans),
                    "tools": [a.get("gen_ai.tool.name", "") for _, a in tools],
                }
            },
        }
        if model:
            report["model"] = str(model)
        if start:
            report["timestamp"] = datetime.fromtimestamp(start / 1e9, tz=UTC).isoformat()
            report["latency_ms"] = max(0.0, (end - start) / 1e6)
        out.append(report)
    return out, skipped, project


def _project_id(request: HttpRequest, token: Any, named: Any) -> int:
    value = request.headers.get(PROJECT_HEADER) or named
    if value is None:
        if getattr(token, "default_project_id", None) is None:
            raise OtlpError(
                400,
                f"project: name one with the {PROJECT_ATTRIBUTE} resource attribute or the "
                f"{PROJECT_HEADER} header, or give the token a default project",
            )
        return token.default_project_id
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise OtlpError(400, f"project: {value!r} is not a project id") from exc


@csrf_exempt
def otlp_traces(request: HttpRequest) -> HttpResponse:
    as_json = request.content_type == "application/json"
    try:
        return _export(request, as_json)
    except OtlpError as exc:
        return _answer(status_pb2.Status(code=3, message=exc.message), exc.status, as_json)


def _export(request: HttpRequest, as_json: bool) -> HttpResponse:
    if request.method != "POST":
        raise OtlpError(405, "POST an ExportTraceServiceRequest")
    try:
        found = ApiTokenAuthentication().authenticate(Request(request))
    except exceptions.AuthenticationFailed as exc:
        raise OtlpError(401, f"Authorization: {exc.detail}") from exc
    except exceptions.Throttled as exc:
        raise OtlpError(429, str(exc.detail)) from exc
    if found is None:
        raise OtlpError(401, "Authorization: send a Flywheel API token as 'Bearer <token>'")
    user, digest = found  # the authentication answers the token's digest
    token = project_selectors.token_for(digest=digest)
    try:
        body = request.body
    except RequestDataTooBig as exc:  # Django's DATA_UPLOAD_MAX_MEMORY_SIZE (FLYWHEEL_MAX_BODY_MB)
        raise OtlpError(413, f"body: larger than this server takes ({exc}); export smaller batches") from exc
    export = parse_request(body, request.content_type or "", request.headers.get("Content-Encoding", ""))
    traces, skipped, named = reports(export)
    project_id = _project_id(request, token, named)
    try:
        project = project_selectors.project_for(user=user, project_id=project_id, permission=Permission.EDIT)
    except (Http404, exceptions.NotFound) as exc:
        raise OtlpError(404, f"project: no project {project_id} you can see") from exc
    except (DjangoPermissionDenied, exceptions.PermissionDenied) as exc:
        raise OtlpError(403, f"project: you may not report traces to project {project_id}") from exc
    response = trace_service_pb2.ExportTraceServiceResponse()
    if traces:
        batch = TraceBatchInputSerializer(data={"project": project.pk, "traces": traces})
        if not batch.is_valid():
            raise OtlpError(400, f"spans do not make valid traces: {json.dumps(batch.errors)}")
        ingest.traces_ingest(project=project, reports=batch.validated_data["traces"])
    if skipped:
        response.partial_success.rejected_spans = skipped
        response.partial_success.error_message = f"{skipped} spans carried no GenAI conversation: skipped"
    return _answer(response, 200, as_json)

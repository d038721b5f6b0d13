"""OTLP/HTTP trace ingestion: the pinned OpenTelemetry SDK's exporter sends GenAI spans to a live
server and the trace arrives whole, tool calls included; OTLP/JSON and gzip too; role checks and
OTLP's 400 for bad input, with nothing written."""

import gzip
import json

import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from rest_framework.test import APIClient

from projects import services as project_services
from traces.models import Trace

CALL = {"type": "tool_call", "id": "call_1", "name": "get_weather", "arguments": {"city": "Oslo"}}
FIRST_INPUT = [
    {"role": "system", "parts": [{"type": "text", "content": "You help with weather."}]},
    {"role": "user", "parts": [{"type": "text", "content": "Weather in Oslo?"}]},
]
FIRST_OUTPUT = [{"role": "assistant", "parts": [CALL], "finish_reason": "tool_call"}]
SECOND_INPUT = [
    *FIRST_INPUT,
    *FIRST_OUTPUT,
    {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1", "response": "-3C, snow"}]},
]
SECOND_OUTPUT = [{"role": "assistant", "parts": [{"type": "text", "content": "-3C and snowing."}]}]
EXPECTED = [
    {"role": "system", "content": "You help with weather."},
    {"role": "user", "content": "Weather in Oslo?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "-3C, snow"},
    {"role": "assistant", "content": "-3C and snowing."},
]


def _token(user, project=None) -> str:
    token, raw = project_services.api_token_create(user=user, name="otel")
    if project is not None:
        token.default_project = project
        token.save(update_fields=["default_project"])
    return raw


def _export_agent_run(url: str, raw: str, project=None) -> None:
    resource = {"service.name": "weather-agent"} | ({"flywheel.project": project.pk} if project else {})
    provider = TracerProvider(resource=Resource.create(resource))
    exporter = OTLPSpanExporter(endpoint=f"{url}/otlp/v1/traces", headers={"Authorization": f"Bearer {raw}"})
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("agent")
    with tracer.start_as_current_span("invoke_agent weather"):
        with tracer.start_as_current_span("chat gpt-test") as span:
            span.set_attributes(
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": "gpt-test",
                    "gen_ai.input.messages": json.dumps(FIRST_INPUT),
                    "gen_ai.output.messages": json.dumps(FIRST_OUTPUT),
                }
            )
        with tracer.start_as_current_span("execute_tool get_weather") as span:
            span.set_attributes(
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "get_weather",
                    "gen_ai.tool.call.id": "call_1",
                    "gen_ai.tool.call.result": "-3C, snow",
                }
            )
        with tracer.start_as_current_span("chat gpt-test") as span:
            span.set_attributes(
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": "gpt-test",
                    "gen_ai.input.messages": json.dumps(SECOND_INPUT),
                    "gen_ai.output.messages": json.dumps(SECOND_OUTPUT),
                }
            )
    assert provider.force_flush()
    provider.shutdown()


@pytest.mark.django_db(transaction=True)
def test_the_sdk_exporter_sends_an_agent_run_that_arrives_whole(live_server, team):
    _export_agent_run(live_server.url, _token(team["launcher"], team["project"]))
    trace = Trace.objects.get()
    assert (trace.project, trace.model) == (team["project"], "gpt-test")
    assert trace.messages == EXPECTED
    assert trace.completion == "-3C and snowing."
    assert trace.metadata["otel"] == {"service.name": "weather-agent", "spans": 3, "tools": ["get_weather"]}
    assert len(trace.external_id) == 32


@pytest.mark.django_db(transaction=True)
def test_a_token_without_access_to_the_project_writes_nothing(live_server, team):
    _export_agent_run(live_server.url, _token(team["outsider"]), project=team["project"])
    _export_agent_run(live_server.url, _token(team["viewer"]), project=team["project"])
    assert not Trace.objects.exists()


def _json_request(trace_id: str = "5b8efff798038103d269b633813fc60c", spans=None) -> dict:
    chat = {
        "traceId": trace_id,
        "spanId": "eee19b7ec3c1b174",
        "name": "chat",
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000001500000000",
        "attributes": [
            {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
            {"key": "gen_ai.prompt", "value": {"stringValue": "2+2?"}},
            {"key": "gen_ai.completion", "value": {"stringValue": "4"}},
        ],
    }
    other = {"traceId": trace_id, "spanId": "eee19b7ec3c1b175", "name": "http", "attributes": []}
    return {
        "resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": spans or [chat, other]}]}]
    }


def _client(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.mark.django_db
def test_otlp_json_and_gzip_bodies_answer_as_otlp_does(team):
    client = _client(_token(team["launcher"]))
    body = json.dumps(_json_request()).encode()
    response = client.post(
        "/otlp/v1/traces",
        body,
        content_type="application/json",
        HTTP_X_FLYWHEEL_PROJECT=str(team["project"].pk),
    )
    assert response.status_code == 200, response.content
    assert response.json() == {
        "partialSuccess": {
            "rejectedSpans": "1",
            "errorMessage": "1 spans carried no GenAI conversation: skipped",
        }
    }
    trace = Trace.objects.get(external_id="5b8efff798038103d269b633813fc60c")
    assert (trace.prompt, trace.completion, trace.latency_ms) == ("2+2?", "4", 1500.0)
    gz = gzip.compress(json.dumps(_json_request("6b8efff798038103d269b633813fc60c")).encode())
    zipped = client.post(
        "/otlp/v1/traces",
        gz,
        content_type="application/json",
        HTTP_CONTENT_ENCODING="gzip",
        HTTP_X_FLYWHEEL_PROJECT=str(team["project"].pk),
    )
    assert zipped.status_code == 200 and Trace.objects.count() == 2


@pytest.mark.django_db
def test_bad_input_is_otlps_400_naming_what_is_wrong_and_writes_nothing(team):
    client = _client(_token(team["launcher"]))
    project = str(team["project"].pk)
    garbage = client.post(
        "/otlp/v1/traces", b"\xff\xff", content_type="application/x-protobuf", HTTP_X_FLYWHEEL_PROJECT=project
    )
    assert garbage.status_code == 400
    status = Status.FromString(garbage.content)
    assert status.message.startswith("body: not an ExportTraceServiceRequest in protobuf")
    not_gzip = client.post(
        "/otlp/v1/traces",
        json.dumps(_json_request()),
        content_type="application/json",
        HTTP_CONTENT_ENCODING="gzip",
        HTTP_X_FLYWHEEL_PROJECT=project,
    )
    assert not_gzip.status_code == 400
    assert not_gzip.json()["message"].startswith("body: Content-Encoding is gzip but the body is not gzip")
    good = _json_request()["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    bad = good | {
        "traceId": "7b8efff798038103d269b633813fc60c",
        "attributes": [{"key": "gen_ai.input.messages", "value": {"stringValue": "not json"}}],
    }
    response = client.post(
        "/otlp/v1/traces",
        json.dumps(_json_request(spans=[good, bad])),
        content_type="application/json",
        HTTP_X_FLYWHEEL_PROJECT=project,
    )
    assert response.status_code == 400
    assert response.json()["message"].startswith("span 'chat' gen_ai.input.messages: not JSON")
    no_project = client.post("/otlp/v1/traces", json.dumps(_json_request()), content_type="application/json")
    assert no_project.status_code == 400 and no_project.json()["message"].startswith("project: name one")
    anonymous = APIClient().post(
        "/otlp/v1/traces", json.dumps(_json_request()), content_type="application/json"
    )
    assert anonymous.status_code == 401
    outsider = _client(_token(team["outsider"])).post(
        "/otlp/v1/traces",
        json.dumps(_json_request()),
        content_type="application/json",
        HTTP_X_FLYWHEEL_PROJECT=project,
    )
    viewer = _client(_token(team["viewer"])).post(
        "/otlp/v1/traces",
        json.dumps(_json_request()),
        content_type="application/json",
        HTTP_X_FLYWHEEL_PROJECT=project,
    )
    assert (outsider.status_code, viewer.status_code) == (404, 403)
    assert not Trace.objects.exists()


def _attrs(**values) -> list[dict]:
    return [{"key": key.replace("__", "."), "value": {"stringValue": value}} for key, value in values.items()]


@pytest.mark.django_db
def test_older_events_and_execute_tool_spans_make_the_conversation(team):
    trace_id = "8b8efff798038103d269b633813fc60c"
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    chat = {
        "traceId": trace_id,
        "spanId": "0000000000000001",
        "name": "chat m",
        "startTimeUnixNano": "1",
        "attributes": _attrs(gen_ai__operation__name="chat", gen_ai__request__model="m"),
        "events": [
            {"name": "gen_ai.system.message", "attributes": _attrs(content="Be brief.")},
            {"name": "gen_ai.user.message", "attributes": _attrs(content="Look it up.")},
            {
                "name": "gen_ai.choice",
                "attributes": _attrs(message=json.dumps({"content": None, "tool_calls": [call]})),
            },
        ],
    }
    tool = {
        "traceId": trace_id,
        "spanId": "0000000000000002",
        "name": "execute_tool lookup",
        "startTimeUnixNano": "2",
        "attributes": _attrs(
            gen_ai__operation__name="execute_tool",
            gen_ai__tool__name="lookup",
            gen_ai__tool__call__id="c1",
            gen_ai__tool__call__result="found",
        ),
    }
    response = _client(_token(team["launcher"], team["project"])).post(
        "/otlp/v1/traces", json.dumps(_json_request(spans=[chat, tool])), content_type="application/json"
    )
    assert response.status_code == 200, response.content
    assert response.json() == {}
    trace = Trace.objects.get(external_id=trace_id)
    assert trace.model == "m"
    assert trace.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Look it up."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": "found"},
    ]

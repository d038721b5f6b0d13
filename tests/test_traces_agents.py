"""Traces as agents write them: OpenAI chat messages taken whole (tool calls with null or empty
content, tool results, names, multi-part content), shown escaped, searchable, promoted with the
conversation kept; promoted items land in the training split unless asked otherwise."""

import pytest

from projects.models import TaskSetVersion
from tests.conftest import api_client_for
from traces.models import Trace

pytestmark = pytest.mark.django_db

CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
}
AGENT = [
    {"role": "system", "content": "You help with weather."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Oslo?"}]},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "<b>-3C</b>, snow"},
    {"role": "assistant", "content": "", "tool_calls": [CALL | {"id": "call_2"}]},
    {"role": "tool", "tool_call_id": "call_2", "name": "get_weather", "content": "-3C"},
    {"role": "assistant", "name": "helper", "content": "It is -3C and snowing in Oslo."},
]


def ingest(client, project, traces):
    return client.post("/api/v1/traces", {"project": project.pk, "traces": traces}, format="json")


def test_tool_calls_and_tool_results_are_stored_as_they_came_and_searchable(team):
    client = api_client_for(team["launcher"])
    response = ingest(
        client, team["project"], [{"id": "a-1", "messages": AGENT, "feedback": {"thumbs": "up"}}]
    )
    assert response.status_code == 200, response.json()
    trace = Trace.objects.get(external_id="a-1")
    assert trace.messages == AGENT
    assert trace.completion == "It is -3C and snowing in Oslo."
    assert 'assistant: [call get_weather({"city": "Oslo"})]' in trace.prompt.splitlines()
    assert "tool get_weather: <b>-3C</b>, snow" in trace.prompt.splitlines()
    listed = client.get("/api/v1/traces", {"project": team["project"].pk, "q": "get_weather"}).json()
    assert [row["trace_id"] for row in listed["results"]] == ["a-1"]
    assert listed["results"][0]["messages"][2] == AGENT[2]


def test_null_content_without_tool_calls_is_refused_naming_the_message(team):
    client = api_client_for(team["launcher"])
    bad = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]
    response = ingest(client, team["project"], [{"id": "ok", "prompt": "x"}, {"id": "b", "messages": bad}])
    assert response.status_code == 400
    details = [(d["param"], d["message"]) for d in response.json()["error"]["details"]]
    assert details == [
        ("traces[1].messages[1].content", "may be null only in an assistant message with tool_calls")
    ]
    assert not Trace.objects.exists()


def test_the_trace_page_shows_tool_calls_escaped(client, team):
    ingest(api_client_for(team["launcher"]), team["project"], [{"id": "a-1", "messages": AGENT}])
    client.force_login(team["viewer"])
    page = client.get(f"/traces/{Trace.objects.get().pk}/").content.decode()
    assert "call call_1: get_weather({&quot;city&quot;: &quot;Oslo&quot;})" in page
    assert "answers call_1" in page
    assert "&lt;b&gt;-3C&lt;/b&gt;" in page and "<b>-3C</b>" not in page


def promote(client, project, **body):
    return client.post("/api/v1/traces/promote", {"project": project.pk} | body, format="json")


def test_promotion_keeps_the_conversation_and_lands_in_train_unless_asked(team):
    client = api_client_for(team["launcher"])
    ingest(client, team["project"], [{"id": "a-1", "messages": AGENT, "feedback": {"thumbs": "up"}}])
    trained = promote(client, team["project"], filters={"trace_id": "a-1"}, task_set_name="agents")
    assert trained.status_code == 201, trained.json()
    item = TaskSetVersion.objects.get(pk=trained.json()["task_set_version"]).items.get()
    assert item.split == "train"
    assert item.data["reference"] == "It is -3C and snowing in Oslo."
    assert item.data["metadata"]["messages"] == AGENT
    heldout = promote(
        client, team["project"], filters={"trace_id": "a-1"}, task_set_name="agents", split="heldout"
    )
    assert heldout.status_code == 201, heldout.json()
    assert TaskSetVersion.objects.get(pk=heldout.json()["task_set_version"]).items.get().split == "heldout"
    bad = promote(client, team["project"], filters={"trace_id": "a-1"}, split="test")
    assert bad.status_code == 400 and "split" in str(bad.json())

"""Production traces: batch ingestion idempotent per trace id, search and filters, review queues over
traces, promotion to task-set versions with provenance, and the traces pages."""

import pytest

from projects.models import TaskSetVersion
from reviews.models import QueueItem, Review
from runs import lifecycle
from tests.conftest import api_client_for
from tests.test_api_schema import assert_matches_schema, schema  # noqa: F401
from tiers import services as tier_services
from traces.models import Trace

pytestmark = pytest.mark.django_db


def ingest(client, project, traces):
    return client.post("/api/v1/traces", {"project": project.pk, "traces": traces}, format="json")


BATCH = [
    {
        "id": "t-1",
        "prompt": "Capital of France?",
        "completion": "Lyon",
        "model": "chat-v2",
        "score": 0.0,
        "success": False,
        "feedback": {"thumbs": "down", "correction": "Paris", "comment": "wrong city"},
        "latency_ms": 412.5,
        "metadata": {"customer": "acme", "session": "s9"},
        "timestamp": "2026-05-01T10:00:00Z",
    },
    {
        "id": "t-2",
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "2 + 2?"},
            {"role": "assistant", "content": "4"},
        ],
        "model": "chat-v2",
        "feedback": {"thumbs": "up"},
    },
    {"id": "t-3", "prompt": "Largest planet?", "completion": "Saturn", "feedback": {"thumbs": "down"}},
    {"id": "t-4", "prompt": "Color of the sky?", "completion": "blue", "model": "chat-v1"},
]


def test_a_batch_is_stored_and_reporting_it_again_changes_nothing(team):
    client = api_client_for(team["launcher"])
    first = ingest(client, team["project"], BATCH)
    assert first.status_code == 200, first.json()
    body = first.json()
    assert (body["received"], body["created"], body["updated"], body["unchanged"]) == (4, 4, 0, 0)
    assert [row["trace_id"] for row in body["traces"]] == ["t-1", "t-2", "t-3", "t-4"]
    trace = Trace.objects.get(pk=body["traces"][0]["id"])
    assert (trace.prompt, trace.completion, trace.thumbs, trace.correction, trace.feedback_comment) == (
        "Capital of France?",
        "Lyon",
        "down",
        "Paris",
        "wrong city",
    )
    assert (trace.score, trace.success, trace.latency_ms, trace.metadata["customer"]) == (
        0.0,
        False,
        412.5,
        "acme",
    )
    assert trace.occurred_at.isoformat() == "2026-05-01T10:00:00+00:00"
    chat = Trace.objects.get(external_id="t-2")
    assert (chat.prompt, chat.completion, len(chat.messages)) == ("2 + 2?", "4", 3)
    again = ingest(client, team["project"], BATCH).json()
    assert (again["created"], again["updated"], again["unchanged"]) == (0, 0, 4)
    assert Trace.objects.count() == 4


def test_later_feedback_updates_only_what_it_carries(team):
    client = api_client_for(team["launcher"])
    ingest(client, team["project"], BATCH)
    later = ingest(
        client, team["project"], [{"id": "t-4", "feedback": {"thumbs": "down", "correction": "azure"}}]
    )
    assert later.json()["updated"] == 1
    trace = Trace.objects.get(external_id="t-4")
    assert (trace.prompt, trace.completion, trace.model, trace.thumbs, trace.correction) == (
        "Color of the sky?",
        "blue",
        "chat-v1",
        "down",
        "azure",
    )
    cleared = ingest(client, team["project"], [{"id": "t-4", "feedback": {"thumbs": None}}]).json()
    assert cleared["updated"] == 1 and Trace.objects.get(external_id="t-4").thumbs == ""


def test_a_bad_batch_names_every_bad_field_and_writes_nothing(team):
    client = api_client_for(team["launcher"])
    tier = tier_services.tier_create(
        project=team["other_project"], by=team["outsider"], name="x", base_model="m"
    )
    batch = [
        {"id": "ok", "prompt": "p", "completion": "c"},
        {"id": "bad-thumbs", "prompt": "p", "feedback": {"thumbs": "sideways"}},
        {"id": "no-input", "completion": "c"},
        {"id": "foreign-tier", "prompt": "p", "tier": tier.pk},
    ]
    response = ingest(client, team["project"], batch)
    assert response.status_code == 400
    params = [detail["param"] for detail in response.json()["error"]["details"]]
    assert params == ["traces[1].feedback.thumbs"]
    assert not Trace.objects.exists()
    batch[1]["feedback"]["thumbs"] = "up"
    response = ingest(client, team["project"], batch)
    assert response.status_code == 400
    assert sorted(d["param"] for d in response.json()["error"]["details"]) == [
        "traces[2].prompt",
        "traces[3].tier",
    ]
    assert not Trace.objects.exists()


def test_only_launchers_and_owners_report_traces(team):
    assert ingest(api_client_for(team["reviewer"]), team["project"], BATCH).status_code == 403
    assert ingest(api_client_for(team["outsider"]), team["project"], BATCH).status_code == 404
    assert not Trace.objects.exists()


def test_the_same_idempotency_key_replays_the_first_answer(team):
    client = api_client_for(team["launcher"])
    first = client.post(
        "/api/v1/traces",
        {"project": team["project"].pk, "traces": BATCH},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k1",
    )
    replay = client.post(
        "/api/v1/traces",
        {"project": team["project"].pk, "traces": BATCH},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k1",
    )
    assert replay.json() == first.json() and replay["Idempotent-Replayed"] == "true"


def listed(client, **query) -> list[str]:
    response = client.get("/api/v1/traces", query)
    assert response.status_code == 200, response.json()
    return [row["trace_id"] for row in response.json()["results"]]


def test_traces_are_searched_and_filtered(team):
    ingest(api_client_for(team["launcher"]), team["project"], BATCH)
    viewer = api_client_for(team["viewer"])
    project = team["project"].pk
    assert listed(viewer, project=project) == ["t-4", "t-3", "t-2", "t-1"]
    assert listed(viewer, project=project, q="paris") == ["t-1"]  # found in the correction
    assert listed(viewer, project=project, thumbs="down") == ["t-3", "t-1"]
    assert listed(viewer, project=project, thumbs="none") == ["t-4"]
    assert listed(viewer, project=project, has_correction="true") == ["t-1"]
    assert listed(viewer, project=project, model="chat-v2", success="false") == ["t-1"]
    assert listed(viewer, project=project, meta="customer:acme") == ["t-1"]
    assert listed(viewer, project=project, until="2026-06-01T00:00:00Z") == ["t-1"]
    bad = viewer.get("/api/v1/traces", {"meta": "customer__contains:a"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "meta"
    assert listed(api_client_for(team["outsider"])) == []


def test_a_review_queue_works_over_traces_as_over_trajectories(team):
    ingest(api_client_for(team["launcher"]), team["project"], BATCH)
    reviewer = api_client_for(team["reviewer"])
    created = reviewer.post(
        "/api/v1/review-queues",
        {
            "source": "traces",
            "project": team["project"].pk,
            "name": "downvoted",
            "trace_filters": {"thumbs": "down"},
        },
        format="json",
    )
    assert created.status_code == 201, created.json()
    queue = created.json()
    assert (queue["source"], queue["run"], queue["item_count"]) == ("traces", None, 2)
    first = reviewer.post(f"/api/v1/review-queues/{queue['id']}/next").json()
    assert (first["trajectory"], first["trace"]["trace_id"]) == (None, "t-1")
    labelled = reviewer.post(
        "/api/v1/reviews", {"trace": first["trace"]["id"], "label": "bad"}, format="json"
    )
    assert labelled.status_code == 201 and labelled.json()["trace"] == first["trace"]["id"]
    second = reviewer.post(f"/api/v1/review-queues/{queue['id']}/next").json()
    assert second["trace"]["trace_id"] == "t-3"
    assert QueueItem.objects.filter(queue_id=queue["id"], done_at__isnull=False).count() == 1
    both = reviewer.post("/api/v1/reviews", {"trace": 1, "trajectory": 1, "label": "bad"}, format="json")
    assert both.status_code == 400
    assert api_client_for(team["viewer"]).get("/api/v1/traces?label=bad").json()["results"][0]["labels"] == [
        "bad"
    ]


def promote(client, project, **body):
    return client.post("/api/v1/traces/promote", {"project": project.pk} | body, format="json")


def test_promotion_makes_answer_items_and_preference_pairs_with_provenance(team):
    ingest(api_client_for(team["launcher"]), team["project"], BATCH)
    Review.objects.create(trace=Trace.objects.get(external_id="t-4"), reviewer=team["reviewer"], label="good")
    ids = list(Trace.objects.order_by("pk").values_list("pk", flat=True))
    response = promote(
        api_client_for(team["launcher"]), team["project"], traces=ids, task_set_name="from prod"
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["counts"] == {
        "traces": 4,
        "answer_items": 3,
        "preference_pairs": 1,
        "kept_items": 0,
        "skipped": {"no_prompt": 0, "no_reference": 1},  # t-3: a thumbs-down with no correction
    }
    version = TaskSetVersion.objects.get(pk=body["task_set_version"])
    items = {item.external_id: item.data for item in version.items.all()}
    assert sorted(items) == ["trace-t-1", "trace-t-2", "trace-t-4"]
    assert (items["trace-t-1"]["reference"], items["trace-t-1"]["metadata"]["chosen"]) == ("Paris", "Paris")
    assert items["trace-t-1"]["metadata"]["rejected"] == "Lyon"
    assert items["trace-t-1"]["metadata"]["provenance"]["trace_id"] == "t-1"
    assert items["trace-t-1"]["metadata"]["provenance"]["verdict"] == "bad"
    assert (items["trace-t-2"]["prompt"], items["trace-t-2"]["reference"]) == ("2 + 2?", "4")
    assert "chosen" not in items["trace-t-2"]["metadata"]
    assert items["trace-t-4"]["metadata"]["provenance"]["verdict"] == "good"  # from the review label
    # the pair a DPO run reads passes the submit checks
    assert lifecycle.pair_problems(version.items.all()) == {}


def test_promoting_again_appends_a_new_version_and_replaces_items_of_the_same_trace(team):
    client = api_client_for(team["launcher"])
    ingest(client, team["project"], BATCH)
    first = promote(client, team["project"], filters={"has_correction": True}).json()
    ingest(client, team["project"], [{"id": "t-1", "feedback": {"correction": "Paris, France"}}])
    second = promote(client, team["project"], filters={"thumbs": "up"}, task_set=first["task_set"])
    assert second.status_code == 201
    body = second.json()
    assert (body["number"], body["counts"]["kept_items"], body["item_count"]) == (2, 1, 2)
    third = promote(
        client, team["project"], filters={"has_correction": True}, task_set=first["task_set"]
    ).json()
    version = TaskSetVersion.objects.get(pk=third["task_set_version"])
    assert version.items.get(external_id="trace-t-1").data["reference"] == "Paris, France"
    assert version.item_count == 2


def test_promoting_nothing_teachable_is_refused_and_makes_nothing(team):
    client = api_client_for(team["launcher"])
    ingest(client, team["project"], BATCH)
    refused = promote(client, team["project"], filters={"trace_id": "t-3"})
    assert refused.status_code == 400 and not TaskSetVersion.objects.exists()
    missing = promote(client, team["project"], traces=[999999])
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "traces"
    assert promote(api_client_for(team["reviewer"]), team["project"], traces=[1]).status_code == 403


def test_trace_answers_match_their_declared_shapes(team, schema):  # noqa: F811
    client = api_client_for(team["launcher"])
    created = ingest(client, team["project"], BATCH)
    trace_id = created.json()["traces"][0]["id"]
    answers = [
        ("post", "/api/v1/traces", created),
        ("post", "/api/v1/traces", ingest(client, team["project"], [{"id": "x"}])),
        ("get", "/api/v1/traces", client.get("/api/v1/traces")),
        ("get", "/api/v1/traces/{id}", client.get(f"/api/v1/traces/{trace_id}")),
        ("post", "/api/v1/traces/promote", promote(client, team["project"], traces=[trace_id])),
    ]
    assert [response.status_code for _, _, response in answers] == [200, 400, 200, 200, 201]
    for method, path, response in answers:
        assert_matches_schema(schema, response, method, path)
    assert client.delete(f"/api/v1/traces/{trace_id}").status_code == 204
    assert not Trace.objects.filter(pk=trace_id).exists()


# --- pages ---------------------------------------------------------------------------------


def test_the_traces_page_filters_and_shows_model_output_as_inert_text(client, team):
    hostile = {
        "id": "h",
        "prompt": "<b>hi</b>",
        "completion": "<script>alert(1)</script>",
        "feedback": {"thumbs": "down"},
    }
    ingest(api_client_for(team["launcher"]), team["project"], BATCH + [hostile])
    client.force_login(team["viewer"])
    page = client.get(f"/projects/{team['project'].pk}/traces/", {"thumbs": "down"}).content.decode()
    assert page.count('data-trace="') == 3
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert 'name="traces"' not in page  # a viewer cannot select for promotion
    detail = client.get(f"/traces/{Trace.objects.get(external_id='h').pk}/").content.decode()
    assert "<script>alert(1)</script>" not in detail and "&lt;b&gt;hi&lt;/b&gt;" in detail
    client.force_login(team["outsider"])
    assert client.get(f"/projects/{team['project'].pk}/traces/").status_code == 404


def test_from_the_page_a_launcher_promotes_selected_traces_and_a_reviewer_works_a_queue(client, team):
    ingest(api_client_for(team["launcher"]), team["project"], BATCH)
    project = team["project"]
    client.force_login(team["launcher"])
    chosen = Trace.objects.filter(external_id__in=["t-1", "t-2"]).values_list("pk", flat=True)
    response = client.post(
        f"/projects/{project.pk}/traces/promote/",
        {"scope": "selected", "traces": [str(pk) for pk in chosen], "task_set_name": "prod"},
    )
    version = TaskSetVersion.objects.get(task_set__name="prod")
    assert response.status_code == 302 and version.item_count == 2
    client.force_login(team["reviewer"])
    made = client.post(f"/projects/{project.pk}/traces/review-queue/", {"thumbs": "down", "name": "down"})
    assert made.status_code == 302
    queue_url = made["Location"]
    assert "t-1" in client.get(queue_url).content.decode()
    queue_id = int(queue_url.rstrip("/").rsplit("/", 1)[1])
    assert f"/review-queues/{queue_id}/" in client.get(f"/projects/{project.pk}/traces/").content.decode()
    opened = client.post(f"/review-queues/{queue_id}/next/")
    first = Trace.objects.get(external_id="t-1")
    assert opened["Location"] == f"/traces/{first.pk}/?queue={queue_id}"
    saved = client.post(f"/traces/{first.pk}/review/", {"label": "bad", "queue": str(queue_id)})
    second = Trace.objects.get(external_id="t-3")
    assert saved["Location"] == f"/traces/{second.pk}/?queue={queue_id}"
    assert list(Review.objects.values_list("trace__external_id", "label")) == [("t-1", "bad")]


def test_a_timestamp_before_1970_is_refused_by_name(team):
    """A year before 1000 has no four-digit ISO 8601 form: stored, it could never be read back as a
    date-time (the fuzzer found one); no production trace predates 1970."""
    client = api_client_for(team["launcher"])
    response = ingest(
        client, team["project"], [{"id": "old", "prompt": "p", "timestamp": "0562-07-02T05:14:21Z"}]
    )
    assert response.status_code == 400
    [detail] = response.json()["error"]["details"]
    assert (detail["param"], detail["message"]) == ("traces[0].timestamp", "must be in 1970 or later")
    assert not Trace.objects.exists()

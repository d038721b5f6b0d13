"""Review pages say what they can do (issue 26): a queue whose filters match nothing is refused with
the count, a queue with nothing left says so on its button, an empty training export says why
instead of a 0-byte file, and labels and comments export as CSV and JSONL (pages and REST)."""

import csv
import io
import json

import pytest
from django.contrib.messages import get_messages
from django.test import Client

from reviews import services as review_services
from reviews.models import ReviewQueue
from tests import run_fixtures
from tests.conftest import api_client_for
from tests.run_fixtures import make_run, make_trajectory

pytestmark = pytest.mark.django_db
lab = run_fixtures.lab  # the fixture


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def said(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def test_a_queue_whose_filters_match_nothing_is_refused_with_the_count(lab):
    run = make_run(lab)
    make_trajectory(run, index=0, reward=0.2)
    make_trajectory(run, index=1, reward=0.9)
    client = signed_in(lab["reviewer"])
    refused = client.post(f"/runs/{run.pk}/review-queues/", {"name": "none", "min_reward": "5"})
    assert refused.status_code == 200
    assert said(refused) == [
        "Not created: no trajectory of this run matches these filters (0 of 2); loosen them"
    ]
    assert not ReviewQueue.objects.exists()
    made = client.post(f"/runs/{run.pk}/review-queues/", {"name": "high", "min_reward": "0.5"})
    assert said(made) == ["Queue high created with 1 trajectory."]


def test_a_queue_with_nothing_left_says_nothing_to_review(lab):
    run = make_run(lab)
    trajectory = make_trajectory(run)
    queue = review_services.queue_create(run=run, name="q", filters={}, by=lab["owner"])
    client = signed_in(lab["reviewer"])
    page = client.get(f"/review-queues/{queue.pk}/").content.decode()
    assert 'id="queue-next">Review next</button>' in page
    review_services.review_save(trajectory=trajectory, by=lab["reviewer"], label="good", comment="")
    page = client.get(f"/review-queues/{queue.pk}/").content.decode()
    assert 'id="queue-next" disabled' in page and ">Nothing to review</button>" in page


def test_an_empty_dpo_export_says_why_instead_of_an_empty_file(lab):
    run = make_run(lab)
    make_trajectory(run)
    client = signed_in(lab["viewer"])
    queues_page = f"http://testserver/runs/{run.pk}/review-queues/"
    response = client.get(f"/runs/{run.pk}/export/dpo.jsonl", HTTP_REFERER=queues_page)
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/review-queues/"
    (message,) = said(response)
    assert message.startswith("No DPO pairs to export: a pair is a reviewer's choice between two completions")
    assert "this run has 0 choices and no such labelled pair" in message
    sft = said(client.get(f"/runs/{run.pk}/export/sft.jsonl"))[-1]  # the first is not shown yet
    assert sft == "No SFT examples to export: no trajectory of this run is labelled good."


def test_labels_and_comments_export_as_csv_and_jsonl(lab):
    run = make_run(lab)
    first, second = make_trajectory(run, index=0), make_trajectory(run, index=1, reward=0.0)
    review_services.review_save(trajectory=first, by=lab["reviewer"], label="good", comment="clean")
    review_services.review_save(trajectory=second, by=lab["owner"], label="bad", comment='=HYPERLINK("x")')
    client = signed_in(lab["viewer"])
    response = client.get(f"/runs/{run.pk}/export/labels.csv")
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert [(r["trajectory"], r["item"], r["reviewer"], r["label"], r["comment"]) for r in rows] == [
        (str(first.pk), "q0", "reviewer", "good", "clean"),
        (str(second.pk), "q1", "owner", "bad", '\'=HYPERLINK("x")'),
    ]
    response = client.get(f"/runs/{run.pk}/export/labels.jsonl")
    lines = [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]
    assert [(line["label"], line["comment"]) for line in lines] == [
        ("good", "clean"),
        ("bad", '=HYPERLINK("x")'),
    ]
    api = api_client_for(lab["viewer"]).get(f"/api/v1/reviews/export?run={run.pk}&kind=labels")
    assert api.status_code == 200
    api_lines = [json.loads(line) for line in b"".join(api.streaming_content).decode().splitlines()]
    assert api_lines == lines
    assert signed_in(lab["outsider"]).get(f"/runs/{run.pk}/export/labels.csv").status_code == 404
    assert client.get(f"/runs/{run.pk}/export/labels.xlsx").status_code == 404


def test_an_unreviewed_run_has_no_labels_to_export(lab):
    run = make_run(lab)
    response = signed_in(lab["viewer"]).get(f"/runs/{run.pk}/export/labels.csv")
    assert response.status_code == 302
    assert said(response) == [
        "No labels or comments to export: nobody has reviewed this run's trajectories yet."
    ]

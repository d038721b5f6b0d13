"""Reviews over REST: labels, preferences, queues with assignment and next-item, and exports that
import back as a task set."""

# The fixture imported from run_fixtures is a test parameter here, not a redefinition:
# ruff: noqa: F811
import json

import pytest
from django.test import Client

from projects import services as project_services
from reviews.models import Preference, QueueItem, Review
from runs.models import Trajectory
from tests.conftest import api_client_for
from tests.run_fixtures import lab, make_run, make_trajectory  # noqa: F401

pytestmark = pytest.mark.django_db


@pytest.fixture
def group(lab):
    """Three samples for the first prompt and one for the second."""
    run = make_run(lab)
    item = run.task_set_version.items.order_by("position")[0]
    texts = [(1.0, "2"), (0.0, "3"), (1.0, "import sys; sys.exit(0)")]
    samples = [
        Trajectory.objects.create(
            run=run,
            item=item,
            sample_index=index,
            policy_version=0,
            outcome="scored",
            reward=reward,
            completion_text=text,
        )
        for index, (reward, text) in enumerate(texts)
    ]
    other = make_trajectory(run, index=1, completion_text="4")
    return {"run": run, "samples": samples, "other": other, "item": item}


def label(client, trajectory, value, comment=""):
    return client.post(
        "/api/v1/reviews", {"trajectory": trajectory.pk, "label": value, "comment": comment}, format="json"
    )


def test_a_reviewer_labels_a_trajectory_and_a_second_label_replaces_the_first(lab, group):
    client = api_client_for(lab["reviewer"])
    first = label(client, group["samples"][0], "bad")
    second = label(client, group["samples"][0], "good", "right answer")
    assert (first.status_code, second.status_code) == (201, 201)
    assert list(Review.objects.values_list("label", "comment")) == [("good", "right answer")]
    listed = client.get("/api/v1/trajectories", {"run": group["run"].pk, "label": "good"}).json()["results"]
    assert [row["id"] for row in listed] == [group["samples"][0].pk]
    assert listed[0]["labels"] == ["good"]


def test_a_viewer_cannot_label_and_nothing_changes(lab, group):
    response = label(api_client_for(lab["viewer"]), group["samples"][0], "good")
    assert response.status_code == 403 and not Review.objects.exists()


def test_a_preference_needs_two_trajectories_for_the_same_prompt(lab, group):
    client = api_client_for(lab["reviewer"])
    chosen, rejected = group["samples"][0], group["samples"][1]
    refused = client.post(
        "/api/v1/preferences", {"chosen": chosen.pk, "rejected": group["other"].pk}, format="json"
    )
    assert refused.status_code == 400 and refused.json()["error"]["details"][0]["param"] == "rejected"
    assert not Preference.objects.exists()
    ok = client.post("/api/v1/preferences", {"chosen": chosen.pk, "rejected": rejected.pk}, format="json")
    assert ok.status_code == 201
    swapped = client.post(
        "/api/v1/preferences", {"chosen": rejected.pk, "rejected": chosen.pk}, format="json"
    )
    assert swapped.status_code == 201  # a change of mind replaces the opposite choice
    assert list(Preference.objects.values_list("chosen", "rejected")) == [(rejected.pk, chosen.pk)]


def test_the_group_endpoint_lists_every_completion_for_the_prompt(lab, group):
    body = api_client_for(lab["viewer"]).get(f"/api/v1/trajectories/{group['samples'][1].pk}/group").json()
    assert [row["id"] for row in body] == [t.pk for t in group["samples"]]
    assert [row["completion_text"] for row in body] == ["2", "3", "import sys; sys.exit(0)"]


def test_a_queue_is_dealt_to_reviewers_and_each_gets_their_next_item(lab, group):
    owner = api_client_for(lab["owner"])
    created = owner.post(
        "/api/v1/review-queues",
        {"run": group["run"].pk, "name": "passing", "filters": {"min_reward": 1.0}},
        format="json",
    )
    assert created.status_code == 201
    queue = created.json()
    assert (queue["item_count"], queue["done_count"]) == (3, 0)
    refused = owner.post(
        f"/api/v1/review-queues/{queue['id']}/assign", {"reviewers": [lab["viewer"].pk]}, format="json"
    )
    assert refused.status_code == 400 and not QueueItem.objects.exclude(assignee=None).exists()
    dealt = owner.post(
        f"/api/v1/review-queues/{queue['id']}/assign",
        {"reviewers": [lab["reviewer"].pk, lab["owner"].pk]},
        format="json",
    )
    assert dealt.json() == {"assigned": 3}
    reviewer = api_client_for(lab["reviewer"])
    mine = reviewer.post(f"/api/v1/review-queues/{queue['id']}/next").json()
    assert (mine["position"], mine["trajectory"]["id"]) == (0, group["samples"][0].pk)
    label(reviewer, group["samples"][0], "good")
    following = reviewer.post(f"/api/v1/review-queues/{queue['id']}/next").json()
    assert following["trajectory"]["id"] == group["other"].pk  # dealt in turn: 1st and 3rd are theirs
    label(reviewer, group["other"], "good")
    assert reviewer.post(f"/api/v1/review-queues/{queue['id']}/next").status_code == 204
    assert owner.get(f"/api/v1/review-queues/{queue['id']}").json()["done_count"] == 2


def export(client, run, kind) -> list[dict]:
    response = client.get("/api/v1/reviews/export", {"run": run.pk, "kind": kind})
    assert response.status_code == 200 and response["Content-Type"] == "application/x-ndjson"
    return [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]


def test_reviewed_data_exports_as_sft_and_dpo_and_imports_as_a_task_set(lab, group):
    reviewer = api_client_for(lab["reviewer"])
    good, wrong, hack = group["samples"]
    label(reviewer, good, "good")
    label(reviewer, hack, "reward_hack")
    reviewer.post("/api/v1/preferences", {"chosen": good.pk, "rejected": wrong.pk}, format="json")
    viewer = api_client_for(lab["viewer"])
    prompt = group["item"].text
    sft = export(viewer, group["run"], "sft")
    assert sft == [
        {
            "kind": "answer",
            "id": f"q0-t{good.pk}",
            "prompt": prompt,
            "reference": "2",
            "split": "train",
            "metadata": {
                "provenance": {
                    "run": group["run"].pk,
                    "trajectory": good.pk,
                    "item": "q0",
                    "policy_version": 0,
                    "reward": 1.0,
                    "label": "good",
                }
            },
        }
    ]
    pairs = export(viewer, group["run"], "dpo")
    assert [
        (p["prompt"], p["chosen"], p["rejected"], p["metadata"]["provenance"]["source"]) for p in pairs
    ] == [
        (prompt, "2", "3", "preference"),
        (prompt, "2", "import sys; sys.exit(0)", "labels"),
    ]
    task_set = project_services.task_set_create(project=lab["project"], name="reviewed", by=lab["owner"])
    for kind in ("sft", "dpo-task-set"):
        lines = [(json.dumps(line) + "\n").encode() for line in export(viewer, group["run"], kind)]
        report = project_services.task_set_import(
            task_set=task_set, stream=lines, file_format="jsonl", by=lab["owner"]
        )
        assert report.created and report.version.items.count() == len(lines)


def page_client(user):
    client = Client()
    client.force_login(user)
    return client


def test_the_trajectory_page_walks_the_reviewers_queue_and_the_group_page_shows_preferences(lab, group):
    """The parts of the run pages reviews owns (registered into runs.run_page): "next" in a queue
    skips items dealt to someone else, and a group's cards show the preferences already given."""
    owner, reviewer = api_client_for(lab["owner"]), api_client_for(lab["reviewer"])
    queue = owner.post(
        "/api/v1/review-queues",
        {"run": group["run"].pk, "name": "passing", "filters": {"min_reward": 1.0}},
        format="json",
    ).json()
    owner.post(
        f"/api/v1/review-queues/{queue['id']}/assign",
        {"reviewers": [lab["reviewer"].pk, lab["owner"].pk]},
        format="json",
    )
    items = list(QueueItem.objects.filter(queue_id=queue["id"]).order_by("position"))
    assert [item.assignee_id for item in items] == [lab["reviewer"].pk, lab["owner"].pk, lab["reviewer"].pk]
    first, mine_next = items[0].trajectory_id, items[2].trajectory_id
    page = page_client(lab["reviewer"]).get(f"/trajectories/{first}/?queue={queue['id']}")
    assert page.context["next_url"] == f"/trajectories/{mine_next}/?queue={queue['id']}"
    last = page_client(lab["reviewer"]).get(f"/trajectories/{mine_next}/?queue={queue['id']}")
    assert last.context["next_url"] is None  # the end of the queue, not the run's next trajectory

    chosen, rejected = group["samples"][0], group["samples"][1]
    reviewer.post("/api/v1/preferences", {"chosen": chosen.pk, "rejected": rejected.pk}, format="json")
    cards = page_client(lab["viewer"]).get(f"/trajectories/{chosen.pk}/group/").context["group"]
    marks = {card.pk: (card.won, card.lost, card.versus_current) for card in cards}
    who = lab["reviewer"].get_username()
    assert marks == {
        chosen.pk: ([(rejected.pk, who)], [], None),
        rejected.pk: ([], [(chosen.pk, who)], chosen.pk),
        group["samples"][2].pk: ([], [], None),
    }

"""External agents (episodes/): a run of `external_rollouts` hands out its batches' slots as
episodes, its newest policy answers as `run-<id>` on /v1/chat/completions (tools included), each
turn is kept token for token with its behaviour log-probs, and an outcome stores the episode as
the slot's trajectory, once. In process: the web side and the records; tests/test_episodes_e2e.py
trains a run through real workers with an agent on the official openai client."""

import json
import math
from datetime import timedelta

import pytest
import torch
from django.test import Client
from django.utils import timezone

from costs import selectors as cost_selectors
from costs.models import Usage
from costs.services import rollout_component
from episodes.models import Episode
from inference import openai_protocol as protocol
from inference.policy import policy_load
from projects import services as project_services
from runs.models import RolloutBatch, Run, Trajectory, TrajectoryStep
from runs.run_store import policy_dir
from tests.conftest import api_client_for
from tests.run_harness import demo_project, tiny_model  # noqa: F401  (a fixture)
from tests.serving_fixtures import publish_trained
from workers.run_learner import _episodes

pytestmark = pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume asynchronous iterators")

CALC = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def external_run(model, *, group_size: int = 2, items: int = 2) -> dict:
    """A running external_rollouts run with its policy v0 published and one rollout batch of
    `items` train items, as the learner leaves them at step 0."""
    setup = demo_project(model)
    client = api_client_for(setup["owner"])
    body = {
        "project": setup["project"].pk,
        "name": "agents",
        "task_set_version": setup["version"].pk,
        "reward_rule_version": setup["rule"].versions.get().pk,
        "tier": setup["tier"].pk,
        "method": "external_rollouts",
        "hyperparameters": {"group_size": group_size, "batch_size": items, "episode_deadline_seconds": 60},
        "max_steps": 2,
    }
    response = client.post("/api/v1/runs", body, format="json")
    assert response.status_code == 201, response.json()
    run = Run.objects.get(pk=response.json()["id"])
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    run.refresh_from_db()
    publish_trained(run, model, step=0, metrics=False)
    item_ids = list(
        run.task_set_version.items.filter(split="train").order_by("position").values_list("pk", flat=True)
    )
    batch = RolloutBatch.objects.create(
        run=run, index=0, step=0, policy_version=0, item_ids=item_ids[:items], deadline_at=timezone.now()
    )
    _, token = project_services.api_token_create(user=setup["owner"], name="agent")
    return setup | {
        "run": run,
        "batch": batch,
        "client": client,
        "v1": Client(headers={"Authorization": f"Bearer {token}"}),
    }


def post(client: Client, path: str, body: dict, **headers):
    return client.post(path, json.dumps(body), content_type="application/json", headers=headers)


def answer(response) -> dict:
    assert response.status_code == 200, b"".join(response) if response.streaming else response.content
    return json.loads(b"".join(response))


# --- tools on /v1 ------------------------------------------------------------------------------


def test_a_completion_with_tool_call_blocks_answers_as_openai_tool_calls():
    request = protocol.request_parse(
        {"model": "m", "messages": [{"role": "user", "content": "2+3?"}], "tools": [CALC]}, chat=True
    )
    text = 'Let me add. <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    choice = protocol.choice_body(request, 0, text, [], "stop", str)
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me add."
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}
    # Invalid arguments: the text comes back as it was written, and nothing is called.
    wrong = protocol.choice_body(
        request, 0, '<tool_call>{"name": "add", "arguments": {"a": "x"}}</tool_call>', [], "stop", str
    )
    assert (wrong["finish_reason"], wrong["message"]["tool_calls"]) == ("stop", [])
    assert wrong["message"]["content"].startswith("<tool_call>")
    # tool_choice "none": never read as calls.
    none = protocol.request_parse(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [CALC],
            "tool_choice": "none",
        },
        chat=True,
    )
    assert protocol.choice_body(none, 0, text, [], "stop", str)["message"]["tool_calls"] == []
    # Streamed: the content, then the calls with their index, then nothing after the finish.
    chunks = protocol.reply_chunks(request, "id", 1, 0, text, "stop", str)
    assert [chunk["choices"][0]["delta"].get("content") for chunk in chunks] == ["Let me add.", None]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"][0]["delta"]["tool_calls"][0]["index"] == 0


def test_a_conversation_with_tool_calls_and_results_is_taken_whole():
    request = protocol.request_parse(
        {
            "model": "m",
            "tools": [CALC],
            "messages": [
                {"role": "user", "content": "2+3?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "5"},
            ],
        },
        chat=True,
    )
    assert request.messages[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
        ],
    }
    assert request.messages[2] == {"role": "tool", "content": "5", "tool_call_id": "c1", "name": "add"}


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"tools": {"add": {}}}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"tools": [CALC, CALC]}, "tools[1].function.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "5"}]},
            "messages[1].tool_call_id",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"function": {"name": "add", "arguments": "{"}}],
                    },
                    {"role": "user", "content": "x"},
                ]
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
        ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}, "messages"),
        ({"metadata": {"episode_id": 7}}, "metadata"),
    ],
)
def test_bad_tool_requests_are_refused_naming_the_parameter(change, param):
    body = {"model": "m", "messages": [{"role": "user", "content": "2+3?"}], "tools": [CALC]} | change
    with pytest.raises(protocol.OpenAIError) as refused:
        protocol.request_parse(body, chat=True)
    assert refused.value.status == 400 and refused.value.param == param


# --- episodes ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_slots_go_out_group_by_group_once_each_and_a_timed_out_one_goes_out_again(tiny_model):  # noqa: F811
    lab = external_run(tiny_model)
    client, run = lab["client"], lab["run"]
    url = f"/api/v1/runs/{run.pk}/episodes"
    handed = [client.post(url).json() for _ in range(4)]
    items = lab["batch"].item_ids
    assert [(e["group"]["item"], e["group"]["sample_index"]) for e in handed] == [
        (items[0], 0),
        (items[0], 1),
        (items[1], 0),
        (items[1], 1),
    ]
    assert {e["model"] for e in handed} == {f"run-{run.pk}"} and all(e["status"] == "open" for e in handed)
    task = handed[0]["task"]
    assert task["kind"] == "code" and task["id"] and task["prompt"]  # the item's data, as imported
    full = client.post(url)
    assert full.status_code == 409 and full["Retry-After"] == "2"
    # The second episode's agent died: past its deadline its slot is handed out again.
    Episode.objects.filter(key=handed[1]["id"]).update(deadline_at=timezone.now() - timedelta(seconds=1))
    again = client.post(url).json()
    assert (again["group"]["item"], again["group"]["sample_index"]) == (items[0], 1)
    assert Episode.objects.get(key=handed[1]["id"]).status == "timed_out"
    late = client.post(f"{url}/{handed[1]['id']}/outcome", {"reward": 1.0}, format="json")
    assert late.status_code == 409 and "timed out" in late.json()["error"]["message"]
    assert run.events.filter(kind="episode_timeout", data__timed_out=1).count() == 1
    counts = client.get(f"{url}/counts").json()
    assert counts == {"open": 4, "scoring": 0, "reported": 0, "timed_out": 1, "cancelled": 0}


@pytest.mark.django_db
def test_outcomes_are_checked_by_field_and_taken_once(tiny_model):  # noqa: F811
    lab = external_run(tiny_model, group_size=2, items=1)
    client, run = lab["client"], lab["run"]
    url = f"/api/v1/runs/{run.pk}/episodes"
    first, second = client.post(url).json(), client.post(url).json()
    for body, param in [
        ({}, "reward"),
        ({"reward": 1.0, "final": "x"}, "reward"),
        ({"final": "4", "components": {"a": 1.0}}, "components"),
        ({"reward": "high"}, "reward"),
        ({"reward": "nan"}, "reward"),
        ({"reward": 1.0, "components": {"a": "inf"}}, "components.a"),
    ]:
        refused = client.post(f"{url}/{first['id']}/outcome", body, format="json")
        assert refused.status_code == 400, body
        assert refused.json()["error"]["details"][0]["param"] == param
    done = client.post(
        f"{url}/{first['id']}/outcome", {"reward": 0.5, "components": {"format": 1.0}}, format="json"
    )
    assert done.status_code == 200 and done.json()["status"] == "reported" and done.json()["reward"] == 0.5
    twice = client.post(f"{url}/{first['id']}/outcome", {"reward": 1.0}, format="json")
    assert twice.status_code == 409 and "reports once" in twice.json()["error"]["message"]
    trajectory = Trajectory.objects.get(run=run)
    # No turn was played: nothing to learn from, so it is stored as errored, never with its reward.
    assert (trajectory.outcome, trajectory.reward, trajectory.components) == (
        "errored",
        None,
        {"format": 1.0},
    )
    assert RolloutBatch.objects.get(pk=lab["batch"].pk).status == "running"
    client.post(f"{url}/{second['id']}/outcome", {"reward": 0.0}, format="json")
    assert RolloutBatch.objects.get(pk=lab["batch"].pk).status == "done"  # every slot holds a trajectory
    assert client.get(f"{url}?status=reported").json()["results"][0]["trajectory"] is not None
    assert client.get(f"{url}/not-a-key").status_code == 404


@pytest.mark.django_db
def test_a_grpo_run_hands_out_no_episodes_and_a_viewer_cannot_play(tiny_model):  # noqa: F811
    lab = external_run(tiny_model)
    Run.objects.filter(pk=lab["run"].pk).update(method="grpo")
    assert lab["client"].post(f"/api/v1/runs/{lab['run'].pk}/episodes").status_code == 409
    Run.objects.filter(pk=lab["run"].pk).update(method="external_rollouts", status=Run.Status.PAUSED)
    paused = lab["client"].post(f"/api/v1/runs/{lab['run'].pk}/episodes")
    assert paused.status_code == 409 and "paused" in paused.json()["error"]["message"]


def learner_logprobs(run: Run, version: int, prompt: list[int], completion: list[int]) -> list[float]:
    """The completion's log-probs as the learner computes them: one forward pass over the tokens."""
    policy = policy_load(policy_dir(run.pk, version))
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = policy.model(ids).logits.float()
    picked = torch.log_softmax(logits[0, len(prompt) - 1 : -1], dim=-1)
    return picked.gather(1, torch.tensor(completion)[:, None]).squeeze(1).tolist()


@pytest.mark.django_db(transaction=True)
def test_each_turn_is_kept_token_for_token_and_learned_on_the_sampled_tokens(tiny_model):  # noqa: F811
    lab = external_run(tiny_model, group_size=2, items=1)
    run, v1 = lab["run"], lab["v1"]
    episode = lab["client"].post(f"/api/v1/runs/{run.pk}/episodes").json()
    messages = [{"role": "user", "content": "2+3"}]
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    chat = {
        "model": f"run-{run.pk}",
        "messages": messages,
        "tools": [tool],
        "max_tokens": 3,
        "logprobs": True,
    }
    listed = json.loads(v1.get("/v1/models").content)["data"]
    assert {"id": f"run-{run.pk}", "kind": "policy"} in [
        {"id": card["id"], "kind": card["flywheel"]["kind"]} for card in listed
    ]
    first = answer(post(v1, "/v1/chat/completions", chat, **{"X-Flywheel-Episode": episode["id"]}))
    assert first["choices"][0]["message"]["role"] == "assistant"
    # The agent writes the turn back its own way (text that is not the sampled tokens: agents keep
    # what they parsed, not what was decoded), then a call and its result, as agents do: the next
    # prompt is not the last turn's tokens extended.
    history = [
        *messages,
        {
            "role": "assistant",
            "content": "ok",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "V5"},
    ]
    # (the tiny model reads 256 tokens: the second turn leaves the tool list out, keeping its history)
    body = {k: v for k, v in chat.items() if k != "tools"} | {
        "messages": history,
        "metadata": {"episode_id": episode["id"]},
        "stream": True,
    }
    streamed = post(v1, "/v1/chat/completions", body)
    assert streamed.status_code == 200, streamed.content
    assert b"[DONE]" in b"".join(streamed)
    stored = Episode.objects.get(key=episode["id"])
    one, two = stored.turns
    assert "V5" in two["prompt"] and two["policy_version"] == 0
    assert [entry["logprob"] for entry in first["choices"][0]["logprobs"]["content"]] == pytest.approx(
        one["logprobs"][: len(first["choices"][0]["logprobs"]["content"])], abs=1e-6
    )
    assert two["prompt_token_ids"][: len(one["prompt_token_ids"]) + len(one["token_ids"])] != (
        one["prompt_token_ids"] + one["token_ids"]
    )
    for turn in (one, two):  # behaviour log-probs = the learner's own, on exactly these tokens
        recomputed = learner_logprobs(run, 0, turn["prompt_token_ids"], turn["token_ids"])
        assert recomputed == pytest.approx(turn["logprobs"], abs=1e-4)
    # n > 1 on an episode, an unknown episode, and a turn after the outcome are refused.
    many = post(v1, "/v1/chat/completions", chat | {"n": 2}, **{"X-Flywheel-Episode": episode["id"]})
    assert many.status_code == 400 and json.loads(many.content)["error"]["param"] == "n"
    stranger = post(v1, "/v1/chat/completions", chat, **{"X-Flywheel-Episode": "nope"})
    assert (
        stranger.status_code == 400
        and json.loads(stranger.content)["error"]["param"] == "metadata.episode_id"
    )
    outcome = lab["client"].post(
        f"/api/v1/runs/{run.pk}/episodes/{episode['id']}/outcome", {"reward": 1.0}, format="json"
    )
    assert outcome.json()["status"] == "reported"
    closed = post(v1, "/v1/chat/completions", chat, **{"X-Flywheel-Episode": episode["id"]})
    assert closed.status_code == 409
    trajectory = Trajectory.objects.get(run=run)
    assert (trajectory.outcome, trajectory.reward, trajectory.step_count) == ("scored", 1.0, 2)
    steps = [step.data() for step in TrajectoryStep.objects.filter(trajectory=trajectory).order_by("index")]
    assert [step["token_ids"] for step in steps] == [one["token_ids"], two["token_ids"]]
    (learned,) = _episodes([trajectory])
    assert [turn.prompt_token_ids for turn in learned.turns] == [
        one["prompt_token_ids"],
        two["prompt_token_ids"],
    ]
    assert [turn.logprobs for turn in learned.turns] == [one["logprobs"], two["logprobs"]]
    assert not math.isnan(sum(one["logprobs"]))


@pytest.mark.django_db
def test_an_episodes_decoding_is_billed_as_a_rollout_workers_batch_is(tiny_model):  # noqa: F811
    """Every turn decoded on /v1 for a batch's episodes, a timed-out one's included (the device did
    that work), lands in the batch's rollout usage once it closes: the prompt tokens prefilled and
    the tokens sampled exactly as each response's `usage` counted them, and the decode's seconds."""
    lab = external_run(tiny_model, group_size=2, items=1)
    run, v1, batch = lab["run"], lab["v1"], lab["batch"]
    chat = {"model": f"run-{run.pk}", "messages": [{"role": "user", "content": "2+3"}], "max_tokens": 4}
    counted = {"prompt_tokens": 0, "completion_tokens": 0}

    def start() -> str:
        return lab["client"].post(f"/api/v1/runs/{run.pk}/episodes").json()["id"]

    def turn(episode: str, messages: list[dict]) -> None:
        body = answer(
            post(v1, "/v1/chat/completions", chat | {"messages": messages}, **{"X-Flywheel-Episode": episode})
        )
        for name in counted:
            counted[name] += body["usage"][name]

    def report(episode: str) -> None:
        url = f"/api/v1/runs/{run.pk}/episodes/{episode}/outcome"
        assert lab["client"].post(url, {"reward": 1.0}, format="json").json()["status"] == "reported"

    first, dropped = start(), start()
    turn(first, chat["messages"])
    turn(
        first,
        [*chat["messages"], {"role": "assistant", "content": "5"}, {"role": "user", "content": "and 2+4?"}],
    )
    turn(dropped, chat["messages"])
    Episode.objects.filter(key=dropped).update(deadline_at=timezone.now() - timedelta(seconds=1))
    again = start()  # the dropped episode's slot, handed out again
    assert Episode.objects.get(key=dropped).status == "timed_out"
    turn(again, chat["messages"])
    report(first)
    assert not Usage.objects.filter(run=run).exists()  # billed when the batch closes
    report(again)
    usage = Usage.objects.get(run=run)
    assert (usage.step, usage.component, usage.kind) == (1, rollout_component(batch.item_ids), "rollout")
    assert (usage.tokens_prefilled, usage.tokens_sampled) == (
        counted["prompt_tokens"],
        counted["completion_tokens"],
    )
    assert usage.tokens_prefilled > 0 and usage.tokens_sampled > 0
    turns = [turn for episode in Episode.objects.filter(run=run) for turn in episode.turns]
    assert len(turns) == 4 and all(turn["device_seconds"] > 0 for turn in turns)
    assert usage.device_seconds == pytest.approx(sum(turn["device_seconds"] for turn in turns))
    assert usage.device_class == "cpu" and usage.recordings == 1
    assert cost_selectors.run_spent(run=run).units["device_seconds"] == usage.device_seconds


@pytest.mark.django_db
def test_the_run_page_shows_the_model_agents_call_and_the_episodes_by_state(tiny_model, client):  # noqa: F811
    lab = external_run(tiny_model)
    run = lab["run"]
    lab["client"].post(f"/api/v1/runs/{run.pk}/episodes")
    client.force_login(lab["owner"])
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert f"<code>run-{run.pk}</code>" in page
    open_stat = '<div class="stat" data-state="open"><span class="stat-label">Open</span>'
    assert open_stat + '<span class="stat-value">1</span>' in page
    assert client.get("/docs/guides/agents/").status_code == 200
    Run.objects.filter(pk=run.pk).update(method="grpo")
    assert 'id="run-episodes"' not in client.get(f"/runs/{run.pk}/").content.decode()

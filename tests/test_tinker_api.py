"""The Tinker API in process: its wire format read and written with the SDK's own converters, the
losses as Tinker defines them, a forward_backward on a real tiny model (sums, accumulation), and
the views' contract: who may do what, refusals by field, retries that do not queue work twice,
held polls, and the end of a session. The official client against a live server is in
tests/test_tinker_e2e.py."""

import json
import math

import numpy as np
import pytest
import torch
from django.core.exceptions import ValidationError
from django.urls import reverse
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import deserialize_forward_backward_output, deserialize_sample_response

from core.roles import Role
from projects import services as project_services
from runs import lifecycle
from runs.learners import algorithm_choices, launch_choices
from runs.models import Run
from tests.run_harness import tiny_model
from tiers import services as tier_services
from tinker_api import services as tinker_services
from tinker_api import wire
from tinker_api.models import TinkerModel, TinkerRequest, TinkerSession, TinkerWeights
from traces.models import Trace
from workers import tinker_sampling
from workers.learners.tinker import token_losses

__all__ = ["tiny_model"]
BASE = "acme/tiny"


def fb_body(loss_fn: str = "cross_entropy", data: list | None = None, model_id: str = "m", **config) -> bytes:
    """A forward_backward body as the SDK writes it."""
    data = data or [
        types.Datum(
            model_input=types.ModelInput.from_ints([5, 6, 7]),
            loss_fn_inputs={"target_tokens": [6, 7, 8], "weights": [0.0, 1.0, 1.0]},
        )
    ]
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=data, loss_fn=loss_fn, loss_fn_config=config or None
        ),
        model_id=model_id,
        seq_id=1,
    )
    return forward_backward_request_to_proto(request).SerializeToString()


# --- the wire --------------------------------------------------------------------------------


def test_a_forward_backward_written_by_the_sdk_reads_back_whole():
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3, 4]),
        loss_fn_inputs={
            "target_tokens": np.array([2, 3, 4, 5]),
            "logprobs": np.array([-0.5, -1.0, -1.5, -2.0], dtype=np.float32),
            "advantages": np.array([0.0, 1.0, 1.0, -1.0], dtype=np.float32),
        },
    )
    parsed = wire.forward_backward_read(fb_body("ppo", [datum], model_id="s:train:0", clip_low_threshold=0.9))
    assert (parsed.model_id, parsed.seq_id, parsed.loss_fn, parsed.forward_only) == (
        "s:train:0",
        1,
        "ppo",
        False,
    )
    assert parsed.config == {"clip_low_threshold": 0.9}
    assert parsed.data[0].tokens == [1, 2, 3, 4]
    assert parsed.data[0].inputs["target_tokens"] == [2, 3, 4, 5]
    assert parsed.data[0].inputs["logprobs"] == [-0.5, -1.0, -1.5, -2.0]
    assert parsed.data[0].inputs["advantages"] == [0.0, 1.0, 1.0, -1.0]


def test_the_sdk_reads_our_forward_backward_output_and_samples():
    written = wire.forward_backward_write(
        {"logprobs": [[-1.0, -2.0], [-0.5]], "elementwise_loss": [[0.0, 2.0], [0.5]]}, {"loss:sum": 2.5}, 2
    )
    read = deserialize_forward_backward_output(written)
    assert read.metrics == {"loss:sum": 2.5}
    assert [output["logprobs"].tolist() for output in read.loss_fn_outputs] == [[-1.0, -2.0], [-0.5]]
    assert read.loss_fn_outputs[1]["elementwise_loss"].tolist() == [0.5]
    sampled = deserialize_sample_response(
        wire.sample_write(
            [wire.Sequence([4, 5, 0], [-0.25, -0.5, -0.75], True), wire.Sequence([9], [-1.0], False)],
            [None, -3.0, -4.0],
        )
    )
    assert [(s.tokens, s.stop_reason) for s in sampled.sequences] == [([4, 5, 0], "stop"), ([9], "length")]
    assert sampled.sequences[0].logprobs == [-0.25, -0.5, -0.75]
    assert sampled.prompt_logprobs == [None, -3.0, -4.0]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (fb_body("gspo"), "loss_fn: gspo is not served here yet"),
        (fb_body("dpo_pairs"), "loss_fn: 'dpo_pairs' is not a loss"),
        (
            fb_body("ppo"),  # the default datum has weights but neither logprobs nor advantages
            "data[0].loss_fn_inputs: ppo needs 'logprobs'",
        ),
        (
            fb_body(
                data=[
                    types.Datum(
                        model_input=types.ModelInput.from_ints([5, 6, 7]),
                        loss_fn_inputs={"target_tokens": [6, 7], "weights": [1.0, 1.0]},
                    )
                ]
            ),
            "data[0].loss_fn_inputs.target_tokens: 2 values for 3 input tokens",
        ),
        (
            fb_body(
                data=[
                    types.Datum(
                        model_input=types.ModelInput.from_ints([5, 6]),
                        loss_fn_inputs={"target_tokens": np.array([[6, 0], [7, 0]]), "weights": [1.0, 1.0]},
                    )
                ]
            ),
            "data[0].loss_fn_inputs.target_tokens: a 2-D tensor; this server takes one value per position",
        ),
        (b"\xff\xff not protobuf", "the body is not a ForwardBackwardRequest"),
    ],
)
def test_a_forward_backward_that_cannot_run_is_refused_by_field(body, message):
    with pytest.raises(wire.WireError) as refused:
        wire.forward_backward_read(body)
    assert message in str(refused.value)


# --- the losses --------------------------------------------------------------------------------


def test_each_loss_is_tinkers_sum_over_tokens():
    current = torch.tensor([[-1.0, -2.0]])
    sampled = torch.tensor([[-1.0, -1.0]])
    inputs = {"logprobs": sampled, "advantages": torch.tensor([[2.0, -1.0]])}
    ratio = [1.0, math.exp(-1.0)]
    assert token_losses("cross_entropy", current, {"weights": torch.tensor([[0.0, 1.0]])}, {}).tolist() == [
        [0.0, 2.0]
    ]
    assert token_losses("importance_sampling", current, inputs, {}).tolist()[0] == pytest.approx(
        [-2.0 * ratio[0], ratio[1]]
    )
    # ppo: min(r A, clip(r, 0.8, 1.2) A); the second token's ratio 0.37 clips to 0.8 (A < 0: 0.8 is smaller)
    assert token_losses("ppo", current, inputs, {}).tolist()[0] == pytest.approx([-2.0, 0.8])
    assert token_losses("cispo", current, inputs, {}).tolist()[0] == pytest.approx(
        [-(1.0 * -1.0 * 2.0), -(0.8 * -2.0 * -1.0)]
    )
    assert token_losses("dro", current, inputs, {"beta": 0.5}).tolist()[0] == pytest.approx(
        [-(-1.0 * 2.0), -(-2.0 * -1.0 - 0.25 * 1.0)]
    )
    weighted = inputs | {"weights": torch.tensor([[1.0, 0.0]])}
    assert token_losses("importance_sampling", current, weighted, {}).tolist()[0] == pytest.approx(
        [-2.0, 0.0]
    )


def test_forward_backward_sums_the_loss_and_adds_gradients_until_the_step(tiny_model, tmp_path):
    """On a real model: the answer's log-probs are the model's, `loss:sum` their weighted sum, and a
    second call adds its gradients to the first's (what a batch split in chunks relies on)."""
    from types import SimpleNamespace

    from workers.learners.common import LearnerConfig, learner_create
    from workers.learners.tinker import Served, forward_backward

    config = LearnerConfig(model=str(tiny_model), output_dir=str(tmp_path), adapter="lora", lora_rank=4)
    learner, _ = learner_create(config)
    served = Served(run=SimpleNamespace(pk=0), row=SimpleNamespace(), learner=learner, config=config)
    request = wire.forward_backward_read(fb_body())
    answer = deserialize_forward_backward_output(forward_backward(served, request))
    logprobs = answer.loss_fn_outputs[0]["logprobs"].tolist()
    with torch.no_grad():
        logits = learner.model(input_ids=torch.tensor([[5, 6, 7]])).logits[0].float().log_softmax(-1)
    assert logprobs == pytest.approx([logits[i, t].item() for i, t in enumerate([6, 7, 8])], abs=1e-5)
    assert answer.metrics["loss:sum"] == pytest.approx(-(logprobs[1] + logprobs[2]), rel=1e-5)
    once = [p.grad.clone() for p in learner.model.parameters() if p.grad is not None]
    forward_backward(served, request)
    twice = [p.grad for p in learner.model.parameters() if p.grad is not None]
    assert once and all(torch.allclose(b, 2 * a, atol=1e-6) for a, b in zip(once, twice, strict=True))
    assert served.tokens == 6 and served.weight == 4.0
    forward_only = wire.forward_backward_read(fb_body())
    forward_only.forward_only = True
    forward_backward(served, forward_only)
    assert all(
        torch.equal(a, p.grad)
        for a, p in zip(twice, [p for p in learner.model.parameters() if p.grad is not None], strict=True)
    )


# --- the views ---------------------------------------------------------------------------------


@pytest.fixture
def world(team, settings, client):
    settings.FLYWHEEL_TINKER_POLL_SECONDS = 0
    owner = team[Role.OWNER]
    tier_services.tier_create(project=team["project"], by=owner, name="small", base_model=BASE)
    keys = {}
    for who in (Role.OWNER, Role.LAUNCHER, Role.REVIEWER, Role.VIEWER, "outsider"):
        _, raw = project_services.api_token_create(user=team[who], name="tinker")
        keys[who] = f"tml-{raw}"
    return team | {"keys": keys}


def call(client, key: str | None, path: str, body: dict | bytes | None = None, **headers):
    extra = {"HTTP_X_API_KEY": key} if key else {}
    extra |= {f"HTTP_{name.upper().replace('-', '_')}": value for name, value in headers.items()}
    url = f"/tinker/api/v1/{path}"
    if body is None:
        return client.get(url, **extra)
    if isinstance(body, bytes):
        return client.post(url, body, content_type=wire.PROTO_CONTENT_TYPE, **extra)
    return client.post(url, json.dumps(body), content_type="application/json", **extra)


def session_of(client, world, who=Role.OWNER) -> str:
    answer = call(
        client,
        world["keys"][who],
        "create_session",
        {"tags": [], "sdk_version": "0.38.0", "user_metadata": None, "project_id": str(world["project"].pk)},
    )
    assert answer.status_code == 200, answer.content
    return answer.json()["session_id"]


def model_of(client, world, session: str, **headers) -> dict:
    body = {"session_id": session, "model_seq_id": 0, "base_model": BASE, "lora_config": {"rank": 4}}
    answer = call(client, world["keys"][Role.OWNER], "create_model", body, **headers)
    assert answer.status_code == 200, answer.content
    return answer.json()


def test_the_client_config_keeps_forward_backward_chunks_under_the_body_limit(client, world, settings):
    settings.FLYWHEEL_MAX_BODY_MB = 2
    config = call(client, world["keys"][Role.VIEWER], "client/config", {"sdk_version": "0.38.0"}).json()
    assert config["fwdbwd_max_chunk_bytes_count"] == 1024 * 1024
    assert (config["parallel_fwdbwd_chunks"], config["use_pyqwest_transport"]) == (False, False)


def test_a_session_acts_in_the_named_project_and_needs_a_key(client, world):
    assert call(client, None, "create_session", {}).status_code == 401
    refused = call(client, "tml-not-a-token", "create_session", {})
    assert refused.status_code == 401 and refused["x-should-retry"] == "false"
    key = session_of(client, world)
    session = TinkerSession.objects.get(key=key)
    assert (session.project, session.created_by, session.sdk_version) == (
        world["project"],
        world[Role.OWNER],
        "0.38.0",
    )
    # The outsider belongs to another project only: naming ours is refused, as if it did not exist.
    other = call(
        client, world["keys"]["outsider"], "create_session", {"project_id": str(world["project"].pk)}
    )
    assert other.status_code == 400
    assert other.json()["detail"].startswith(
        f"project_id (ServiceClient(project_id=...) or TINKER_PROJECT_ID): no project '{world['project'].pk}'"
    )


@pytest.mark.parametrize(
    ("who", "status"),
    [(Role.OWNER, 200), (Role.LAUNCHER, 200), (Role.REVIEWER, 403), (Role.VIEWER, 403), ("outsider", 404)],
)
def test_only_editors_drive_a_session_and_outsiders_do_not_see_it(client, world, who, status):
    session = session_of(client, world)
    body = {"session_id": session, "model_seq_id": 1, "base_model": "small", "lora_config": {"rank": 4}}
    answer = call(client, world["keys"][who], "create_model", body)
    assert answer.status_code == status, answer.content
    assert TinkerModel.objects.count() == (1 if status == 200 else 0)
    heartbeat = call(client, world["keys"][who], "session_heartbeat", {"session_id": session})
    assert heartbeat.status_code == status


def test_a_model_is_a_queued_run_of_method_tinker_with_the_clients_lora(client, world):
    session = session_of(client, world)
    future = model_of(client, world, session)
    model = TinkerModel.objects.select_related("run").get()
    assert future["model_id"] == model.model_id == f"{session}:train:0"
    run = model.run
    assert (run.method, run.status, run.tier.name) == ("tinker", Run.Status.QUEUED, "small")
    assert run.resolved["adapter"] == "lora" and run.resolved["lora_rank"] == 4
    assert run.resolved["lora_target_modules"] == "attention,mlp,unembed"
    assert run.task_set_version.item_count == 0  # filed under the project's Tinker stand-ins
    # Waiting behind its project's quota shows in the poll, as Tinker's queue state.
    answer = call(client, world["keys"][Role.OWNER], "retrieve_future", {"request_id": future["request_id"]})
    assert answer.json() == {
        "type": "try_again",
        "request_id": future["request_id"],
        "queue_state": "paused_capacity",
        "queue_state_reason": "the model's run waits for its project's run quota",
    }
    unknown = call(
        client,
        world["keys"][Role.OWNER],
        "create_model",
        {"session_id": session, "model_seq_id": 2, "base_model": "acme/other"},
    )
    assert unknown.status_code == 400
    assert unknown.json()["detail"].startswith("base_model: no tier of project")
    assert "acme/tiny, small" in unknown.json()["detail"]


def test_a_retried_post_finds_its_first_request(client, world):
    session = session_of(client, world)
    first = model_of(client, world, session, **{"X-Idempotency-Key": "retry-1"})
    again = model_of(client, world, session, **{"X-Idempotency-Key": "retry-1"})
    assert first == again and TinkerModel.objects.count() == 1 and Run.objects.count() == 1
    model_id = first["model_id"]
    sent = [
        call(
            client,
            world["keys"][Role.OWNER],
            "forward_backward",
            fb_body(model_id=model_id),
            **{"X-Idempotency-Key": "fb-1"},
        ).json()
        for _ in range(2)
    ]
    assert sent[0] == sent[1]
    assert TinkerRequest.objects.filter(kind=TinkerRequest.Kind.FORWARD_BACKWARD).count() == 1


def test_bad_work_is_refused_before_it_is_queued(client, world):
    session = session_of(client, world)
    model_id = model_of(client, world, session)["model_id"]
    key = world["keys"][Role.OWNER]
    bad_loss = call(client, key, "forward_backward", fb_body("custom", model_id=model_id))
    assert bad_loss.status_code == 400 and bad_loss["x-should-retry"] == "false"
    assert bad_loss.json()["detail"].startswith("loss_fn: custom losses run in your process")
    no_adam = call(client, key, "optim_step", {"model_id": model_id, "adam_params": {"learning_rate": -1}})
    assert no_adam.json()["detail"] == "adam_params.learning_rate: must be a number, 0 or more"
    bad_name = call(client, key, "save_weights", {"model_id": model_id, "path": "../up"})
    assert bad_name.status_code == 400 and bad_name.json()["detail"].startswith("path: '../up'")
    missing = call(
        client,
        key,
        "load_weights",
        {"model_id": model_id, "path": "tinker://nope/weights/x", "optimizer": True},
    )
    assert missing.status_code == 404
    assert TinkerRequest.objects.exclude(kind=TinkerRequest.Kind.CREATE_MODEL).count() == 0


def test_a_poll_answers_a_result_or_a_failure_in_the_sdks_shapes(client, world):
    session = session_of(client, world)
    future = model_of(client, world, session)
    request = TinkerRequest.objects.get(key=future["request_id"])
    tinker_services.request_done(request=request, result=b'{"model_id": "x", "type": "create_model"}')
    done = call(client, world["keys"][Role.VIEWER], "retrieve_future", {"request_id": request.key})
    assert done.json() == {"model_id": "x", "type": "create_model"}
    tinker_services.request_failed(request=request, error="no room", user_error=False)
    failed = call(client, world["keys"][Role.OWNER], "retrieve_future", {"request_id": request.key})
    assert failed.json() == {"error": "no room", "category": "server"}
    outsider = call(client, world["keys"]["outsider"], "retrieve_future", {"request_id": request.key})
    assert outsider.status_code == 404


def test_a_finished_or_silent_session_ends_its_work(client, world, settings):
    session = session_of(client, world)
    future = model_of(client, world, session)
    assert (
        call(
            client, world["keys"][Role.OWNER], f"sessions/{session}/finish", {"reason": {"type": "success"}}
        ).status_code
        == 200
    )
    request = TinkerRequest.objects.get(key=future["request_id"])
    assert (request.status, request.error) == ("failed", "the session finished before this request ran")
    assert TinkerModel.objects.get().run.status == Run.Status.CANCELLED  # it never started
    refused = call(client, world["keys"][Role.OWNER], "session_heartbeat", {"session_id": session})
    assert refused.status_code == 400 and "finished" in refused.json()["detail"]
    silent, other = session_of(client, world), session_of(client, world)
    TinkerSession.objects.filter(key__in=[silent, other]).update(heartbeat_at="2020-01-01T00:00:00Z")
    assert tinker_services.sessions_expire(only=TinkerSession.objects.get(key=silent)) == 1
    assert TinkerSession.objects.get(key=other).status == TinkerSession.Status.ACTIVE
    assert tinker_services.sessions_expire() == 1
    assert TinkerSession.objects.get(key=silent).status == TinkerSession.Status.EXPIRED


def test_a_tinker_run_cannot_be_launched_or_cloned_by_hand(client, world):
    session = session_of(client, world)
    model_of(client, world, session)
    run = TinkerModel.objects.get().run
    with pytest.raises(ValidationError) as refused:
        lifecycle.run_clone(run=run, by=world[Role.OWNER])
    assert refused.value.message_dict == {
        "method": ["a run of Your own loop (Tinker API) starts from its own API, not as a copy or a fork"]
    }
    assert "tinker" not in [name for name, _ in launch_choices()]
    assert "tinker" in [name for name, _ in algorithm_choices()]


def test_a_tinker_run_shows_on_the_run_page_and_in_the_runs_table(client, world):
    session = session_of(client, world)
    model_of(client, world, session)
    run = TinkerModel.objects.get().run
    for index in range(3):  # samples of this run's policy, as the rollout workers record them
        Trace.objects.create(
            project=world["project"], external_id=f"s{index}", prompt="p", model=f"run-{run.pk}"
        )
    Trace.objects.create(project=world["project"], external_id="other", prompt="p", model="run-0")
    client.force_login(world[Role.VIEWER])
    page = client.get(reverse("run-detail", kwargs={"run_id": run.pk}))
    assert page.status_code == 200
    html = page.content.decode()
    assert "Your own loop (Tinker API)" in html
    assert 'id="run-tinker"' in html and f"<code>{session}:train:0</code>" in html
    samples = (
        f'href="{reverse("trace-list", args=[world["project"].pk])}?model=run-{run.pk}">3 recorded as traces'
    )
    assert samples in html
    table = client.get(reverse("run-list"))
    assert table.status_code == 200 and run.name in table.content.decode()


def test_an_adapter_on_the_tied_output_head_swaps_into_a_resident_base(tiny_model, tmp_path):
    """Tinker trains the unembedding by default; peft would save the tied head's frozen base weight
    with the adapter, which its hot swap refuses: a rollout worker could sample one version only."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from inference.adapters import LoraSettings, adapter_activate, lora_wrap, model_save

    trained = lora_wrap(
        AutoModelForCausalLM.from_pretrained(tiny_model),
        LoraSettings(rank=4, alpha=32.0, target_modules="attention,mlp,unembed"),
    )
    model_save(trained, tmp_path / "v1")
    with torch.no_grad():
        for parameter in trained.parameters():
            if parameter.requires_grad:
                parameter.add_(0.01)
    model_save(trained, tmp_path / "v2")
    with safe_open(str(tmp_path / "v1" / "adapter_model.safetensors"), "pt") as saved:
        assert [key for key in saved.keys() if "lm_head" in key] == [
            "base_model.model.lm_head.lora_A.weight",
            "base_model.model.lm_head.lora_B.weight",
        ]
    served = adapter_activate(AutoModelForCausalLM.from_pretrained(tiny_model), tmp_path / "v1")
    served = adapter_activate(served, tmp_path / "v2")  # the second version: swapped in place
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert torch.allclose(served(input_ids=ids).logits, trained(input_ids=ids).logits, atol=1e-5)


def test_a_request_a_dead_learner_was_running_fails_as_the_servers_fault(client, world):
    session = session_of(client, world)
    future = model_of(client, world, session)
    model = TinkerModel.objects.get()
    taken = tinker_services.request_take(model=model)
    assert taken is not None and taken.key == future["request_id"]
    assert tinker_services.requests_interrupted(model=model, step=3) == 1
    answer = call(client, world["keys"][Role.OWNER], "retrieve_future", {"request_id": future["request_id"]})
    assert answer.json()["category"] == "server"
    assert answer.json()["error"].startswith("the model's learner restarted from its checkpoint at step 3")
    assert tinker_services.requests_interrupted(model=model, step=3) == 0  # only what was running


def test_pending_samples_of_a_session_decode_as_one_batch_each_answered_as_if_alone(
    client, world, tiny_model, monkeypatch
):
    tier_services.tier_create(
        project=world["project"], by=world[Role.OWNER], name="tiny", base_model=str(tiny_model)
    )
    session = TinkerSession.objects.get(key=session_of(client, world))
    sampler = tinker_services.sampler_create(
        session=session, user=world[Role.OWNER], body={"base_model": str(tiny_model)}
    )

    def body(tokens: list[int], count: int = 2, **params) -> dict:
        params = {"max_tokens": 6, "temperature": 0.0} | params
        return {
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": tokens}]},
            "num_samples": count,
            "sampling_params": params,
        }

    bodies = [
        body([5, 6, 7]),
        body([8, 9], count=3),
        body([10, 11, 12, 13]),
        body([5, 6], seed=4, temperature=1.0),
        body([99999]),
    ]
    requests = [tinker_services.sample_submit(sampler=sampler, body=json.dumps(b).encode()) for b in bodies]
    decoded: list[int] = []
    real_decode = tinker_sampling.decode
    monkeypatch.setattr(
        tinker_sampling,
        "decode",
        lambda tier, prompts, *a, **k: decoded.append(len(prompts)) or real_decode(tier, prompts, *a, **k),
    )

    tinker_sampling.sample_run(requests[0].pk)

    statuses = [TinkerRequest.objects.get(pk=r.pk) for r in requests]
    assert [r.status for r in statuses] == ["done"] * 4 + ["failed"]
    assert "prompt: token ids" in statuses[4].error
    assert decoded == [2 + 3 + 2, 2]  # the greedy ones together, the seeded one alone
    tier = tinker_sampling.sampler_weights(sampler)
    for request, sent in zip(statuses[:4], bodies[:4], strict=True):
        answer = deserialize_sample_response(bytes(request.result))
        alone = deserialize_sample_response(tinker_sampling.sample(tier, sent))
        assert len(answer.sequences) == sent["num_samples"]
        assert [s.tokens for s in answer.sequences] == [s.tokens for s in alone.sequences]
        for batched, single in zip(answer.sequences, alone.sequences, strict=True):
            assert batched.logprobs == pytest.approx(single.logprobs, abs=1e-4)
    # A redelivered task finds its request taken and does nothing.
    decoded.clear()
    tinker_sampling.sample_run(requests[1].pk)
    assert decoded == []

    # Every sample is a trace of the project, for reviewers: its prompt and completion as text.
    traces = Trace.objects.filter(project=world["project"], metadata__source="tinker").order_by("pk")
    assert traces.count() == 2 + 3 + 2 + 2
    first = traces.get(external_id=f"tinker-{requests[1].key}-2")
    sequence = deserialize_sample_response(bytes(statuses[1].result)).sequences[2]
    assert first.prompt == tier.tokenizer.decode([8, 9], skip_special_tokens=True)
    assert first.completion == tier.tokenizer.decode(sequence.tokens, skip_special_tokens=True)
    assert (first.model, first.tier.name) == (str(tiny_model), "tiny")
    assert first.metadata["request"] == requests[1].key
    assert first.metadata["completion_tokens"] == len(sequence.tokens)


def test_the_callers_training_runs_sessions_and_checkpoints_list_newest_first_in_pages(client, world):
    owner, viewer = world["keys"][Role.OWNER], world["keys"][Role.VIEWER]
    first_session, second_session = session_of(client, world), session_of(client, world)
    first = model_of(client, world, first_session)["model_id"]
    second = model_of(client, world, second_session)["model_id"]
    model = TinkerModel.objects.get(model_id=first)
    TinkerWeights.objects.create(model=model, kind=TinkerWeights.Kind.STATE, name="a", step=1)
    TinkerWeights.objects.create(model=model, kind=TinkerWeights.Kind.SAMPLER, name="b", step=2)

    runs = call(client, owner, "training_runs?limit=1").json()
    assert [r["training_run_id"] for r in runs["training_runs"]] == [second]
    assert runs["cursor"] == {"offset": 0, "limit": 1, "total_count": 2}
    later = call(client, owner, "training_runs?limit=1&offset=1").json()
    assert [(r["training_run_id"], r["lora_rank"]) for r in later["training_runs"]] == [(first, 4)]
    # Another member opened none of them; with access_scope=accessible they see the project's.
    assert call(client, viewer, "training_runs").json()["cursor"]["total_count"] == 0
    assert call(client, viewer, "training_runs?access_scope=accessible").json()["cursor"]["total_count"] == 2
    assert (
        call(client, world["keys"]["outsider"], "training_runs?access_scope=accessible").json()[
            "training_runs"
        ]
        == []
    )
    other = call(client, owner, f"training_runs?project_id={world['project'].pk + 1000}").json()
    assert other["training_runs"] == []
    refused = call(client, owner, "training_runs?limit=0")
    assert (refused.status_code, refused.headers["x-should-retry"]) == (400, "false")
    assert "limit" in refused.json()["detail"]

    assert call(client, owner, "sessions").json() == {"sessions": [second_session, first_session]}
    assert call(client, viewer, "sessions?access_scope=accessible&limit=1").json() == {
        "sessions": [second_session]
    }
    listed = call(client, owner, "checkpoints").json()
    assert [c["checkpoint_id"] for c in listed["checkpoints"]] == ["sampler_weights/b", "weights/a"]
    assert listed["cursor"]["total_count"] == 2
    assert call(client, viewer, "checkpoints").json()["checkpoints"] == []


def test_weights_info_says_what_loading_saved_weights_needs(client, world):
    model_id = model_of(client, world, session_of(client, world))["model_id"]
    TinkerWeights.objects.create(
        model=TinkerModel.objects.get(model_id=model_id), kind="weights", name="s", step=3
    )
    path = f"tinker://{model_id}/weights/s"
    info = call(client, world["keys"][Role.VIEWER], "weights_info", {"tinker_path": path})
    assert info.json() == {
        "base_model": BASE,
        "is_lora": True,
        "lora_rank": 4,
        "train_unembed": True,  # the SDK's defaults, as the model was made
        "train_mlp": True,
        "train_attn": True,
    }
    missing = call(client, world["keys"]["outsider"], "weights_info", {"tinker_path": path})
    assert missing.status_code == 404 and "tinker_path" in missing.json()["detail"]


def test_a_cancelled_sample_is_not_decoded_and_its_poll_says_why(client, world):
    session = TinkerSession.objects.get(key=session_of(client, world))
    sampler = tinker_services.sampler_create(
        session=session, user=world[Role.OWNER], body={"base_model": BASE}
    )
    pending = tinker_services.sample_submit(sampler=sampler, body=b"{}")
    done = tinker_services.sample_submit(sampler=sampler, body=b"{}")
    tinker_services.request_done(request=done, result=b"x", proto=True)
    viewer = call(client, world["keys"][Role.VIEWER], "cancel_future", {"request_id": pending.key})
    assert viewer.status_code == 403
    for request in (pending, done):
        answer = call(client, world["keys"][Role.OWNER], "cancel_future", {"request_id": request.key})
        assert answer.status_code == 200
    assert TinkerRequest.objects.get(pk=done.pk).status == "done"  # a finished one stays finished
    polled = call(client, world["keys"][Role.OWNER], "retrieve_future", {"request_id": pending.key})
    assert polled.json() == {"error": "cancelled by the client", "category": "user"}
    assert tinker_services.samples_take(request_id=pending.pk, limit=8) == []  # no worker takes it


def test_a_pause_waits_for_the_open_steps_optim_step_so_no_gradient_is_lost(
    client, world, tiny_model, tmp_path
):
    from runs.models import RunEvent
    from workers.learners.common import LearnerConfig, learner_create
    from workers.learners.tinker import Served, _ended

    model_of(client, world, session_of(client, world))
    row = TinkerModel.objects.select_related("run", "session").get()
    config = LearnerConfig(model=str(tiny_model), output_dir=str(tmp_path), adapter="lora", lora_rank=4)
    learner, _ = learner_create(config)
    served = Served(run=row.run, row=row, learner=learner, config=config, passes={"cross_entropy": 2})
    Run.objects.filter(pk=row.run_id).update(status=Run.Status.PAUSING)

    assert _ended(served) is False and _ended(served) is False  # the step is open: it goes on serving
    waits = RunEvent.objects.filter(run=row.run, kind="pause")
    assert [e.message for e in waits] == [
        "the pause waits for the open step's optim_step (2 forward_backward pass(es) gathered since step 0): "
        "a checkpoint would not hold their gradients"
    ]
    assert Run.objects.get(pk=row.run_id).status == Run.Status.PAUSING
    served.passes.clear()  # its optim_step ran
    assert _ended(served) is True
    assert Run.objects.get(pk=row.run_id).status == Run.Status.PAUSED
    assert row.run.checkpoints.filter(step=0).exists()


def test_a_finished_request_wakes_its_held_poll_and_queued_work_its_learner():
    import asyncio
    import time

    from tinker_api import notify

    key, model = f"k-{time.time_ns()}", time.time_ns() % 2**31  # of no other test's on this Redis
    notify.request_finished(key)  # pushed before anyone waits: kept for the waiter
    started = time.monotonic()
    asyncio.run(notify.finished_wait(key, 1.0))
    assert time.monotonic() - started < 0.5  # woken, not timed out
    started = time.monotonic()
    asyncio.run(notify.finished_wait(key, 0.2))  # the wake-up was used: this one times out
    assert time.monotonic() - started >= 0.2
    asyncio.run(notify.finished_wait(key, 0.0))  # no wait at all (BLPOP's 0 would block for ever)

    notify.work_queued(model)
    started = time.monotonic()
    notify.work_wait(model, 1.0)
    assert time.monotonic() - started < 0.5
    assert notify._client().exists(notify.work_key(model), notify.done_key(key)) == 0


def test_published_weights_are_found_by_anyone_and_an_expired_name_by_nobody(client, world):
    from datetime import timedelta

    from django.utils import timezone

    model_id = model_of(client, world, session_of(client, world))["model_id"]
    weights = TinkerWeights.objects.create(
        model=TinkerModel.objects.get(model_id=model_id), kind="weights", name="w", step=1
    )
    path, route = f"tinker://{model_id}/weights/w", f"training_runs/{model_id}/checkpoints/weights/w"
    outsider = world["keys"]["outsider"]
    assert call(client, outsider, "weights_info", {"tinker_path": path}).status_code == 404

    for who, status in ((Role.VIEWER, 403), (Role.LAUNCHER, 403), (Role.OWNER, 200)):
        answer = client.post(f"/tinker/api/v1/{route}/publish", HTTP_X_API_KEY=world["keys"][who])
        assert answer.status_code == status, (who, answer.content)
    launcher = client.post(f"/tinker/api/v1/{route}/publish", HTTP_X_API_KEY=world["keys"][Role.LAUNCHER])
    assert "only the training run's owner" in launcher.json()["detail"]
    assert call(client, outsider, "weights_info", {"tinker_path": path}).json()["base_model"] == BASE
    assert call(client, world["keys"][Role.OWNER], f"training_runs/{model_id}/checkpoints").json()[
        "checkpoints"
    ][0]["public"]
    client.delete(f"/tinker/api/v1/{route}/publish", HTTP_X_API_KEY=world["keys"][Role.OWNER])
    assert call(client, outsider, "weights_info", {"tinker_path": path}).status_code == 404

    def ttl(value) -> int:
        return client.put(
            f"/tinker/api/v1/{route}/ttl",
            json.dumps({"ttl_seconds": value}),
            content_type="application/json",
            HTTP_X_API_KEY=world["keys"][Role.OWNER],
        ).status_code

    assert (ttl("soon"), ttl(0)) == (400, 400)
    assert ttl(3600) == 200
    weights.refresh_from_db()
    assert timedelta(minutes=59) < weights.expires_at - timezone.now() <= timedelta(hours=1)
    assert ttl(None) == 200 and TinkerWeights.objects.get(pk=weights.pk).expires_at is None
    TinkerWeights.objects.filter(pk=weights.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    owner = world["keys"][Role.OWNER]
    assert call(client, owner, f"training_runs/{model_id}/checkpoints").json()["checkpoints"] == []
    assert call(client, owner, "weights_info", {"tinker_path": path}).status_code == 404

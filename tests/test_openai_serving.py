"""The OpenAI-compatible endpoint (/v1/): the official `openai` client against a real web server
process for completions, chat and streaming with log-probs; in-process checks of the contract's
details, roles and OpenAI's error shape."""

import json
import math
import shutil

import pytest
from django.test import Client

from core.roles import Role
from inference.decoding import decode, tier_prepare
from inference.policy import policy_load
from inference.settings import TierSettings
from projects import services as project_services
from runs.run_store import policy_dir
from tests.conftest import make_user
from tests.run_harness import tiny_model, wait_until, worker_env  # noqa: F401  (a fixture)
from tests.serving_fixtures import STEP, publish_trained, trained  # noqa: F401  (a fixture)
from tests.web_server import WebServer
from tiers import services as tier_services

PROMPT = "add 3 to x"
# In process (WSGI) the test client reads the async body synchronously, and Django says so.
pytestmark = pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume asynchronous iterators")


def bearer(user) -> Client:
    _, raw = project_services.api_token_create(user=user, name="openai")
    return Client(headers={"Authorization": f"Bearer {raw}"})


def greedy(source, config: dict, prompts: list[str], **changes) -> list:
    settings = TierSettings.from_config(config).with_(temperature=0.0, **changes)
    return decode(tier_prepare(policy_load(source), settings), prompts, settings)


def post(client: Client, path: str, body: dict):
    return client.post(path, json.dumps(body), content_type="application/json")


def answer(response) -> dict:
    """A whole answer's JSON: sent as a one-chunk stream, generated after the view returned."""
    assert response.streaming and response["Content-Type"] == "application/json"
    return json.loads(b"".join(response))


# --- in process --------------------------------------------------------------------------------


def test_models_lists_the_callers_tiers_and_checkpoints_only(trained):  # noqa: F811
    run, tier = trained["run"], trained["tier"]
    response = bearer(trained["owner"]).get("/v1/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [f"tier-{tier.pk}", f"run-{run.pk}-step-{STEP}"]
    assert body["data"][1]["flywheel"] == {
        "name": f"Adder GRPO @ step {STEP}",
        "kind": "checkpoint",
        "project": trained["project"].pk,
    }
    assert body["data"][0]["owned_by"] == trained["project"].name
    assert bearer(make_user("nobody")).get("/v1/models").json() == {"object": "list", "data": []}


def test_a_completion_is_the_tiers_decoding_of_the_raw_prompt(trained):  # noqa: F811
    run = trained["run"]
    client = bearer(trained["owner"])
    model = f"run-{run.pk}-step-{STEP}"
    response = post(client, "/v1/completions", {"model": model, "prompt": PROMPT, "temperature": 0})
    assert response.status_code == 200
    body = answer(response)
    (expected,) = greedy(policy_dir(run.pk, STEP), run.tier_config, [PROMPT])
    assert body["object"] == "text_completion" and body["model"] == model
    assert body["id"].startswith("cmpl-")
    assert body["choices"] == [
        {"index": 0, "text": expected.text, "logprobs": None, "finish_reason": expected.finish_reason}
    ]
    assert body["usage"] == {
        "prompt_tokens": len(expected.prompt_token_ids),
        "completion_tokens": len(expected.token_ids),
        "total_tokens": len(expected.prompt_token_ids) + len(expected.token_ids),
    }


def test_chat_renders_the_template_and_reports_logprobs_with_top_alternatives(trained):  # noqa: F811
    tier = trained["tier"]
    client = bearer(trained["owner"])
    body = {
        "model": f"tier-{tier.pk}",
        "messages": [{"role": "user", "content": PROMPT}],
        "temperature": 0,
        "max_tokens": 6,
        "logprobs": True,
        "top_logprobs": 3,
    }
    response = post(client, "/v1/chat/completions", body)
    assert response.status_code == 200
    choice = answer(response)["choices"][0]
    policy = policy_load(trained["model"])
    (expected,) = greedy(trained["model"], {"base_model": tier.base_model}, [policy.prompt_text(PROMPT)])
    expected_text = expected.text[: len(choice["message"]["content"])]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == expected_text
    entries = choice["logprobs"]["content"]
    assert [entry["token"] for entry in entries] == [
        policy.tokenizer.decode([token]) for token in expected.token_ids[: len(entries)]
    ]
    for entry, logprob in zip(entries, expected.logprobs, strict=False):
        assert math.isclose(entry["logprob"], logprob, abs_tol=1e-4)
        assert len(entry["top_logprobs"]) == 3
        # Greedy: the chosen token is the most likely one.
        assert math.isclose(entry["top_logprobs"][0]["logprob"], entry["logprob"], abs_tol=1e-4)
        assert entry["bytes"] == list(entry["token"].encode())


def test_request_values_override_the_tiers_decoding_and_stops_cut_the_text(trained):  # noqa: F811
    run = trained["run"]
    client = bearer(trained["owner"])
    model = f"run-{run.pk}-step-{STEP}"
    (free,) = greedy(policy_dir(run.pk, STEP), run.tier_config, [PROMPT], max_new_tokens=12)
    stop = free.text[3:5]
    assert stop and stop not in free.text[:3]
    body = {"model": model, "prompt": PROMPT, "temperature": 0, "max_tokens": 12, "stop": stop, "logprobs": 2}
    choice = answer(post(client, "/v1/completions", body))["choices"][0]
    assert choice["text"] == free.text[: free.text.index(stop)]
    assert choice["finish_reason"] == "stop"
    logprobs = choice["logprobs"]
    assert "".join(logprobs["tokens"]).startswith(choice["text"])
    assert logprobs["text_offset"][0] == 0
    assert all(len(top) <= 2 for top in logprobs["top_logprobs"])
    two = post(
        client, "/v1/completions", {"model": model, "prompt": [PROMPT, "x plus 3"], "n": 2, "max_tokens": 3}
    )
    assert [c["index"] for c in answer(two)["choices"]] == [0, 1, 2, 3]


def test_a_speculative_tier_serves_the_same_greedy_tokens_and_logprobs(trained):  # noqa: F811
    fast = tier_services.tier_create(
        project=trained["project"],
        by=trained["owner"],
        name="lookup",
        base_model=trained["tier"].base_model,
        speculation="prompt_lookup",
        speculative_tokens=3,
        max_new_tokens=12,
    )
    body = {"model": f"tier-{fast.pk}", "prompt": "x plus 3 x plus 3 x plus", "temperature": 0, "logprobs": 1}
    choice = answer(post(bearer(trained["owner"]), "/v1/completions", body))["choices"][0]
    (plain,) = greedy(trained["model"], {"base_model": fast.base_model}, [body["prompt"]], max_new_tokens=12)
    assert choice["text"] == plain.text
    kept = len(choice["logprobs"]["token_logprobs"])
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(plain.logprobs[:kept], abs=1e-4)


def test_errors_are_openais_error_object(trained):  # noqa: F811
    run = trained["run"]
    owner = bearer(trained["owner"])
    model = f"run-{run.pk}-step-{STEP}"
    missing = post(Client(), "/v1/completions", {"model": model, "prompt": "x"})
    assert missing.status_code == 401
    assert missing.json()["error"]["type"] == "authentication_error"
    assert missing.json()["error"]["code"] == "invalid_api_key"
    wrong = post(Client(headers={"Authorization": "Bearer fw_nope"}), "/v1/completions", {"model": model})
    assert wrong.status_code == 401
    bad = post(owner, "/v1/completions", {"model": model, "prompt": "x", "temperature": 9})
    assert bad.status_code == 400
    assert bad.json() == {
        "error": {
            "message": "temperature must be between 0 and 2; got 9",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": "invalid_value",
        }
    }
    unknown = post(owner, "/v1/completions", {"model": "tier-999999", "prompt": "x"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"
    assert owner.get("/v1/completions").status_code == 405
    assert owner.get("/v1/nothing-here").json()["error"]["code"] == "not_found"
    not_json = owner.post("/v1/chat/completions", "{", content_type="application/json")
    assert not_json.status_code == 400 and not_json.json()["error"]["code"] == "invalid_json"
    last = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    not_ending_with_user = post(owner, "/v1/chat/completions", {"model": model, "messages": last})
    assert not_ending_with_user.json()["error"]["param"] == "messages"
    too_long = post(owner, "/v1/completions", {"model": model, "prompt": "x " * 5000})
    assert too_long.status_code == 400
    assert too_long.json()["error"]["code"] == "context_length_exceeded"


def test_a_project_outsider_cannot_see_or_use_its_models_and_a_viewer_can(trained):  # noqa: F811
    run = trained["run"]
    model = f"run-{run.pk}-step-{STEP}"
    outsider = post(bearer(make_user("outsider-oa")), "/v1/completions", {"model": model, "prompt": "x"})
    assert outsider.status_code == 404
    assert outsider.json()["error"]["message"] == (
        f"The model `{model}` does not exist or you do not have access to it."
    )
    viewer = make_user("viewer-oa")
    project_services.member_add(project=trained["project"], username=viewer.username, role=Role.VIEWER)
    response = post(bearer(viewer), "/v1/completions", {"model": model, "prompt": "x", "max_tokens": 2})
    assert response.status_code == 200


def test_the_endpoint_shares_the_apis_rate_per_user(trained, monkeypatch):  # noqa: F811
    from django.core.cache import cache

    from core.throttling import RedisRateThrottle

    monkeypatch.setattr(RedisRateThrottle, "THROTTLE_RATES", {"user": "2/hour"})
    hasty = make_user("hasty")
    # The budget lives in Redis, which outlives the test database (and its reused user ids).
    cache.delete(RedisRateThrottle.budget_key(hasty.pk, "2/hour"))
    client = bearer(hasty)
    assert [client.get("/v1/models").status_code for _ in range(2)] == [200, 200]
    refused = client.get("/v1/models")
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert 1790 < int(refused["Retry-After"]) <= 1800  # GCRA: one request per half hour after the burst


def test_a_signed_in_browser_needs_the_csrf_token(trained):  # noqa: F811
    client = Client(enforce_csrf_checks=True)
    client.force_login(trained["owner"])
    body = {"model": f"tier-{trained['tier'].pk}", "prompt": "x", "max_tokens": 2}
    refused = post(client, "/v1/completions", body)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "csrf_failed"
    assert client.get("/v1/models").status_code == 200


# --- the official client against a real server ------------------------------------------------


@pytest.fixture
def served(transactional_db, tiny_model, tmp_path):  # noqa: F811
    """The trained run, and the stack's web server on the test database."""
    from tests.serving_fixtures import trained_setup

    setup = trained_setup(tiny_model)
    _, token = project_services.api_token_create(user=setup["owner"], name="openai")
    with WebServer(worker_env(), tmp_path / "web.log") as server:
        yield setup | {"url": f"{server.url}/v1", "token": token}


def test_the_official_openai_client_completes_chats_and_streams_with_logprobs(served):
    openai = pytest.importorskip("openai")
    run = served["run"]
    client = openai.OpenAI(base_url=served["url"], api_key=served["token"], max_retries=0)
    model = f"run-{run.pk}-step-{STEP}"
    assert [m.id for m in client.models.list()] == [f"tier-{served['tier'].pk}", model]
    source = policy_dir(run.pk, STEP)
    (plain,) = greedy(source, run.tier_config, [PROMPT])

    completion = client.completions.create(model=model, prompt=PROMPT, temperature=0, logprobs=2)
    assert completion.choices[0].text == plain.text
    assert completion.choices[0].finish_reason == plain.finish_reason
    assert len(completion.choices[0].logprobs.token_logprobs) == len(completion.choices[0].logprobs.tokens)
    assert completion.usage.completion_tokens == len(plain.token_ids)

    streamed = client.completions.create(model=model, prompt=PROMPT, temperature=0, logprobs=1, stream=True)
    pieces = list(streamed)
    assert "".join(p.choices[0].text for p in pieces) == plain.text
    assert pieces[-1].choices[0].finish_reason == plain.finish_reason
    tokens = [t for p in pieces if p.choices[0].logprobs for t in p.choices[0].logprobs.token_logprobs]
    assert tokens == pytest.approx(completion.choices[0].logprobs.token_logprobs, abs=1e-4)

    policy = policy_load(source)
    (chat_plain,) = greedy(source, run.tier_config, [policy.prompt_text(PROMPT)])
    messages = [{"role": "user", "content": PROMPT}]
    chat = client.chat.completions.create(
        model=model, messages=messages, temperature=0, logprobs=True, top_logprobs=2
    )
    assert chat.choices[0].message.content == chat_plain.text
    assert [e.logprob for e in chat.choices[0].logprobs.content] == pytest.approx(
        chat_plain.logprobs[: len(chat.choices[0].logprobs.content)], abs=1e-4
    )

    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat_plain.text
    streamed_logprobs = [
        e.logprob
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert streamed_logprobs == pytest.approx([e.logprob for e in chat.choices[0].logprobs.content], abs=1e-4)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(chat_plain.token_ids)

    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="tier-999999", prompt="x")
    assert missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=served["url"], api_key="fw_wrong", max_retries=0).models.list()


def test_the_model_cache_keeps_a_model_and_reloads_a_republished_version(trained):  # noqa: F811
    from inference.serving import ModelCache

    run = trained["run"]
    settings = TierSettings.from_config(run.tier_config)
    cache = ModelCache(capacity=1)
    source = policy_dir(run.pk, STEP)
    first = cache.get(source, settings)
    assert cache.get(source, settings) is first
    assert cache.get(source, settings.with_(temperature=0.5, max_new_tokens=3)) is first  # decoding only
    shutil.rmtree(source)  # a resume rolled the version back; the learner publishes it again
    publish_trained(run, trained["model"], step=STEP, metrics=False)
    again = cache.get(source, settings)
    assert again is not first
    cache.get(trained["model"], settings)  # a second model pushes the least recently used out
    assert [key[0] for key in cache.models] == [str(trained["model"])]


def test_requests_waiting_for_a_model_are_decoded_together_each_getting_its_own_rows(trained, monkeypatch):  # noqa: F811
    import threading

    from inference import serving
    from inference.openai_protocol import request_parse
    from inference.serving import ModelCache, serve_generate, serve_prepare

    run = trained["run"]
    settings = TierSettings.from_config(run.tier_config).with_(temperature=0.0, max_new_tokens=5)
    served = ModelCache(capacity=1).get(policy_dir(run.pk, STEP), settings)
    decoded: list[int] = []
    real_decode = serving.decode
    monkeypatch.setattr(
        serving,
        "decode",
        lambda tier, prompts, *a, **k: decoded.append(len(prompts)) or real_decode(tier, prompts, *a, **k),
    )

    def prepared(prompt: str, n: int):
        request = request_parse({"model": "m", "prompt": prompt, "n": n, "temperature": 0}, chat=False)
        return serve_prepare(served, request, settings), request

    alone = {
        prompt: serve_generate(*prepared(prompt, 1), lambda row, token: None)[0]
        for prompt in ("add 3 to x", "add 4 to x")
    }
    decoded.clear()
    answers: dict[str, list] = {}
    tokens: dict[str, list] = {"add 3 to x": [], "add 4 to x": []}
    with served.lock:  # the model is busy: both requests wait for it
        threads = [
            threading.Thread(
                target=lambda p=prompt, n=n: answers.__setitem__(
                    p,
                    serve_generate(
                        *prepared(p, n), lambda row, token, p=p: tokens[p].append((row, token.id))
                    ),
                )
            )
            for prompt, n in (("add 3 to x", 1), ("add 4 to x", 2))
        ]
        for thread in threads:
            thread.start()
        wait_until(lambda: len(served.waiting) == 2, "both requests waiting", timeout=30)
    for thread in threads:
        thread.join(timeout=60)
    assert decoded == [3]  # one decode of both requests' rows
    assert [c.token_ids for c in answers["add 3 to x"]] == [alone["add 3 to x"].token_ids]
    assert [c.token_ids for c in answers["add 4 to x"]] == [alone["add 4 to x"].token_ids] * 2
    assert {row for row, _ in tokens["add 4 to x"]} == {0, 1}  # its own rows, numbered from 0
    assert [t for row, t in tokens["add 3 to x"]] == alone["add 3 to x"].token_ids

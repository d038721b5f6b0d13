"""Tiers on external OpenAI-compatible engines: the settings and their errors, the refusal of runs an
engine cannot serve, Flywheel's /v1 as vLLM's contract (token ids, runtime LoRA loading), and, against
Flywheel's own server in a separate process (a real HTTP hop), engine decoding equal to local decoding
and a LoRA GRPO run through the real workers whose rollouts and evaluations go through the engine,
each policy version's adapter loaded into it in turn."""

import json

import httpx
import pytest
import torch
from django.core.exceptions import ValidationError
from django.test import Client

from inference.chat import item_prompt
from inference.decoding import TierError, decode, tier_load, tier_prepare
from inference.engines import EngineTier, completion_request, engine_generate, engine_tier_load
from inference.judge import tier_judge
from inference.policy import policy_load
from inference.settings import SamplingParams, TierSettings, tier_snapshot
from projects import services as project_services
from projects.demo_tasks import demo_task_sets
from rewards import services as reward_services
from runs import lifecycle
from runs.lifecycle import RunRequest
from runs.models import MetricPoint, Run, Trajectory, TrajectoryStep
from runs.run_store import policy_dir, policy_prefix
from serving.models import ServedAdapter
from tests.conftest import api_client_for, make_user
from tests.run_harness import (  # noqa: F401  (tiny_model: a fixture)
    Host,
    demo_project,
    tiny_model,
    wait_for_terminal,
    wait_until,
    worker_env,
)
from tests.serving_fixtures import STEP, trained  # noqa: F401  (a fixture)
from tests.web_server import WebServer
from tiers import services as tier_services
from tiers.models import Tier
from workers.run_rollout import engine_adapter_name, engine_policy_load
from workers.tier_eval import tier_measure, tier_run

KEY_ENV = "FLYWHEEL_TEST_ENGINE_KEY"
LORA = {"adapter": "lora", "lora_rank": 4, "lora_alpha": 8, "learning_rate": 5e-2}
# A graded reward (the tiny model rarely passes unit tests): every group has some variance to learn
# from, so each policy version's adapter differs from the one before.
SIMILARITY = {
    "type": "text_similarity",
    "name": "similar",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.reference_solution }}",
    "evaluation_metric": "fuzzy_match",
}
pytestmark = pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume asynchronous iterators")


def engine_tier(setup: dict, url: str, **changes) -> Tier:
    """An engine tier over the demo project's local tier, served by a Flywheel at `url`."""
    local = setup["tier"]
    values = {
        "name": "engine",
        "base_model": local.base_model,
        "temperature": 1.0,
        "max_new_tokens": 12,
        "engine": "openai",
        "engine_url": url,
        "engine_model": f"tier-{local.pk}",
        "engine_api_key_env": KEY_ENV,
        "engine_adapters": "vllm",
    }
    return tier_services.tier_create(project=setup["project"], by=setup["owner"], **(values | changes))


def launch(setup: dict, tier: Tier, hyperparameters: dict, steps: int = 3) -> Run:
    return lifecycle.run_create(
        request=RunRequest(
            project=setup["project"],
            name="engine grpo",
            task_set_version=setup["version"],
            reward_rule_version=setup["rule"].versions.get(),
            tier=tier,
            method="grpo",
            hyperparameters={"group_size": 4, "batch_size": 2, "staleness": 0, "eval_items": 2}
            | hyperparameters,
            max_steps=steps,
        ),
        by=setup["owner"],
    )


def post(client: Client, path: str, body: dict):
    return client.post(path, json.dumps(body), content_type="application/json")


def bearer(user) -> Client:
    _, raw = project_services.api_token_create(user=user, name="engine")
    return Client(headers={"Authorization": f"Bearer {raw}"})


# --- settings ------------------------------------------------------------------------------------


def test_engine_settings_are_checked_and_each_error_names_its_field(team):
    response = api_client_for(team["owner"]).post(
        "/api/v1/tiers",
        {
            "project": team["project"].pk,
            "name": "vllm",
            "base_model": "org/model-1b",
            "engine": "openai",
            "engine_url": "gpu-1:8000",
            "engine_api_key_env": "sk-live-123",
            "precision": "bf16",
            "engine_adapter_root": "relative/path",
        },
        format="json",
    )
    assert response.status_code == 400
    details = {d["param"]: d["message"] for d in response.json()["error"]["details"]}
    assert sorted(details) == [
        "engine_adapter_root",
        "engine_api_key_env",
        "engine_model",
        "engine_url",
        "precision",
    ]
    assert "looks like a key itself" in details["engine_api_key_env"]
    assert "decodes on its engine" in details["precision"]
    with pytest.raises(ValidationError) as local:
        tier_services.tier_create(
            project=team["project"],
            by=team["owner"],
            name="l",
            base_model="org/m",
            engine_url="http://x:1/v1",
        )
    assert set(local.value.message_dict) == {"engine_url"}
    assert Tier.objects.count() == 0

    tier = tier_services.tier_create(
        project=team["project"],
        by=team["owner"],
        name="vllm",
        base_model="org/model-1b",
        engine="openai",
        engine_url="http://gpu-1:8000/v1",
        engine_model="qwen",
        engine_api_key_env="VLLM_API_KEY",
        engine_adapters="vllm",
        engine_adapter_root="/mnt/flywheel-artifacts",
    )
    body = api_client_for(team["owner"]).get(f"/api/v1/tiers/{tier.pk}").json()
    assert (body["engine"], body["engine_url"], body["engine_api_key_env"]) == (
        "openai",
        "http://gpu-1:8000/v1",
        "VLLM_API_KEY",
    )


def test_the_tier_form_shows_each_engine_error_next_to_its_field_and_the_page_the_engine(client, team):
    from django.urls import reverse

    client.force_login(team["owner"])
    form = {
        "name": "vllm",
        "base_model": "org/model-1b",
        "device": "auto",
        "precision": "fp32",
        "speculation": "none",
        "speculative_tokens": "0",
        "temperature": "1.0",
        "top_p": "1.0",
        "top_k": "0",
        "max_new_tokens": "64",
        "batch_size": "8",
        "chat": "on",
        "engine": "openai",
        "engine_url": "gpu-1:8000",
        "engine_model": "qwen",
        "engine_api_key_env": "VLLM API KEY",
        "engine_adapters": "vllm",
    }
    create = reverse("tier-create", args=[team["project"].pk])
    body = client.post(create, form).content.decode()
    assert '<p class="field-error" data-field="engine_url">must be an http:// or https:// URL' in body
    assert '<p class="field-error" data-field="engine_api_key_env">must be the name of an environment' in body
    assert Tier.objects.count() == 0
    fixed = form | {"engine_url": "http://gpu-1:8000/v1", "engine_api_key_env": "VLLM_API_KEY"}
    assert client.post(create, fixed).status_code == 302
    tier = Tier.objects.get()
    page = client.get(reverse("tier-detail", args=[tier.pk])).content.decode()
    assert (
        "<code>http://gpu-1:8000/v1</code>, model <code>qwen</code>, key in <code>$VLLM_API_KEY</code>"
        in page
    )


def test_a_full_weight_run_on_an_engine_tier_is_refused_with_the_reason(db, tiny_model):  # noqa: F811
    setup = demo_project(tiny_model)
    tier = engine_tier(setup, "http://127.0.0.1:9/v1")
    with pytest.raises(ValidationError) as refused:
        launch(setup, tier, {})
    reason = refused.value.message_dict["tier"][0]
    assert reason == (
        "tier engine decodes on an external engine (http://127.0.0.1:9/v1), which serves its own model "
        "and cannot load a full-weight run's policy versions: train with adapter lora on an engine that "
        "loads adapters (engine_adapters vllm or sglang), or use a local tier"
    )
    tier_services.tier_update(tier=tier, engine_adapters="none")
    with pytest.raises(ValidationError) as no_adapters:
        launch(setup, tier, LORA)
    assert "does not load adapters (engine_adapters none)" in no_adapters.value.message_dict["tier"][0]
    assert Run.objects.count() == 0
    tier_services.tier_update(tier=tier, engine_adapters="vllm")
    assert launch(setup, tier, LORA).status == Run.Status.QUEUED


def test_a_request_carries_the_tiers_decoding_settings(tiny_model):  # noqa: F811
    settings = TierSettings(
        base_model=str(tiny_model),
        engine="openai",
        engine_url="http://gpu:8000/v1",
        engine_model="m",
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        stop=("\n\n",),
        max_new_tokens=33,
    )
    tier = engine_tier_load(settings)
    body = completion_request(tier, [5, 6], 4, settings.sampling_params(), 11)
    assert body == {
        "model": "m",
        "prompt": [5, 6],
        "n": 4,
        "max_tokens": 33,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "stop": ["\n\n"],
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "seed": 11,
    }
    greedy = completion_request(tier, [5], 1, SamplingParams(max_new_tokens=3, temperature=0.0), None)
    assert "top_k" not in greedy and "stop" not in greedy and "seed" not in greedy


# --- Flywheel's /v1 as vLLM's contract (in process) -------------------------------------------------


def test_v1_answers_token_ids_for_token_id_prompts_and_loads_adapters_by_artifact_name(trained):  # noqa: F811
    run, tier = trained["run"], trained["tier"]
    client = bearer(trained["owner"])
    policy = policy_load(trained["model"])
    ids = policy.tokenizer("add 3 to x")["input_ids"]
    body = {"model": f"tier-{tier.pk}", "prompt": ids, "temperature": 0, "max_tokens": 6, "logprobs": 0}
    answer = json.loads(
        b"".join(post(client, "/v1/completions", body | {"return_tokens_as_token_ids": True}))
    )
    (expected,) = decode(
        tier_prepare(
            policy, TierSettings.from_config(run.tier_config).with_(temperature=0.0, max_new_tokens=6)
        ),
        [tuple(ids)],
    )
    logprobs = answer["choices"][0]["logprobs"]
    assert logprobs["tokens"] == [f"token_id:{t}" for t in expected.token_ids]  # every token, EOS included
    assert logprobs["token_logprobs"] == pytest.approx(expected.logprobs, abs=1e-5)
    assert answer["usage"]["prompt_tokens"] == len(ids)

    bad = post(client, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/mnt/a/runs/1/policies/v1"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "lora_path"
    full = f"{policy_prefix(run.pk, STEP)}"
    weights = post(client, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": full})
    assert (
        weights.status_code == 400
        and "full weights, not a LoRA adapter" in weights.json()["error"]["message"]
    )
    outsider = post(
        bearer(make_user("outsider")), "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": full}
    )
    assert outsider.status_code == 404
    gone = post(client, "/v1/unload_lora_adapter", {"lora_name": "nothing"})
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "lora_name"
    assert ServedAdapter.objects.count() == 0


# --- against Flywheel's own server in a separate process ---------------------------------------------


@pytest.fixture
def engine(transactional_db, tiny_model, tmp_path, monkeypatch):  # noqa: F811
    """A demo project, and Flywheel's web server as the engine (its own process, a real HTTP hop),
    with the engine's API key in the environment the tier names."""
    setup = demo_project(tiny_model)
    _, token = project_services.api_token_create(user=setup["owner"], name="engine")
    monkeypatch.setenv(KEY_ENV, token)
    with WebServer(worker_env(), tmp_path / "engine.log") as server:
        yield setup | {
            "url": f"{server.url}/v1",
            "token": token,
            "log": tmp_path / "engine.log",
            "tmp": tmp_path,
        }


def test_engine_decoding_equals_local_decoding_greedy_and_seeded(engine, tiny_model):  # noqa: F811
    # Two servers of the same model (a fleet): requests spread over both.
    with WebServer(worker_env(), engine["tmp"] / "engine-2.log") as second:
        _decode_and_compare(engine, f"{engine['url']}, {second.url}/v1")
    served = f"serving tier-{engine['tier'].pk} for user {engine['owner'].pk}"
    assert served in engine["log"].read_text() and served in (engine["tmp"] / "engine-2.log").read_text()


def _decode_and_compare(engine: dict, urls: str) -> None:
    tier = engine_tier(engine, urls, temperature=0.0, stop=["\n\n"], max_new_tokens=10)
    remote = tier_load(TierSettings.from_config(tier))
    assert isinstance(remote, EngineTier)
    local_settings = TierSettings.from_config(engine["tier"]).with_(
        temperature=0.0, stop=("\n\n",), max_new_tokens=10
    )
    local = tier_load(local_settings)
    prompts = [remote.prompt_text(p) for p in ("add 3 to x", "Write f(x) that returns x times 2.")]
    prompts = [prompts[0], prompts[0], prompts[1]]  # a group of two: one request with n=2
    from_engine = decode(remote, prompts)
    from_local = decode(local, prompts)
    for got, want in zip(from_engine, from_local, strict=True):
        assert got.token_ids == want.token_ids and got.text == want.text
        assert got.finish_reason == want.finish_reason
        assert got.prompt_token_ids == want.prompt_token_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
        assert got.served_by == f"tier-{engine['tier'].pk}"

    # Sampling with the tier's temperature, top-p and top-k: a seeded engine draws what local
    # decoding draws with the same seed.
    sampled = TierSettings.from_config(tier).with_(temperature=0.8, top_p=0.9, top_k=30)
    seed = 1234
    settings_local = local_settings.with_(temperature=0.8, top_p=0.9, top_k=30)

    (sample,) = engine_generate(remote, [prompts[1]], sampled, seeds=[seed])
    (want,) = decode(local, [prompts[1]], settings_local, generator=torch.Generator().manual_seed(seed))
    assert sample.token_ids == want.token_ids
    assert sample.logprobs == pytest.approx(want.logprobs, abs=1e-4)

    # A tier evaluation measures the engine's own model; another checkpoint is refused by name.
    items = demo_task_sets(seed=0, train_size=1, heldout_size=3)["heldout"]
    measured = tier_measure(remote, items, grade=False)
    assert measured["model_mb"] == 0 and measured["requests"] == 3
    assert measured["texts"] == [
        c.text for c in decode(local, [local.prompt_text(item_prompt(i)) for i in items])
    ]
    with pytest.raises(TierError, match="^engine: this tier decodes on its engine's model"):
        tier_run(tier_snapshot(tier), "/elsewhere/checkpoint", items)

    # A model judge on the engine tier answers what the same judge answers on the local tier.
    messages = [{"role": "user", "content": "Is `return x + 3` right? Answer yes or no."}]
    params = {"temperature": 0, "max_tokens": 8}
    verdict = tier_judge(tier_snapshot(tier))("engine", messages, params)
    assert verdict == tier_judge(tier_snapshot(engine["tier"]))("rollout", messages, params)


@pytest.mark.backend_independent
@pytest.mark.timeout(900)
def test_a_lora_grpo_run_rolls_out_through_the_engine_swapping_each_versions_adapter(engine, tiny_model):  # noqa: F811
    tier = engine_tier(engine, engine["url"])
    engine["rule"] = reward_services.reward_rule_create(
        project=engine["project"], name="similar", spec=SIMILARITY, by=engine["owner"]
    )
    run = launch(engine, tier, LORA | {"kl_coef": 0.0, "eval_every": 1}, steps=3)
    env = worker_env(**{KEY_ENV: engine["token"]})
    learner, rollout = Host(env), Host(env)
    try:
        learner.worker("learner,control")
        rollout.worker("rollout,eval")
        run = wait_for_terminal(run.pk)
        # Held-out evaluation goes through the engine too, the last version's after the run ends.
        wait_until(
            lambda: MetricPoint.objects.filter(run=run, name="heldout/pass_rate", step=3).exists(),
            "the held-out evaluation of the last version, through the engine",
            timeout=180,
        )
    finally:
        learner.kill()
        rollout.kill()
    assert run.status == Run.Status.SUCCEEDED, (run.error, list(run.events.values_list("message", flat=True)))

    # Staleness 0: step s is sampled by version s - 1, each version's adapter loaded into the engine.
    trajectories = Trajectory.objects.filter(run=run, outcome=Trajectory.Outcome.SCORED)
    assert set(trajectories.values_list("policy_version", flat=True)) == {0, 1, 2}
    records = [
        (t.policy_version, step.data())
        for t in trajectories
        for step in TrajectoryStep.objects.filter(trajectory=t)
    ]
    assert {(v, r["served_by"]) for v, r in records} == {(v, engine_adapter_name(run, v)) for v in (0, 1, 2)}

    # The behaviour log-probs the engine returned are those of the version's adapter, and not of
    # the version before it: the engine really swapped the weights between policy versions.
    def recomputed(version: int, record: dict) -> list[float]:
        policy = models[version]
        ids = torch.tensor([record["prompt_token_ids"] + record["token_ids"]])
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0].float()
        start = len(record["prompt_token_ids"])
        targets = torch.tensor(record["token_ids"])
        return logits[start - 1 : -1].log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1).tolist()

    models = {v: policy_load(policy_dir(run.pk, v)) for v in (0, 1, 2)}
    differs = 0
    for version, record in records:
        assert record["logprobs"] == pytest.approx(recomputed(version, record), abs=1e-4)
        if version > 0:
            before = recomputed(version - 1, record)
            differs += max(abs(a - b) for a, b in zip(before, record["logprobs"], strict=True)) > 1e-3
    assert differs > 0

    # Greedy through the engine: an adapter by name decodes as its version does locally, and the
    # base tier's own requests run without the adapter its resident model now holds.
    greedy = TierSettings.from_config(tier).with_(temperature=0.0)
    prompt = models[2].prompt_text("Write f(x) that returns x plus 3.")
    outputs = {}
    for name, source in ((engine_adapter_name(run, 3), policy_dir(run.pk, 3)), (None, tiny_model)):
        remote = engine_tier_load(greedy, served_model=name)
        (got,) = outputs[name] = decode(remote, [prompt])
        (want,) = decode(tier_load(greedy.with_(engine="local"), source), [prompt])
        assert got.token_ids == want.token_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)

    # An engine that lost an adapter (restarted, or another worker unloaded it) is given it again.
    served = engine_policy_load(run, 3, greedy)
    gone = httpx.post(
        f"{engine['url']}/unload_lora_adapter",
        json={"lora_name": served.served_model},
        headers={"Authorization": f"Bearer {engine['token']}"},
    )
    assert gone.status_code == 200 and not ServedAdapter.objects.filter(name=served.served_model).exists()
    (again,) = decode(served, [prompt])
    assert again.token_ids == outputs[served.served_model][0].token_ids  # the adapter's, reloaded
    assert ServedAdapter.objects.filter(name=served.served_model).exists()

    # Every version was evaluated through the engine, and old versions were unloaded from it.
    assert set(
        MetricPoint.objects.filter(run=run, name="heldout/pass_rate").values_list("step", flat=True)
    ) == {
        0,
        1,
        2,
        3,
    }
    loaded = set(ServedAdapter.objects.filter(run=run).values_list("name", flat=True))
    assert engine_adapter_name(run, 3) in loaded and len(loaded) < 4  # 4 versions were loaded
    assert all(
        row.artifact == policy_prefix(run.pk, int(row.name.rsplit("v", 1)[1]))
        for row in ServedAdapter.objects.all()
    )

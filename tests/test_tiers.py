"""Tiers at work: each setting changes how generation runs, speculative greedy decoding is exact,
and tier evaluations are requested, run on the eval queue's task and read back, at tiny scale."""

import copy
import json
from pathlib import Path
from unittest import mock

import pytest
import torch

from core.roles import Role
from inference.decoding import GenerationStats, decode, is_quantised, lookup_draft, policy_tier, tier_prepare
from inference.judge import tier_judge
from inference.lean_llama import lean_llama
from inference.policy import policy_load
from inference.settings import TierSettings
from projects import services as project_services
from tests.conftest import api_client_for
from tests.test_api_schema import assert_matches_schema
from tiers import services as tier_services
from tiers.models import TierEvaluation
from workers.base_model import BaseModelConfig, base_model_build
from workers.tier_eval import pareto_front, tier_evaluation_run

TINY = BaseModelConfig(
    seed=3,
    corpus_size=200,
    vocab_size=300,
    hidden_size=32,
    layers=2,
    heads=2,
    intermediate_size=64,
    steps=6,
    batch_size=8,
    warmup_steps=1,
    heldout_size=20,
)
PROMPTS = [
    "Write a Python function `f(x)` that returns x plus 3.",
    "Write a Python function `g(xs)` that returns each element of xs times 2, as a list.",
    "Write a Python function `h(n)` that returns 4 less than n.",
]
GREEDY = TierSettings(temperature=0.0, max_new_tokens=12, batch_size=3)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tier-model")
    base_model_build(path, TINY, log=lambda line: None)
    return path


@pytest.fixture(scope="module")
def prompts(model_dir) -> list[str]:
    policy = policy_load(model_dir)
    return [policy.prompt_text(prompt) for prompt in PROMPTS]


class ContraryDraft(torch.nn.Module):
    """The model itself, except that at every third position it proposes its second choice: a
    draft that is right often but not always, whatever the (untrained) model writes."""

    def __init__(self, model) -> None:
        super().__init__()
        self.inner = model

    def forward(self, *, input_ids, position_ids, **kwargs):
        out = self.inner(input_ids=input_ids, position_ids=position_ids, **kwargs)
        logits = out.logits.clone()
        second = logits.topk(2, dim=-1).indices[..., 1:]
        boost = logits.max(dim=-1, keepdim=True).values + 1.0
        flip = (position_ids % 3 == 0)[..., None]
        logits.scatter_(-1, second, torch.where(flip, boost, logits.gather(-1, second)))
        out.logits = logits
        return out


def noisy_draft(model_dir: Path) -> torch.nn.Module:
    return ContraryDraft(policy_load(model_dir).model)


def run(model_dir, prompts, settings, *, draft=None, seed=0):
    tier = tier_prepare(policy_load(model_dir), settings, draft=draft)
    stats = GenerationStats()
    completions = decode(tier, prompts, generator=torch.Generator().manual_seed(seed), stats=stats)
    return tier, completions, stats


def test_int8_quantises_every_linear_layer_and_bf16_casts(model_dir, prompts):
    tier, completions, _ = run(model_dir, prompts, GREEDY.with_(precision="int8"))
    assert is_quantised(tier.model)
    assert lean_llama(tier.model) is None  # the lean path reads float weights; int8 runs the model's own
    assert all(len(c.logprobs) == len(c.token_ids) >= 1 for c in completions)
    plain, _, _ = run(model_dir, prompts, GREEDY)
    assert not is_quantised(plain.model)
    bf16, _, _ = run(model_dir, prompts, GREEDY.with_(precision="bf16"))
    assert next(bf16.model.parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("mode", ["draft_model", "prompt_lookup"])
def test_speculative_greedy_decoding_returns_exactly_the_greedy_tokens(model_dir, prompts, mode, batch_size):
    policy = policy_load(model_dir)
    reference = decode(policy_tier(policy, GREEDY.sampling_params()), prompts)
    settings = GREEDY.with_(batch_size=batch_size, speculation=mode, speculative_tokens=3)
    draft = noisy_draft(model_dir) if mode == "draft_model" else None
    _, completions, stats = run(model_dir, prompts, settings, draft=draft)
    assert [c.token_ids for c in completions] == [r.token_ids for r in reference]
    for got, want in zip(completions, reference, strict=True):
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
    # The drafts were consulted and verified (an untrained model rarely copies its prompt, so
    # prompt lookup's proposals are mostly rejected here; the draft model's are mostly accepted).
    assert stats.proposed > 0
    if mode == "draft_model":
        assert stats.draft_forwards > 0
        assert 0 < stats.accepted < stats.proposed  # rejections happened, and the output is still exact
        _, _, plain = run(model_dir, prompts, GREEDY.with_(batch_size=batch_size))
        assert stats.target_forwards < plain.target_forwards


def test_a_draft_identical_to_the_model_is_always_accepted(model_dir, prompts):
    settings = GREEDY.with_(speculation="draft_model", speculative_tokens=4)
    _, completions, stats = run(model_dir, prompts, settings, draft=policy_load(model_dir))
    assert stats.acceptance_rate == 1.0
    _, plain, _ = run(model_dir, prompts, GREEDY)
    assert [c.token_ids for c in completions] == [c.token_ids for c in plain]


def test_a_group_shares_its_prompts_prefill(model_dir, prompts):
    group = [prompts[0]] * 4 + [prompts[1]] * 4
    sampling = TierSettings(temperature=1.0, max_new_tokens=8, batch_size=8)
    _, shared, with_cache = run(model_dir, group, sampling)
    _, unshared, without = run(model_dir, group, sampling.with_(prefix_cache=False))
    lengths = [len(c.prompt_token_ids) for c in shared]
    assert with_cache.prefill_positions == lengths[0] + lengths[4]
    assert without.prefill_positions == sum(lengths)
    # Sharing the prefill changes nothing about what is sampled: the same seed, the same tokens.
    assert [c.token_ids for c in shared] == [c.token_ids for c in unshared]
    assert len({tuple(c.token_ids) for c in shared[:4]}) > 1  # a group's samples still differ


def test_batching_decodes_rows_together(model_dir, prompts):
    _, one, single = run(model_dir, prompts, GREEDY.with_(batch_size=1))
    _, three, batched = run(model_dir, prompts, GREEDY.with_(batch_size=3))
    assert [c.token_ids for c in one] == [c.token_ids for c in three]
    assert batched.target_forwards < single.target_forwards
    assert len(single.latency_seconds) == len(batched.latency_seconds) == 3


@pytest.mark.parametrize("mode", ["none", "draft_model", "prompt_lookup"])
def test_sampling_respects_the_budget_and_records_logprobs(model_dir, prompts, mode):
    settings = TierSettings(
        temperature=0.8,
        top_k=50,
        top_p=0.95,
        max_new_tokens=7,
        batch_size=2,
        speculation=mode,
        speculative_tokens=0 if mode == "none" else 3,
    )
    draft = noisy_draft(model_dir) if mode == "draft_model" else None
    _, completions, stats = run(model_dir, prompts * 2, settings, draft=draft, seed=4)
    for completion in completions:
        assert 1 <= len(completion.token_ids) <= 7
        assert len(completion.logprobs) == len(completion.token_ids)
        assert all(logprob <= 0 for logprob in completion.logprobs)
    _, again, _ = run(model_dir, prompts * 2, settings, draft=draft, seed=4)
    assert [c.token_ids for c in completions] == [c.token_ids for c in again]


def test_stop_sequences_end_a_completion(model_dir, prompts):
    _, plain, _ = run(model_dir, prompts, GREEDY)
    text = plain[0].text
    if len(text) < 3:
        pytest.skip("the tiny model wrote too little to cut")
    stop = text[1:3]
    _, stopped, _ = run(
        model_dir, prompts, GREEDY.with_(stop=(stop,), speculation="prompt_lookup", speculative_tokens=3)
    )
    assert stopped[0].finish_reason == "stop"
    assert stopped[0].text == text[: text.index(stop)]


def test_lookup_draft_proposes_what_followed_the_last_ngram():
    assert lookup_draft([1, 2, 3, 4, 9, 1, 2], 3) == [3, 4, 9]
    assert lookup_draft([7, 8], 3) == []


def test_tier_judge_answers_with_the_tier(model_dir):
    judge = tier_judge({"base_model": str(model_dir), "temperature": 0.0, "max_new_tokens": 5})
    reply = judge("judge", [{"role": "user", "content": "Is 2 + 2 = 4?"}], {"max_tokens": 3})
    assert isinstance(reply, str)
    named = tier_judge({"small": {"base_model": str(model_dir), "temperature": 0.0, "max_new_tokens": 3}})
    assert named("small", [{"role": "user", "content": "hi"}], {}) == named(
        "small", [{"role": "user", "content": "hi"}], {}
    )
    with pytest.raises(ValueError, match="no tier named"):
        named("missing", [], {})


def test_pareto_front_keeps_the_undominated_tiers():
    results = [
        {"pass_rate": 0.6, "tokens_per_second": 100},
        {"pass_rate": 0.6, "tokens_per_second": 300},
        {"pass_rate": 0.2, "tokens_per_second": 900},
        {"error": "failed"},
    ]
    assert pareto_front(results) == {1, 2}


# --- requests, the eval task, REST -------------------------------------------------------------


def answer_task_set(team):
    owner = team[Role.OWNER]
    task_set = project_services.task_set_create(project=team["project"], name="answers", by=owner)
    lines = [json.dumps({"id": f"q{i}", "prompt": f"Say {i}", "reference": str(i)}) + "\n" for i in range(3)]
    report = project_services.task_set_import(
        task_set=task_set,
        stream=[line.encode() for line in lines],
        file_format="jsonl",
        by=owner,
        heldout_fraction=1.0,
    )
    return report.version


@pytest.fixture
def api_schema(team) -> dict:
    response = api_client_for(team[Role.OWNER]).get("/api/v1/schema/", {"format": "json"})
    return json.loads(response.content)


@pytest.fixture
def tiers(team, model_dir):
    owner = team[Role.OWNER]
    capability = tier_services.tier_create(
        project=team["project"],
        by=owner,
        name="capability",
        base_model=str(model_dir),
        temperature=0.0,
        max_new_tokens=4,
        batch_size=1,
    )
    speed = tier_services.tier_create(
        project=team["project"],
        by=owner,
        name="speed",
        base_model=str(model_dir),
        temperature=0.0,
        max_new_tokens=4,
        batch_size=4,
        speculation="prompt_lookup",
        speculative_tokens=3,
    )
    return capability, speed


def test_evaluate_is_queued_after_commit_and_the_eval_task_measures_every_tier(
    team, tiers, django_capture_on_commit_callbacks, api_schema
):
    capability, speed = tiers
    version = answer_task_set(team)
    client = api_client_for(team[Role.LAUNCHER])
    with mock.patch("tiers.tasks.tier_evaluate.delay") as delay:
        with django_capture_on_commit_callbacks(execute=True):
            response = client.post(
                f"/api/v1/tiers/{capability.pk}/evaluate",
                {"task_set_version": version.pk, "compare": [speed.pk], "split": "heldout"},
                format="json",
            )
    assert response.status_code == 202, response.content
    assert_matches_schema(api_schema, response, "post", "/api/v1/tiers/{id}/evaluate")
    body = response.json()
    assert body["status"] == "queued" and [c["name"] for c in body["tier_configs"]] == ["capability", "speed"]
    delay.assert_called_once_with(body["id"])

    assert tier_evaluation_run(body["id"]) is True
    assert tier_evaluation_run(body["id"]) is False  # a redelivery finds it claimed
    evaluation = TierEvaluation.objects.get(pk=body["id"])
    assert evaluation.status == "succeeded", evaluation.error
    by_name = {result["name"]: result for result in evaluation.results}
    for result in by_name.values():
        assert result["scored"] == 3 and 0 <= result["pass_rate"] <= 1
        assert result["tokens_per_second"] > 0 and result["latency_ms_p95"] >= result["latency_ms_p50"]
        assert result["peak_memory_mb"] >= result["model_mb"] > 0
    assert (
        by_name["speed"]["acceptance_rate"] is not None and by_name["capability"]["acceptance_rate"] is None
    )
    assert any(result["pareto"] for result in evaluation.results)

    read = api_client_for(team[Role.VIEWER]).get(f"/api/v1/tier-evaluations/{body['id']}")
    assert read.status_code == 200 and len(read.json()["results"]) == 2
    assert_matches_schema(api_schema, read, "get", "/api/v1/tier-evaluations/{id}")
    page = api_client_for(team[Role.VIEWER])
    page.force_login(team[Role.VIEWER])
    html = page.get(f"/tier-evaluations/{body['id']}/").content.decode()
    assert "tier-chart-data" in html and "Pareto" in html


def test_evaluate_refuses_what_cannot_be_evaluated(team, tiers, make_other_project_tier):
    capability, _ = tiers
    version = answer_task_set(team)
    client = api_client_for(team[Role.OWNER])
    foreign = make_other_project_tier
    response = client.post(
        f"/api/v1/tiers/{capability.pk}/evaluate",
        {"task_set_version": version.pk, "compare": [foreign.pk]},
        format="json",
    )
    assert response.status_code == 404  # a tier the caller cannot see
    response = client.post(
        f"/api/v1/tiers/{capability.pk}/evaluate",
        {"task_set_version": version.pk, "split": "train"},
        format="json",
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "split"
    response = client.post(
        f"/api/v1/tiers/{capability.pk}/evaluate",
        {"task_set_version": version.pk, "checkpoint": "not a path"},
        format="json",
    )
    assert response.status_code == 400


@pytest.fixture
def make_other_project_tier(db):
    from tests.conftest import make_project, make_user

    other = make_user("stranger")
    project = make_project(other, name="elsewhere")
    return tier_services.tier_create(project=project, by=other, name="theirs", base_model="org/model")


def test_a_runs_final_checkpoint_is_evaluated_across_the_projects_tiers(team, tiers):
    from rewards import services as reward_services
    from runs.models import Run
    from runs.tier_policies import run_final_evaluate

    capability, speed = tiers
    version = answer_task_set(team)
    rule = reward_services.reward_rule_create(
        project=team["project"],
        name="exact",
        by=team[Role.OWNER],
        spec={
            "type": "string_check",
            "name": "exact",
            "input": "{{sample.output_text}}",
            "reference": "{{item.reference}}",
            "operation": "eq",
        },
    )
    run = Run.objects.create(
        project=team["project"],
        name="r",
        task_set_version=version,
        reward_rule_version=rule.versions.get(),
        tier=speed,
        tier_config={"base_model": capability.base_model},
        max_steps=1,
        policy_version=0,
    )
    with mock.patch("tiers.tasks.tier_evaluate.delay"):
        evaluation = run_final_evaluate(run.pk)
    assert evaluation is not None and evaluation.run_id == run.pk
    assert [c["name"] for c in evaluation.tier_configs] == ["speed", "capability"]
    assert run_final_evaluate(run.pk).pk == evaluation.pk  # once per version


def test_a_speculative_copy_is_not_the_model_itself(model_dir):
    policy = policy_load(model_dir)
    settings = GREEDY.with_(speculation="draft_model", speculative_tokens=2, precision="int8")
    tier = tier_prepare(policy, settings, draft=copy.deepcopy(policy))
    assert is_quantised(tier.model) and is_quantised(tier.draft) and tier.draft is not tier.model

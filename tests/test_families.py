"""Any causal LM: tiny random-initialised models of seven families (their own tokenizers, chat
templates, end-of-sequence ids, padding sides, tied embeddings, missing pad tokens) run GRPO through
the real workers, and SFT and DPO in turn (each on at least three families), each run's held-out
evaluation and a final evaluation across two tiers (one speculative) included."""

import json
from pathlib import Path

import pytest
import torch

from inference.adapters import adapter_base, is_adapter
from inference.decoding import decode, tier_adapter_serve, tier_load
from inference.policy import policy_load
from inference.settings import TierSettings
from projects import services as project_services
from projects.demo_tasks import demo_task_sets
from rewards import services as reward_services
from runs import lifecycle
from runs.lifecycle import RunRequest
from runs.models import MetricPoint, Run, Trajectory
from runs.run_store import policy_dir
from tests.conftest import make_project, make_user
from tests.model_families import FAMILIES, family_model_save
from tests.run_harness import Host, hosts_killed, wait_until, worker_env
from tiers import services as tier_services
from tiers.models import TierEvaluation
from workers.learners.common import SequenceBatch, budget_groups, learner_create, sequence_batch
from workers.learners.grpo import GRPOBatch, GRPOConfig, learn_on_batch

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.ci_embedded_only]
FINISHED = ["succeeded", "failed"]
SYSTEM = "Answer with one line of Python."


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: family_model_save(name, root / name) for name in FAMILIES}


@pytest.fixture(scope="module")
def hosts(django_db_setup, django_db_blocker):
    """Workers for the module, pointed at the test database (set up first); a project's three runs
    may be active at once."""
    env = worker_env(FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS="3", FLYWHEEL_LEARNER_CONCURRENCY="3")
    learner_host, rollout_host = Host(env), Host(env)
    with hosts_killed(learner_host, rollout_host):
        learner_host.worker("learner,control")
        rollout_host.worker("rollout,eval")
        yield


def family_items() -> list[dict]:
    """The demo tasks, every other one as a conversation with a system message, each with a
    preference pair (its solution over an off-by-one one) for DPO."""
    sets = demo_task_sets(seed=0, train_size=6, heldout_size=3)
    items = []
    for index, item in enumerate(sets["train"] + sets["heldout"]):
        wrong = item["reference_solution"].replace("return ", "return 1 + ", 1)
        item = item | {
            "metadata": item["metadata"] | {"chosen": item["reference_solution"], "rejected": wrong}
        }
        if index % 2:
            prompt = item.pop("prompt")
            item["messages"] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
        items.append(item)
    return items


def family_project(model: Path) -> dict:
    owner = make_user(f"owner-{model.name}")
    project = make_project(owner, name=f"family-{model.name}")
    task_set = project_services.task_set_create(project=project, name="demo", by=owner)
    lines = [(json.dumps(item) + "\n").encode() for item in family_items()]
    version = project_services.task_set_import(
        task_set=task_set, stream=lines, file_format="jsonl", by=owner
    ).version
    rule = reward_services.reward_rule_create(
        project=project, name="tests", spec={"type": "unit_tests", "name": "tests"}, by=owner
    )
    tier = tier_services.tier_create(
        project=project, by=owner, name="capability", base_model=str(model), max_new_tokens=8
    )
    tier_services.tier_create(
        project=project,
        by=owner,
        name="speed",
        base_model=str(model),
        max_new_tokens=8,
        temperature=0.0,
        speculation="prompt_lookup",
        speculative_tokens=3,
        batch_size=16,
    )
    return {"owner": owner, "project": project, "version": version, "rule": rule, "tier": tier}


def launch(setup: dict, method: str, hyperparameters: dict) -> Run:
    return lifecycle.run_create(
        request=RunRequest(
            project=setup["project"],
            name=method,
            task_set_version=setup["version"],
            reward_rule_version=setup["rule"].versions.get(),
            tier=setup["tier"],
            method=method,
            hyperparameters=hyperparameters | {"batch_size": 3, "checkpoint_every": 2, "eval_items": 3},
            max_steps=2,
        ),
        by=setup["owner"],
    )


def finished(run: Run) -> Run:
    """The run once terminal; if it is not within the test's time, what it got to."""
    try:
        wait_until(lambda: Run.objects.get(pk=run.pk).is_terminal, f"run {run.pk} to finish", timeout=90)
    except AssertionError as late:
        events = list(run.events.order_by("pk").values_list("kind", "message"))
        status = Run.objects.get(pk=run.pk).status
        raise AssertionError(f"{run.method} run {run.pk} is {status}: {events}") from late
    return Run.objects.get(pk=run.pk)


# GRPO runs on every family (templates, generation, the learner's log-probs); SFT and DPO take
# turns, so each runs on at least three families of different shapes and all three on the first.
OFFLINE_METHODS = {
    family: ("sft", "dpo") if index == 0 else (("sft",) if index % 2 else ("dpo",))
    for index, family in enumerate(FAMILIES)
}
OFFLINE_HYPERPARAMETERS = {
    "sft": {"epochs": 10, "gradient_checkpointing": "on"},
    "dpo": {"epochs": 10, "micro_batch_tokens": 64},
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_grpo_sft_and_dpo_run_on_each_family_through_the_real_workers(family_dirs, hosts, family):
    setup = family_project(family_dirs[family])
    runs = [
        launch(setup, "grpo", {"group_size": 2, "staleness": 1, "micro_batch_tokens": 64}),
        *(launch(setup, method, OFFLINE_HYPERPARAMETERS[method]) for method in OFFLINE_METHODS[family]),
    ]
    for run in runs:
        run = finished(run)
        assert run.status == Run.Status.SUCCEEDED, (run.method, run.error)
        assert (run.learner_step, run.policy_version) == (2, 2)
        wait_until(
            lambda run=run: MetricPoint.objects.filter(run=run, name="heldout/pass_rate", step=2).exists(),
            f"the {run.method} run's held-out evaluation",
            timeout=120,
        )
        wait_until(
            lambda run=run: TierEvaluation.objects.filter(
                run=run, status__in=["succeeded", "failed"]
            ).exists(),
            f"the {run.method} run's final evaluation across tiers",
            timeout=120,
        )
        evaluation = TierEvaluation.objects.get(run=run)
        assert evaluation.status == TierEvaluation.Status.SUCCEEDED, evaluation.error
        assert [result["name"] for result in evaluation.results] == ["capability", "speed"]
        assert all("error" not in result and result["scored"] == 3 for result in evaluation.results)
    grpo = runs[0]
    trajectories = Trajectory.objects.filter(run=grpo)
    assert trajectories.count() == 2 * 3 * 2
    # Prompts went through the family's template (or raw text without one), conversations too.
    template = FAMILIES[family].chat_template
    prompts = [t.steps.order_by("index").first().data()["prompt"] for t in trajectories[:6]]
    if template is None:
        assert all(SYSTEM in p or p.startswith("Write") for p in prompts)
    else:
        policy = policy_load(family_dirs[family])
        rendered = {policy.prompt_text(item.get("messages") or item["prompt"]) for item in family_items()}
        assert set(prompts) <= rendered


@pytest.mark.parametrize("family", ["llama", "gemma", "phi3"])
def test_generation_stops_at_any_of_the_generation_configs_end_ids(family_dirs, family):
    path = family_dirs[family]
    tier = tier_load(TierSettings(base_model=str(path), temperature=0.0, max_new_tokens=6))
    end_ids = tier.model.generation_config.eos_token_id
    assert isinstance(end_ids, list) and len(end_ids) >= 2
    second = end_ids[1]  # not the tokenizer's EOS: only the generation config names it
    head = tier.model.lm_head
    tier.model.lm_head = torch.nn.Linear(head.in_features, head.out_features)  # it says `second` at once
    with torch.no_grad():
        tier.model.lm_head.weight.zero_()
        tier.model.lm_head.bias.zero_()
        tier.model.lm_head.bias[second] = 10.0
    [completion] = decode(tier, [tier.prompt_text("hi")])
    assert (completion.token_ids, completion.finish_reason, completion.text) == ([second], "stop", "")
    # A rendered prompt that opens with BOS gets no second one.
    assert completion.prompt_token_ids.count(tier.tokenizer.bos_token_id) <= 1


def test_a_token_budget_splits_micro_batches_without_changing_the_gradient(family_dirs, tmp_path):
    path = family_dirs["qwen2"]
    sequences = sequence_batch(
        [[5, 6, 7, 8], [5, 6, 7, 8], [9, 10, 11], [12, 13]],
        [[20, 21, 22], [23, 24], [25, 26, 27, 28, 29], [30]],
        pad_token_id=0,
    )
    old = torch.full((4, sequences.input_ids.size(1) - 1), -2.0)
    batch = GRPOBatch(sequences, old, torch.tensor([1.0, -1.0, 0.5, -0.5]))
    assert budget_groups(sequences.attention_mask.sum(-1).tolist(), 16) == [[0, 1], [2, 3]]
    gradients = []
    for budget in (0, 16):
        config = GRPOConfig(
            model=str(path), output_dir=str(tmp_path / str(budget)), micro_batch_tokens=budget
        )
        learner, _ = learner_create(config)
        learner.optimizer.step = lambda: None  # keep the gradient to compare it
        learner.optimizer.zero_grad = lambda set_to_none=True: None
        learn_on_batch(learner, batch, config, reference=None)
        gradients.append([p.grad.clone() for p in learner.model.parameters()])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*gradients, strict=True))


def test_trimmed_rows_keep_only_their_own_padding():
    batch = sequence_batch([[1, 2], [3]], [[4], [5, 6, 7, 8]], pad_token_id=0)
    assert isinstance(batch.rows([0]), SequenceBatch)
    assert batch.rows([0]).input_ids.tolist() == [[1, 2, 4]]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("family", ["qwen2", "gpt2"])
def test_a_lora_run_publishes_adapters_that_the_workers_swap_into_a_resident_base(family_dirs, hosts, family):
    setup = family_project(family_dirs[family])
    lora = {"adapter": "lora", "lora_rank": 4, "lora_alpha": 8, "learning_rate": 1e-2}
    runs = [
        launch(setup, "grpo", lora | {"group_size": 2, "staleness": 0, "kl_coef": 0.1}),
        launch(setup, "dpo", lora | {"epochs": 10}),
    ]
    for run in runs:
        run = finished(run)
        assert run.status == Run.Status.SUCCEEDED, (run.method, run.error)
        assert run.resolved["adapter"] == "lora" and run.resolved["lora_target_modules"] == "auto"
        for version in range(3):
            published = policy_dir(run.pk, version)
            assert is_adapter(published) and not (published / "model.safetensors").exists()
            assert adapter_base(published) == str(family_dirs[family])
        wait_until(
            lambda run=run: MetricPoint.objects.filter(run=run, name="heldout/pass_rate", step=2).exists(),
            f"the {run.method} run's held-out evaluation of its adapter",
            timeout=120,
        )
    # Staleness 0: step 2's rollouts were sampled by version 1, an adapter swapped into the base.
    grpo = runs[0]
    assert set(Trajectory.objects.filter(run=grpo).values_list("policy_version", flat=True)) == {0, 1}
    # The served adapter generates what the adapter loaded with its base generates.
    settings = TierSettings(base_model=str(family_dirs[family]), temperature=0.0, max_new_tokens=6)
    served = tier_adapter_serve(settings, policy_dir(grpo.pk, 1), version=1)
    served = tier_adapter_serve(settings, policy_dir(grpo.pk, 2), version=2)
    loaded = tier_load(settings, policy_dir(grpo.pk, 2))
    prompt = served.prompt_text("Write f(x).")
    assert decode(served, [prompt])[0].token_ids == decode(loaded, [prompt])[0].token_ids

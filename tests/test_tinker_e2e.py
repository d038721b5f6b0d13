"""End to end: the official `tinker` SDK against a live Flywheel (web server, a real learner process
on the learner queue, a rollout worker sampling), changed only in its base_url and key. The SDK's
basic pattern: a LoRA training client, forward_backward + optim_step until the model has learned a
completion, its weights saved for the sampler, and a sample that says it; the model is a run of
method `tinker` whose loss, steps and policy versions Flywheel records, and closing the session
ends the run."""

import numpy as np
import pytest
import tinker
from tinker import types

from projects import services as project_services
from runs.models import MetricPoint, Run
from tests.run_harness import demo_project, tiny_model, wait_until
from tests.web_server import served_with_workers
from tinker_api.models import TinkerModel, TinkerSession
from traces.models import Trace

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]
__all__ = ["tiny_model"]

STEPS = 20


@pytest.fixture
def stack(tmp_path):
    with served_with_workers(tmp_path / "web.log") as server:
        yield server


def datum(tokenizer, prompt: str, completion: str) -> tuple[types.Datum, list[int], list[int]]:
    """A supervised example in the SDK's convention: inputs are the sequence but its last token,
    targets the sequence shifted by one, weights 1 on the completion only."""
    prompt_tokens = tokenizer.encode(prompt, add_special_tokens=True)
    completion_tokens = tokenizer.encode(completion, add_special_tokens=False) + [tokenizer.eos_token_id]
    tokens = prompt_tokens + completion_tokens
    weights = [0.0] * len(prompt_tokens) + [1.0] * len(completion_tokens)
    example = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights[1:]},
    )
    return example, prompt_tokens, completion_tokens


@pytest.mark.timeout(600)
def test_the_official_tinker_client_trains_samples_and_ends_a_run(stack, tiny_model):
    setup = demo_project(tiny_model)
    _, token = project_services.api_token_create(user=setup["owner"], name="tinker loop")
    service = tinker.ServiceClient(base_url=f"{stack.url}/tinker", api_key=f"tml-{token}")
    offered = (
        tinker.RestClient(base_url=f"{stack.url}/tinker", api_key=f"tml-{token}")
        .get_server_capabilities()
        .result()
        .supported_models
    )
    assert [model.model_name for model in offered] == [str(tiny_model), "rollout"]  # the tier's base and name

    training = service.create_lora_training_client(base_model=str(tiny_model), rank=8).result()
    tokenizer = training.get_tokenizer()
    example, prompt, completion = datum(tokenizer, "2+3=", "5")
    losses = []
    for _ in range(STEPS):
        backward = training.forward_backward([example], "cross_entropy")
        step = training.optim_step(types.AdamParams(learning_rate=0.02))
        result = backward.result()
        step.result()
        weights = example.loss_fn_inputs["weights"].to_numpy()
        logprobs = result.loss_fn_outputs[0]["logprobs"].to_numpy()
        assert logprobs.shape == weights.shape
        losses.append(float(-(logprobs * weights).sum() / weights.sum()))
        assert result.metrics["loss:sum"] == pytest.approx(-(logprobs * weights).sum(), rel=1e-4)
    assert losses[-1] < 0.5 * losses[0], losses  # it learned the completion

    sampler = training.save_weights_and_get_sampling_client().result()
    answer = sampler.sample(
        prompt=types.ModelInput.from_ints(prompt),
        num_samples=2,
        sampling_params=types.SamplingParams(max_tokens=len(completion) + 2, temperature=0.0),
        include_prompt_logprobs=True,
    ).result()
    assert len(answer.sequences) == 2
    for sequence in answer.sequences:
        assert sequence.tokens[: len(completion)] == completion  # what it was taught, greedily
        assert len(sequence.logprobs) == len(sequence.tokens)
    assert answer.prompt_logprobs[0] is None and len(answer.prompt_logprobs) == len(prompt)
    recorded = Trace.objects.filter(metadata__source="tinker").order_by("external_id")
    assert [(t.prompt, t.completion[:1]) for t in recorded] == [("2+3=", "5")] * 2  # for reviewers

    # Training state saved by name, an RL step (importance sampling on what it sampled, every token
    # pushed down), then the state loaded back: the model is exactly what was saved.
    saved = training.save_state("after-sft").result()
    assert saved.path == f"tinker://{training.model_id}/weights/after-sft"
    before = training.forward([example], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    tokens = prompt + answer.sequences[0].tokens
    reinforce = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": [0.0] * (len(prompt) - 1) + list(answer.sequences[0].logprobs),
            "advantages": [0.0] * (len(prompt) - 1) + [-1.0] * len(answer.sequences[0].tokens),
        },
    )
    pushed = training.forward_backward([reinforce], "importance_sampling").result()
    current = pushed.loss_fn_outputs[0]["logprobs"].to_numpy()[len(prompt) - 1 :]
    ratios = np.exp(current - np.asarray(answer.sequences[0].logprobs))
    assert pushed.metrics["loss:sum"] == pytest.approx(ratios.sum(), rel=1e-4)  # -(p/q)·A, A = -1
    training.optim_step(types.AdamParams(learning_rate=0.02)).result()
    after_rl = training.forward([example], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    assert not np.allclose(after_rl, before, atol=1e-5)
    training.load_state(saved.path).result()
    restored = training.forward([example], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    assert restored == pytest.approx(before, abs=1e-5)
    rest = tinker.RestClient(base_url=f"{stack.url}/tinker", api_key=f"tml-{token}")
    found = rest.get_training_run_by_tinker_path(saved.path).result()  # what a resume reads
    assert (found.base_model, found.is_lora, found.lora_rank) == (str(tiny_model), True, 8)
    info = rest.get_weights_info_by_tinker_path(saved.path).result()
    assert (info.base_model, info.lora_rank) == (str(tiny_model), 8)
    runs = rest.list_training_runs().result()
    assert ([r.training_run_id for r in runs.training_runs], runs.cursor.total_count) == (
        [training.model_id],
        1,
    )
    assert rest.list_user_checkpoints().result().checkpoints[0].tinker_path == saved.path

    # Named sampler weights (the restored ones), sampled by a client made from their path: a second
    # policy version on the rollout worker, swapped into the base it keeps resident.
    named = training.save_weights_for_sampler("restored").result()
    again = service.create_sampling_client(model_path=named.path).result()
    assert again.get_base_model() == str(tiny_model)
    greedy = types.SamplingParams(max_tokens=len(completion), temperature=0.0)
    replayed = again.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=1, sampling_params=greedy)
    assert replayed.result().sequences[0].tokens == completion
    listed = rest.list_checkpoints(training.model_id).result().checkpoints
    assert [(c.checkpoint_type, c.tinker_path) for c in listed] == [
        ("training", saved.path),
        ("sampler", named.path),
    ]
    rest.publish_checkpoint_from_tinker_path(named.path).result()
    rest.set_checkpoint_ttl_from_tinker_path(named.path, 3600).result()
    shown = rest.list_checkpoints(training.model_id).result().checkpoints[1]
    assert shown.public and shown.expires_at is not None
    rest.delete_checkpoint_from_tinker_path(saved.path).result()
    assert [c.tinker_path for c in rest.list_checkpoints(training.model_id).result().checkpoints] == [
        named.path
    ]

    model = TinkerModel.objects.select_related("run").get()
    run = model.run
    assert (run.method, run.status, model.optim_steps) == ("tinker", Run.Status.RUNNING, STEPS + 1)
    assert run.learner_step == STEPS + 2  # the RL step, then the load: a run's steps only go forward
    recorded = list(
        MetricPoint.objects.filter(run=run, name="learner/loss")
        .order_by("step")
        .values_list("value", flat=True)
    )
    assert len(recorded) == STEPS and recorded[-1] < recorded[0]  # the RL step is no supervised step
    assert recorded[0] == pytest.approx(losses[0], rel=1e-3)  # the first step's loss, before any update
    assert Run.objects.get(pk=run.pk).policy_version == STEPS + 2  # the restored weights, published

    service.close("success").result()
    assert TinkerSession.objects.get().status == TinkerSession.Status.FINISHED
    wait_until(lambda: Run.objects.get(pk=run.pk).status == Run.Status.SUCCEEDED, "the run's end")

"""flywheel.cookbook's parts, without a server: the chat-template renderer against the tiny base's
own template, group rewards from a rule's score results, items as conversations, batches.
(tests/test_tinker_cookbook.py runs the cookbook's RL loop with them against a live server.)"""

import pickle

import pytest
from tinker_cookbook import renderers
from tinker_cookbook.renderers import ParseTermination, TrainOnWhat
from tinker_cookbook.tokenizer_utils import get_tokenizer

from flywheel import cookbook
from tests.run_harness import tiny_model

__all__ = ["tiny_model"]
TASK = [{"role": "user", "content": "Write f."}]
ANSWER = "def f(x):\n    return x\n"


@pytest.fixture
def renderer(tiny_model) -> cookbook.ChatTemplateRenderer:
    return renderers.get_renderer("chat_template", get_tokenizer(str(tiny_model)), model_name=str(tiny_model))


def test_the_generation_prompt_is_the_models_own_chat_template(renderer):
    prompt = renderer.build_generation_prompt(TASK)
    assert renderer.tokenizer.decode(prompt.to_ints()) == "### Task\nWrite f.\n### Solution\n"
    assert renderer.get_stop_sequences() == [renderer.tokenizer.eos_token_id]
    with_prefill = renderer.build_generation_prompt(TASK, prefill="def")
    assert renderer.tokenizer.decode(with_prefill.to_ints()).endswith("### Solution\ndef")


def test_a_supervised_example_trains_only_the_answer_and_its_eos(renderer):
    messages = [*TASK, {"role": "assistant", "content": ANSWER}]
    model_input, weights = renderer.build_supervised_example(messages)
    tokens = model_input.to_ints()
    prompt_length = renderer.build_generation_prompt(TASK).length
    assert weights.tolist() == [0.0] * prompt_length + [1.0] * (len(tokens) - prompt_length)
    trained = [token for token, weight in zip(tokens, weights.tolist(), strict=True) if weight]
    assert renderer.tokenizer.decode(trained) == ANSWER + renderer.tokenizer.eos_token
    # The cookbook's per-turn split (the renderer claims no extension property) gives one example.
    assert len(renderer.build_supervised_examples(messages, TrainOnWhat.LAST_ASSISTANT_TURN)) == 1


def test_what_it_cannot_train_or_render_is_refused_by_name(renderer):
    with pytest.raises(ValueError, match="end with an assistant message"):
        renderer.build_supervised_example(TASK)
    with pytest.raises(NotImplementedError, match="ALL_TOKENS|all_tokens"):
        renderer.build_supervised_example(
            [*TASK, {"role": "assistant", "content": "x"}], TrainOnWhat.ALL_TOKENS
        )
    with pytest.raises(ValueError, match="role 'user'"):
        renderer.build_generation_prompt(TASK, role="user")


def test_a_response_that_ends_at_eos_stopped_and_one_cut_short_is_malformed(renderer):
    tokens = renderer.tokenizer.encode(ANSWER, add_special_tokens=False)
    message, termination = renderer.parse_response([*tokens, renderer.tokenizer.eos_token_id])
    assert (message["content"], termination) == (ANSWER, ParseTermination.STOP_SEQUENCE)
    message, termination = renderer.parse_response(tokens[:5])
    assert termination == ParseTermination.MALFORMED
    assert message["content"] == renderer.tokenizer.decode(tokens[:5])


def test_a_tokenizer_without_a_chat_template_is_refused_naming_the_renderers_to_use(tiny_model):
    tokenizer = get_tokenizer(str(tiny_model))
    plain = type(tokenizer).from_pretrained(str(tiny_model))
    plain.chat_template = None
    with pytest.raises(ValueError, match="no chat template.*role_colon"):
        cookbook.ChatTemplateRenderer(plain)


def test_the_renderer_pickles_by_name_as_the_cookbooks_own_do(renderer):
    again = pickle.loads(pickle.dumps(renderer))
    assert isinstance(again, cookbook.ChatTemplateRenderer)
    assert again.build_generation_prompt(TASK).to_ints() == renderer.build_generation_prompt(TASK).to_ints()


def result(total, *, errored=False, flags=(), components=None, errors=()) -> dict:
    return {
        "total": total,
        "errored": errored,
        "flags": list(flags),
        "components": components if components is not None else {"tests": total},
        "errors": list(errors),
    }


def test_an_errored_score_gets_the_groups_mean_so_it_teaches_nothing():
    rewards = cookbook.group_rewards(
        [result(1.0), result(None, errored=True, components={}), result(0.0, flags=[{"detector": "x"}])]
    )
    assert [reward for reward, _ in rewards] == [1.0, 0.5, 0.0]
    assert [m["flywheel/errored"] for _, m in rewards] == [0.0, 1.0, 0.0]
    assert [m["flywheel/flagged"] for _, m in rewards] == [0.0, 0.0, 1.0]
    assert rewards[0][1]["flywheel/tests"] == 1.0
    mean = sum(reward for reward, _ in rewards) / 3
    assert rewards[1][0] - mean == pytest.approx(0.0)  # its centred advantage is zero


def test_a_group_the_rule_scored_none_of_raises_with_the_graders_reasons():
    failed = result(
        None, errored=True, errors=[{"grader": "tests", "kind": "sandbox_timeout", "message": "no sandbox"}]
    )
    with pytest.raises(RuntimeError, match="scored none of the group: no sandbox"):
        cookbook.group_rewards([failed, failed])


def test_an_item_is_its_conversation_or_its_prompt_as_a_user_turn():
    assert cookbook.item_messages({"data": {"prompt": "p"}}) == [{"role": "user", "content": "p"}]
    conversation = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert cookbook.item_messages({"data": {"messages": conversation, "prompt": "u"}}) == conversation


def test_a_dataset_serves_whole_batches_in_order(renderer):
    scorer = cookbook.RuleScorer(reward_rule=1, version=1, task_set_version=1)
    builders = [cookbook.TaskGroupBuilder(str(i), TASK, renderer, scorer, group_size=2) for i in range(7)]
    dataset = cookbook.TaskSetRLDataset(builders, batch_size=3)
    assert len(dataset) == 2
    assert [b.item_id for b in dataset.get_batch(1)] == ["3", "4", "5"]

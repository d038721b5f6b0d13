"""The demo agent family (`workers/agent_demo.py`) in small: its items, the expert's plans, the
protocol's tokens added to a tokenizer, and the held-out agent figures the evaluation writes.
`make bench-agent-lift` runs the whole lift (teach, GRPO through the real workers); this covers its
parts quickly."""

import json
from dataclasses import replace

import pytest
import torch

from inference.tool_chat import tool_calls_parse
from projects import demo_tasks
from workers.agent_demo import (
    PROTOCOL_TOKENS,
    SOLUTION,
    agent_demo_items,
    call,
    expert_plans,
    expert_play,
    protocol_tokens_add,
    spec_of,
)
from workers.base_model import BaseModelConfig, model_create, tokenizer_train
from workers.run_eval import agent_figures

WRITE = call("write_file", path=SOLUTION, content="def g(n):\n    return n + 5\n")


def test_train_and_held_out_items_are_disjoint_and_held_out_of_the_base_corpus():
    items = agent_demo_items(seed=0, train_size=16, heldout_size=8)
    train, heldout = ({item["id"] for item in items[split]} for split in ("train", "heldout"))
    assert len(train) == 16 and len(heldout) == 8 and not train & heldout
    # The base model's corpus is drawn from demo_split(0, 160)'s train side only.
    _, corpus_heldout = demo_tasks.demo_split(0, 160)
    assert {f"fix-{spec.key}" for spec in corpus_heldout} >= heldout
    item = items["heldout"][0]
    spec = spec_of(item)
    assert item["files"][SOLUTION] == f"def {spec.name}({spec.argument}):\n    return {spec.argument}\n"
    assert item["tools"] == ["read_file", "write_file", "run_tests", "submit"]


def test_the_expert_is_right_at_its_phrase_rate_and_otherwise_off_by_one():
    items = agent_demo_items(seed=0, train_size=40, heldout_size=2)["train"]
    plans = expert_plans(items, seed=3, right=(1.0, 0.0, 0.0, 0.0), mistakes=0.0)
    for item, plan in zip(items, plans, strict=True):
        assert [json.loads(action[11:-12])["name"] for action in plan] == [
            "read_file",
            "write_file",
            "run_tests",
            "submit",
        ]
        written = json.loads(plan[1][11:-12])["arguments"]["content"]
        right = demo_tasks.solution(spec_of(item))
        spec = spec_of(item)
        slipped = demo_tasks.solution(replace(spec, constant=spec.constant + 1))
        assert written == (right if item["metadata"]["phrase"] == 0 else slipped)
    with_mistakes = expert_plans(items, seed=3, mistakes=1.0)
    assert all(plan[0] == call("read_file") and len(plan) == 5 for plan in with_mistakes)
    assert expert_plans(items, seed=3) == expert_plans(items, seed=3)  # seeded


def test_protocol_tokens_shorten_a_call_round_trip_and_start_from_their_spelling():
    texts = [WRITE, '<tool_result name="read_file">\ndef g(n):\n    return n + 5\n</tool_result>'] * 4
    tokenizer = tokenizer_train(texts, 300)
    config = BaseModelConfig(vocab_size=300, hidden_size=16, layers=1, heads=2, intermediate_size=32)
    model = model_create(config, tokenizer)
    before = len(tokenizer(WRITE)["input_ids"])
    spelled = {text: tokenizer(text, add_special_tokens=False)["input_ids"] for text in PROTOCOL_TOKENS}
    old = model.get_input_embeddings().weight.detach().clone()
    added = protocol_tokens_add(model, tokenizer)
    assert added == sum(len(ids) > 1 for ids in spelled.values()) and added > 0
    ids = tokenizer(WRITE)["input_ids"]
    assert len(ids) < before and tokenizer.decode(ids) == WRITE
    weights = model.get_input_embeddings().weight
    assert weights.shape[0] == len(tokenizer)
    for text, spelling in spelled.items():
        if len(spelling) > 1:
            token = tokenizer.convert_tokens_to_ids(text)
            assert torch.allclose(weights[token], old[spelling].mean(dim=0))
    assert model.get_output_embeddings().weight.shape[0] == len(tokenizer)  # tied
    assert protocol_tokens_add(model, tokenizer) == 0  # a second call adds nothing


@pytest.mark.timeout(300)
def test_expert_episodes_play_for_real_and_give_the_held_out_agent_figures():
    items = agent_demo_items(seed=0, train_size=2, heldout_size=2)["train"]
    spec = spec_of(items[0])
    right = demo_tasks.solution(spec)
    plans = [
        [call("read_file")]
        + [call("write_file", path=SOLUTION, content=right), call("run_tests"), call("submit")],
        [call("read_file", path=SOLUTION), call("run_tests"), call("submit")],
    ]
    first, second = expert_play(items, plans)
    assert first.grade.total == 1.0 and second.grade.total == 0.0
    assert [turn.valid for turn in first.turns] == [False, True, True, True]
    assert tool_calls_parse(second.turns[0].completion.text, second.tools)[0].arguments == {"path": SOLUTION}
    assert agent_figures([first, second]) == {
        "heldout/agent/invalid_rate": pytest.approx(1 / 7),
        "heldout/agent/steps": 3.5,
    }

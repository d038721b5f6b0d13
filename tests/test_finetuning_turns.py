"""Every assistant message with weight 1 trains, each on the conversation before it, as OpenAI's
supervised fine-tuning does; a weight-0 one is context only."""

from finetuning.formats import SUPERVISED, item_data, line_problems
from workers.learners.sft import run_data

CONVERSATION = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},  # weight 1 by default
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "7", "weight": 0},
        {"role": "user", "content": "Sure?"},
        {"role": "assistant", "content": "6", "weight": 1},
    ]
}


def test_each_weight_1_reply_is_an_example_on_its_own_context_and_weight_0_is_only_context():
    assert line_problems(1, CONVERSATION, SUPERVISED) == []
    item = item_data(CONVERSATION, SUPERVISED)
    examples = run_data(None, [item])
    system, first = {"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}
    assert examples == [
        {"prompt": [system, first], "completion": "4"},
        {
            "prompt": [
                system,
                first,
                {"role": "assistant", "content": "4"},
                {"role": "user", "content": "3+3?"},
                {"role": "assistant", "content": "7"},
                {"role": "user", "content": "Sure?"},
            ],
            "completion": "6",
        },
    ]
    assert item["reference"] == "6" and len(item["earlier_turns"]) == 1


def test_a_single_trained_reply_has_no_earlier_turns():
    line = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    item = item_data(line, SUPERVISED)
    assert "earlier_turns" not in item
    assert run_data(None, [item]) == [{"prompt": [{"role": "user", "content": "hi"}], "completion": "hello"}]


def test_an_empty_trained_reply_anywhere_is_refused_naming_it():
    line = {
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "  "},
            {"role": "user", "content": "b"},
            {"role": "assistant", "content": "c"},
        ]
    }
    problems = line_problems(3, line, SUPERVISED)
    assert [(p.line, p.field) for p in problems] == [(3, "messages[1].content")]

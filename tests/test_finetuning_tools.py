"""Supervised lines with tools train on what the model reads: the conversation, its tool calls and
results rendered by the chat template with `tools=` (or by Flywheel's tool protocol when the
template takes none), the trained reply being what it adds; weight-0 replies stay context."""

import json

import pytest

from finetuning import formats
from inference.tool_chat import reply_render
from tests.model_families import FAMILIES, tokenizer_build
from workers.learners.common import text_batch
from workers.learners.sft import sft_examples, sft_texts

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CALLING = {
    "messages": [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me guess: rain.", "weight": 0},
        {"role": "user", "content": "Check, please."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
    ],
    "tools": [WEATHER],
}
ANSWERING = {
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18C, sunny"},
        {"role": "assistant", "content": "18C and sunny."},
    ],
    "tools": [WEATHER],
}
# Qwen 2.5's way with tools, cut down (transformers renders templates with trim_blocks, so the
# newline after a block tag is dropped): tools as JSON in the system turn, calls as <tool_call> JSON
# with the arguments as an object, results as a user turn's <tool_response>.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}"
    "{{ messages[0]['content'] }}\n\n{% endif %}# Tools\n<tools>{% for tool in tools %}\n"
    "{{ tool | tojson }}{% endfor %}\n</tools><|im_end|>\n"
    "{%- elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n"
    "{%- endif %}{%- for message in messages %}{%- if message.role == 'system' %}"
    "{%- elif message.role == 'assistant' %}<|im_start|>assistant\n{{ message.content }}"
    "{%- for call in message.tool_calls or [] %}<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def chatml():
    return tokenizer_build(FAMILIES["qwen2"])


@pytest.fixture
def with_tools(chatml):
    plain = chatml.chat_template
    chatml.chat_template = TOOLS_TEMPLATE
    yield chatml
    chatml.chat_template = plain


def example_of(line: dict) -> dict:
    data = formats.item_data(line, formats.SUPERVISED)
    return sft_examples([{"prompt": data["messages"], "completion": data["reference"], **data}])[0]


def test_a_line_without_tools_keeps_training_as_a_plain_chat():
    assert "tool_chat" not in formats.item_data(
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
        formats.SUPERVISED,
    )


def test_a_template_with_tools_renders_the_tools_the_call_and_the_result(with_tools):
    prompt, completion = sft_texts(with_tools, example_of(CALLING), chat=True)
    assert prompt.startswith("<|im_start|>system\nYou are a weather bot.\n\n# Tools\n<tools>{")
    assert json.dumps(WEATHER) in prompt
    # The weight-0 reply is context, in the prompt; the trained call is the completion, written as
    # the template writes a call (arguments as an object), closed by the trainer's end of turn.
    assert "<|im_start|>assistant\nLet me guess: rain.<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>user\nCheck, please.<|im_end|><|im_start|>assistant\n")
    assert completion == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'

    prompt, completion = sft_texts(with_tools, example_of(ANSWERING), chat=True)
    assert "<tool_response>\n18C, sunny\n</tool_response>" in prompt
    assert '"arguments": {"city": "Paris"}' in prompt and completion == "18C and sunny."
    # The trained tokens are the template's own: prompt + completion + end of turn is the whole
    # conversation as the template renders it.
    data = formats.item_data(ANSWERING, formats.SUPERVISED)["tool_chat"]
    whole = with_tools.apply_chat_template(
        [*data["messages"], data["reply"]], tools=data["tools"], tokenize=False
    )
    assert whole == prompt + completion + "<|im_end|>"
    batch = text_batch(with_tools, [prompt], [completion])
    targets = batch.input_ids[0][batch.completion_mask[0].bool()].tolist()
    assert with_tools.decode(targets) == "18C and sunny.<|im_end|>"


def test_a_template_without_tools_gets_flywheels_tool_protocol(chatml):
    prompt, completion = sft_texts(chatml, example_of(CALLING), chat=True)
    assert "- get_weather" in prompt and "<tool_call>" in prompt  # the protocol, in the system turn
    assert completion == '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    prompt, completion = sft_texts(chatml, example_of(ANSWERING), chat=True)
    assert '<tool_result name="get_weather">\n18C, sunny\n</tool_result>' in prompt
    assert completion == "18C and sunny."


def test_legacy_functions_and_function_calls_render_as_tools(with_tools):
    line = {
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "function_call": {"name": "get_weather", "arguments": "{}"}},
        ],
        "functions": [WEATHER["function"]],
    }
    prompt, completion = reply_render(
        with_tools, *formats.item_data(line, formats.SUPERVISED)["tool_chat"].values()
    )
    assert json.dumps(WEATHER) in prompt
    assert completion == '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'

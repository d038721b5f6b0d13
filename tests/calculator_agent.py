"""A small model that plays examples/verifiers_envs/calculator.py (a verifiers ToolEnv) on Flywheel's
/v1: taught, by a short supervised run, expert conversations rendered exactly as /v1 renders the
ToolEnv's requests (the system prompt, the `calculate` tool in the text protocol, the call, the
tool's result as its own message). Like the demo's base models it only half-knows the family:
most of its teachers call the tool with the question's expression and answer with the result, the
rest answer at once with a guess one too high, so a group's rewards differ and RL has something to
learn: call the tool."""

import json
import random
from pathlib import Path

import torch

from inference import openai_protocol as protocol
from inference.tool_chat import chat_render
from workers.base_model import BaseModelConfig, model_create, tokenizer_train
from workers.learners.common import spans_batch

# As the environment sends them (calculator.SYSTEM_PROMPT, and verifiers' schema of `calculate`).
SYSTEM = "Use the calculate tool for arithmetic, then answer with the number alone."
TOOL = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an integer arithmetic expression.",
        "parameters": {
            "properties": {"expression": {"title": "Expression", "type": "string"}},
            "required": ["expression"],
            "title": "calculate_args",
            "type": "object",
        },
    },
}
CONFIG = BaseModelConfig(vocab_size=400, hidden_size=64, layers=2, heads=4, intermediate_size=128)


def calculator_items(count: int, *, seed: int, split: str) -> list[dict]:
    """Flywheel answer items "What is a + b?" (two-digit operands), the sum as reference."""
    rng = random.Random(seed)
    items = []
    for _ in range(count):
        a, b = rng.randrange(10, 50), rng.randrange(10, 50)
        items.append(
            {"kind": "answer", "prompt": f"What is {a} + {b}?", "reference": str(a + b), "split": split}
        )
    return items


def conversation(item: dict) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": item["prompt"]}]


def expert_turns(item: dict, *, calls_the_tool: bool) -> list[tuple[list[dict], str]]:
    """The expert's turns: (the conversation so far, its reply's text)."""
    messages = conversation(item)
    if not calls_the_tool:
        return [(messages, str(int(item["reference"]) + 1))]
    arguments = {"expression": item["prompt"].removeprefix("What is ").removesuffix("?")}
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "calculate", "arguments": json.dumps(arguments)},
    }
    answered = [
        *messages,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": item["reference"]},
    ]
    block = json.dumps({"name": "calculate", "arguments": arguments})
    return [(messages, f"<tool_call>{block}</tool_call>"), (answered, item["reference"])]


def prompt_text(tokenizer, messages: list[dict]) -> str:
    """The prompt /v1 renders for these messages with the environment's tool (the same parsing and
    rendering: inference.openai_protocol, inference.tool_chat)."""
    request = protocol.request_parse({"model": "m", "messages": messages, "tools": [TOOL]}, chat=True)
    return chat_render(tokenizer, request.messages, request.tools)


def calculator_agent_build(
    out_dir: Path, items: list[dict], *, tool_rate: float = 0.6, steps: int = 300, seed: int = 0
) -> Path:
    """A fresh tokenizer and model taught the experts' turns on `items` (the loss on the replies)."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    turns = [turn for item in items for turn in expert_turns(item, calls_the_tool=rng.random() < tool_rate)]
    tokenizer = tokenizer_train(
        [prompt_text(None, messages) + reply for messages, reply in turns], CONFIG.vocab_size
    )
    rows = []
    for messages, reply in turns:
        prompt = tokenizer(prompt_text(tokenizer, messages), add_special_tokens=False)["input_ids"]
        answer = tokenizer(reply, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((prompt + answer, [(len(prompt), len(prompt) + len(answer))]))
    model = model_create(CONFIG, tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        chosen = [rows[rng.randrange(len(rows))] for _ in range(16)]
        batch = spans_batch([row[0] for row in chosen], [row[1] for row in chosen], tokenizer.pad_token_id)
        labels = batch.input_ids.masked_fill(batch.completion_mask == 0, -100)
        loss = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir

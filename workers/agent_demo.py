"""The demo agent task family, and teaching a base model the tool-call protocol by a short SFT run.

Family (`fix-*` items, from the demo tasks of projects/demo_tasks.py): `solution.py` holds the task's
function as a stub that returns its argument unchanged, `test_solution.py` its tests. The agent
reads the module, rewrites it with `write_file`, checks with `run_tests`, and submits;
`agent_check` runs the tests on the final workspace. What the agent must get right is what the
base model half-knows from its corpus: the operation and constant the description names (the
corpus writes the constant off by one for most phrases much of the time).

Teaching: expert episodes are played for real (a scripted policy, in sandboxes, so every tool
result is exactly what a rollout would show), then the base model is fine-tuned on them: each
episode one token sequence built the way generation builds it (`inference.sessions`), the loss on
the assistant turns only. Like the corpus, the expert's fix is right only part of the time, so the
taught model "half-knows" the family and RL has something to lift.
"""

import json
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from inference.generation import Completion
from inference.policy import policy_load
from inference.sessions import Transcript, transcript_answer, transcript_extend
from inference.tool_chat import BUILTIN_TOOLS, PROTOCOL, tool_line
from projects import demo_tasks
from workers.agent import AgentEpisode, episodes_play, plain_render, policy_render
from workers.base_model import BaseModelConfig, model_create, tokenizer_train
from workers.learners.common import spans_batch

SOLUTION, TESTS = "solution.py", "test_solution.py"
SYSTEM = "Fix the code."
CONTEXT = 1024  # positions the taught model attends over (the base model's 256 are too few)
# Strings of the text protocol added to a small tokenizer as tokens of their own (tool-calling models
# ship theirs; a byte-level BPE trained on code spells a call in ~100 tokens, in ~25 with these). The
# system message's fixed text (the protocol's line, each built-in tool's line) is among them: the
# tiny base was pretrained on 256 positions, and with it spelled out the answer would start past them.
PROTOCOL_TOKENS = (
    PROTOCOL.split("{tools}")[0].format(),
    *(tool_line(tool) for tool in BUILTIN_TOOLS.values()),
    '<tool_call>{"name": "',
    '", "arguments": {',
    "}}</tool_call>",
    '"path": "',
    '"content": "',
    '<tool_result name="',
    "</tool_result>",
    "read_file",
    "write_file",
    "run_tests",
    "submit",
    SOLUTION,
    "\\n    return ",
    '\\n"',
)
# How often the expert's fix is right, by the task's phrase (demo_tasks.PHRASES): otherwise its
# constant is off by one, the corpus's own slip.
EXPERT_RIGHT = (0.9, 0.4, 0.4, 0.4)


def agent_item(spec: demo_tasks.TaskSpec) -> dict:
    """A `fix` agent item: the function as a stub (it returns its argument), and its tests."""
    broken = f"def {spec.name}({spec.argument}):\n    return {spec.argument}\n"
    return {
        "id": f"fix-{spec.key}",
        "kind": "agent",
        "system": SYSTEM,
        "instructions": f"{demo_tasks.describe(spec)} {SOLUTION} fails its tests: fix it.",
        "files": {SOLUTION: broken, TESTS: demo_tasks.tests(spec)},
        "check_command": f"python3 {TESTS}",
        "test_file": TESTS,
        "tools": ["read_file", "write_file", "run_tests", "submit"],
        "max_steps": 6,
        "metadata": {"family": "fix", "op": spec.op, "phrase": spec.phrase},
    }


def agent_demo_items(*, seed: int, train_size: int, heldout_size: int) -> dict[str, list[dict]]:
    """Train and held-out `fix` items (scalar tasks), disjoint, from the demo split."""
    train, heldout = demo_tasks.demo_split(seed, max(heldout_size * 2, 2))
    scalar = [spec for spec in train if spec.kind == "scalar"][:train_size]
    held = [spec for spec in heldout if spec.kind == "scalar"][:heldout_size]
    return {
        "train": [agent_item(spec) | {"split": "train"} for spec in scalar],
        "heldout": [agent_item(spec) | {"split": "heldout"} for spec in held],
    }


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def expert_actions(item: dict, constant_error: int = 0, *, mistake: bool = False) -> list[str]:
    """The expert's turns: read, fix (its constant off by `constant_error`), test, submit;
    `mistake` first makes one invalid call (read_file without its path)."""
    spec = spec_of(item)
    fix = demo_tasks.solution(replace(spec, constant=spec.constant + constant_error))
    actions = [
        call("read_file", path=SOLUTION),
        call("write_file", path=SOLUTION, content=fix),
        call("run_tests"),
        call("submit"),
    ]
    return ([call("read_file")] if mistake else []) + actions


def expert_plans(
    items: list[dict], *, seed: int, right=EXPERT_RIGHT, mistakes: float = 0.2
) -> list[list[str]]:
    """Each item's expert actions: the fix right at its phrase's rate in `right` (else its constant
    off by one), and a share `mistakes` of episodes opening with an invalid call."""
    rng = random.Random(seed)
    plans = []
    for item in items:
        error = 0 if rng.random() < right[item["metadata"]["phrase"]] else 1
        plans.append(expert_actions(item, error, mistake=rng.random() < mistakes))
    return plans


def protocol_tokens_add(model, tokenizer) -> int:
    """Give the protocol's strings tokens of their own; each new embedding starts as the mean of
    the embeddings of the tokens that spelled it. How many were added."""
    spelled = {text: tokenizer(text, add_special_tokens=False)["input_ids"] for text in PROTOCOL_TOKENS}
    added = tokenizer.add_tokens([text for text in PROTOCOL_TOKENS if len(spelled[text]) > 1])
    if not added:
        return 0
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    weights = model.get_input_embeddings().weight
    with torch.no_grad():
        for text, ids in spelled.items():
            token = tokenizer.convert_tokens_to_ids(text)
            if len(ids) > 1 and token is not None and token >= weights.shape[0] - added:
                weights[token] = weights[ids].mean(dim=0)
    return added


def spec_of(item: dict) -> demo_tasks.TaskSpec:
    key = item["id"].removeprefix("fix-")
    return next(spec for spec in demo_tasks.all_specs() if spec.key == key)


def expert_play(items: list[dict], actions: list[list[str]]) -> list[AgentEpisode]:
    """Play each item's scripted actions for real (sandboxes, tools, grading)."""
    plans = [list(plan) for plan in actions]
    waves = {"start": 0}  # waves play in order; each scripted session serves one

    class Scripted:
        def __init__(self) -> None:
            self.start, self.first = waves["start"], True

        def turn(self, keys: list[int], prompts: list[str]) -> list[Completion]:
            if self.first:  # every episode of a wave plays its first turn together
                waves["start"] += len(keys)
                self.first = False
            texts = [plans[self.start + key].pop(0) for key in keys]
            return [Completion(text=text, token_ids=[], logprobs=[], finish_reason="stop") for text in texts]

    rule = {"type": "agent_check", "name": "check"}
    return episodes_play(items, lambda prompts: [], rule=rule, sessions=Scripted)


@dataclass
class TeachReport:
    episodes: int
    steps: int
    final_loss: float
    seconds: float
    tokens: int  # in the longest episode


def teach_sequences(tokenizer, episodes: list[AgentEpisode]) -> tuple[list[list[int]], list[list[tuple]]]:
    """Each episode as the token sequence generation would build, and its assistant spans."""
    render = policy_render(type("P", (), {"tokenizer": tokenizer})())
    sequences, spans = [], []
    for episode in episodes:
        transcript, row = Transcript(), []
        messages = episode.conversation()
        for position, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            transcript_extend(tokenizer, transcript, render(messages[:position], episode.tools))
            answer = tokenizer(message["raw"], add_special_tokens=False)["input_ids"] + [
                tokenizer.eos_token_id
            ]
            start = len(transcript.token_ids)
            transcript_answer(transcript, message["raw"], answer, tokenizer.eos_token_id)
            row.append((start, len(transcript.token_ids)))
        sequences.append(transcript.token_ids)
        spans.append(row)
    return sequences, spans


def agent_policy_build(
    out_dir: str | Path,
    episodes: list[AgentEpisode],
    *,
    vocab_size: int = 512,
    hidden_size: int = 64,
    layers: int = 2,
    steps: int = 120,
    learning_rate: float = 5e-3,
    seed: int = 0,
    log=print,
) -> TeachReport:
    """A small policy that knows only these episodes: a tokenizer trained on their transcripts, a
    fresh model taught them. What the suite's real agent runs use: a model, not a script, that
    calls tools (and makes the episodes' mistakes) through the whole product path."""
    out = Path(out_dir)
    texts = [plain_render(episode.conversation(), episode.tools) for episode in episodes]
    tokenizer = tokenizer_train(texts, vocab_size)
    config = BaseModelConfig(
        seed=seed,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        layers=layers,
        heads=4,
        intermediate_size=hidden_size * 2,
    )
    model_create(config, tokenizer).save_pretrained(out / "untaught")
    tokenizer.save_pretrained(out / "untaught")
    return agent_teach(
        out / "untaught",
        out,
        episodes,
        steps=steps,
        batch_size=1,
        learning_rate=learning_rate,
        seed=seed,
        log=log,
    )


def agent_teach(
    source: str | Path,
    target: str | Path,
    episodes: list[AgentEpisode],
    *,
    steps: int = 300,
    batch_size: int = 8,
    learning_rate: float = 2e-3,
    seed: int = 0,
    protocol_tokens: bool = False,
    log=print,
) -> TeachReport:
    """Fine-tune the model at `source` on the episodes' assistant turns; save it to `target`.
    `protocol_tokens` first adds the protocol's strings to the tokenizer (`protocol_tokens_add`)."""
    started = time.monotonic()
    torch.manual_seed(seed)
    policy = policy_load(source)
    model, tokenizer = policy.model, policy.tokenizer
    if protocol_tokens:
        protocol_tokens_add(model, tokenizer)
    model.config.max_position_embeddings = max(CONTEXT, int(model.config.max_position_embeddings))
    sequences, spans = teach_sequences(tokenizer, episodes)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    model.train()
    loss = torch.tensor(0.0)
    for step in range(steps):
        rows = [rng.randrange(len(sequences)) for _ in range(batch_size)]
        batch = spans_batch([sequences[r] for r in rows], [spans[r] for r in rows], tokenizer.pad_token_id)
        labels = batch.input_ids.masked_fill(batch.completion_mask == 0, -100)
        loss = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == steps - 1:
            log(f"teach step {step:4d}  loss {loss.item():.4f}")
    model.eval()
    Path(target).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return TeachReport(
        episodes=len(episodes),
        steps=steps,
        final_loss=round(loss.item(), 4),
        seconds=round(time.monotonic() - started, 1),
        tokens=max(len(sequence) for sequence in sequences),
    )

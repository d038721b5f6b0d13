"""A tool-use `verifiers` environment (ToolEnv) for Flywheel answer items of arithmetic ("What is
17 * 23 + 4?", reference "395"): the model may call a small Python tool, `calculate`, as often as
it likes within the turns, then answers with the number. The rubric rewards the right number in the
last answer; the tool calls are counted as metrics (weight 0), which Flywheel keeps as components.

    flywheel env run examples/verifiers_envs/calculator.py RUN_ID
"""

import ast
import json
import operator
import re
from typing import Any

import verifiers as vf
from datasets import Dataset

SYSTEM_PROMPT = "Use the calculate tool for arithmetic, then answer with the number alone."
OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
NUMBER = re.compile(r"-?\d+")


def value_of(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](value_of(node.left), value_of(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -value_of(node.operand)
    raise ValueError("only integers and + - * // % are allowed")


def calculate(expression: str) -> str:
    """Evaluate an integer arithmetic expression.

    Args:
        expression: integers with + - * // % and parentheses, e.g. "17 * 23 + 4"

    Returns:
        The expression's value.
    """
    return str(value_of(ast.parse(expression, mode="eval").body))


def last_answer(completion: Any) -> str:
    messages = [m if isinstance(m, dict) else m.model_dump() for m in completion]
    answers = [m.get("content") or "" for m in messages if m.get("role") == "assistant"]
    return str(answers[-1]) if answers else ""


def correct_answer(completion: Any, answer: str, **kwargs: Any) -> float:
    """1 when the last number of the final answer is the reference."""
    numbers = NUMBER.findall(last_answer(completion))
    return float(bool(numbers) and numbers[-1] == answer.strip())


def flywheel_row(task: dict) -> dict:
    """A Flywheel answer item as this environment's row: the question, the reference as answer."""
    return {
        "prompt": [{"role": "user", "content": task["prompt"]}],
        "answer": str(task["reference"]),
        "info": {"id": task.get("id")},
    }


def load_environment(items_path: str | None = None, max_turns: int = 4, **kwargs: Any) -> vf.Environment:
    """The environment; its dataset is a JSONL file of Flywheel answer items when given."""
    if items_path:
        with open(items_path) as lines:
            items = [json.loads(line) for line in lines if line.strip()]
    else:
        items = [{"prompt": "What is 17 * 23 + 4?", "reference": "395"}]
    rows = [flywheel_row(item) for item in items]
    dataset = Dataset.from_list([row | {"info": json.dumps(row["info"])} for row in rows])
    rubric = vf.Rubric(funcs=[correct_answer], weights=[1.0])
    return vf.ToolEnv(
        dataset=dataset,
        system_prompt=SYSTEM_PROMPT,
        tools=[calculate],
        max_turns=max_turns,
        rubric=rubric,
        **kwargs,
    )

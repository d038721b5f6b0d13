"""A single-turn `verifiers` environment with a rubric, for Flywheel's demo items ("Write a Python
function `f(n)` that returns 3 more than n."). The rubric never runs the model's code: it reads the
function the completion defines, evaluates its `return` expression on the item's test inputs
(arithmetic only), and compares with the values the item's asserts expect.

    flywheel env run examples/verifiers_envs/function_writer.py RUN_ID
    flywheel env eval examples/verifiers_envs/function_writer.py --items heldout.jsonl --model tier-3
"""

import ast
import json
import operator
from typing import Any

import verifiers as vf
from datasets import Dataset

OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def completion_text(completion: Any) -> str:
    """The model's answer: the last assistant message's text (or the text of a plain completion)."""
    if isinstance(completion, str):
        return completion
    messages = [m if isinstance(m, dict) else m.model_dump() for m in completion]
    answers = [m.get("content") or "" for m in messages if m.get("role") == "assistant"]
    return str(answers[-1]) if answers else ""


def test_cases(tests: str) -> list[tuple[Any, Any]]:
    """The (input, expected) pairs of the item's `assert f(x) == y` lines."""
    cases = []
    for node in ast.parse(tests).body:
        if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare):
            call, expected = node.test.left, node.test.comparators[0]
            if isinstance(call, ast.Call) and len(call.args) == 1:
                cases.append((ast.literal_eval(call.args[0]), ast.literal_eval(expected)))
    return cases


def arithmetic(node: ast.AST, names: dict[str, Any]) -> Any:
    """An arithmetic expression's value over integer constants and the function's argument."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](arithmetic(node.left, names), arithmetic(node.right, names))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -arithmetic(node.operand, names)
    raise ValueError("not arithmetic")


def defined_function(text: str, name: str) -> ast.FunctionDef | None:
    """The function `name` the text defines, if it parses as Python and defines it."""
    try:
        module = ast.parse(text.strip().removeprefix("```python").strip("`\n "))
    except SyntaxError:
        return None
    found = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == name]
    return found[0] if found else None


def passes_tests(completion: Any, info: dict, **kwargs: Any) -> float:
    """1 when the defined function returns what every one of the item's asserts expects."""
    function = defined_function(completion_text(completion), info.get("entry_point", ""))
    cases = test_cases(info.get("tests", ""))
    if function is None or not cases or len(function.args.args) != 1:
        return 0.0
    returns = function.body[-1]
    if not isinstance(returns, ast.Return) or returns.value is None:
        return 0.0
    argument = function.args.args[0].arg
    try:
        return float(all(arithmetic(returns.value, {argument: x}) == y for x, y in cases))
    except (ValueError, ZeroDivisionError, TypeError):
        return 0.0


def defines_function(completion: Any, info: dict, **kwargs: Any) -> float:
    """1 when the answer parses and defines the function the task names (a metric: weight 0)."""
    return float(defined_function(completion_text(completion), info.get("entry_point", "")) is not None)


def flywheel_row(task: dict) -> dict:
    """A Flywheel item as this environment's dataset row: its prompt as the user's turn, its
    reference solution as the answer, and the item itself (tests, entry point) as `info`."""
    return {
        "prompt": [{"role": "user", "content": task["prompt"]}],
        "answer": task.get("reference_solution", ""),
        "info": task,
    }


def load_environment(items_path: str | None = None, **kwargs: Any) -> vf.Environment:
    """The environment; its dataset is a JSONL file of Flywheel items when given (else one example)."""
    if items_path:
        with open(items_path) as lines:
            items = [json.loads(line) for line in lines if line.strip()]
    else:
        items = [
            {
                "prompt": "Write a Python function `f(n)` that returns 3 more than n.",
                "tests": "from solution import f\n\nassert f(2) == 5\nassert f(7) == 10\n",
                "entry_point": "f",
                "reference_solution": "def f(n):\n    return n + 3\n",
            }
        ]
    rows = [flywheel_row(item) for item in items]
    dataset = Dataset.from_list([row | {"info": json.dumps(row["info"])} for row in rows])
    rubric = vf.Rubric(funcs=[passes_tests, defines_function], weights=[1.0, 0.0])
    return vf.SingleTurnEnv(dataset=dataset, rubric=rubric, **kwargs)

"""The `calculate_output` of a multi grader: arithmetic over the sub-graders' results, never Python eval.

A formula names sub-graders by their keys in `graders` and may use numbers, `+ - * / // %`, powers
written `**` or `^` (OpenAI's notation), comparisons (true is 1), `and`/`or`/`not`, `a if c else b`,
and the functions in FUNCTIONS. Anything else (attributes, subscripts, strings, lambdas, other calls)
is refused when the rule is checked. The checked tree is then evaluated by simpleeval with only these
operators and functions, so no Python eval or exec of user text happens anywhere.
"""

import ast
import math
import operator
from dataclasses import dataclass
from typing import Any

from simpleeval import InvalidExpression, SimpleEval

MAX_POWER = 1000.0
# What scoring can evaluate, checked when the rule is: the evaluator recurses once per operation,
# so a formula may nest at most MAX_FORMULA_DEPTH operations (a sum of n terms nests n - 1).
MAX_FORMULA_LENGTH = 10_000
MAX_FORMULA_DEPTH = 100


def clamp(value: float, low: float, high: float) -> float:
    """value held inside [low, high].

    >>> clamp(1.7, 0, 1), clamp(-2, 0, 1), clamp(0.5, 0, 1)
    (1, 0, 0.5)
    """
    return max(low, min(high, value))


def safe_power(base: float, exponent: float) -> float:
    if abs(exponent) > MAX_POWER:
        raise FormulaError(f"exponent {exponent} is too large (at most {MAX_POWER:g})")
    return float(base) ** exponent


FUNCTIONS = {
    "min": min,
    "max": max,
    "abs": abs,
    "clamp": clamp,
    "floor": math.floor,
    "ceil": math.ceil,
    "round": round,
    "exp": math.exp,
    "sqrt": math.sqrt,
    "log": math.log,
}
OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: safe_power,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Not: operator.not_,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
ALLOWED = (
    ast.Expression,
    ast.BinOp,
    ast.UnaryOp,
    ast.Compare,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.IfExp,
    ast.Call,
    ast.Name,
    ast.Load,
    ast.Constant,
    *OPERATORS,
)
CONSTRUCT_NAMES = {
    ast.Attribute: "attribute access",
    ast.Subscript: "subscripts",
    ast.Lambda: "lambdas",
    ast.ListComp: "comprehensions",
    ast.GeneratorExp: "comprehensions",
    ast.NamedExpr: "assignment expressions",
    ast.List: "lists",
    ast.Tuple: "tuples",
    ast.Dict: "dicts",
    ast.JoinedStr: "f-strings",
}


class FormulaError(Exception):
    """The formula could not be evaluated for these values (a division by zero, a math domain error)."""


@dataclass(frozen=True)
class Formula:
    source: str
    tree: ast.Expr
    names: frozenset[str]

    def evaluate(self, values: dict[str, float]) -> float:
        """The formula's value; raises FormulaError when it has none.

        >>> names = {"tests", "invalid", "steps"}
        >>> formula, _ = parse_formula("2.0 * tests - 0.2 * invalid - 0.01 * steps", names)
        >>> formula.evaluate({"tests": 0.5, "invalid": 1, "steps": 4})
        0.76
        """
        evaluator = SimpleEval(operators=OPERATORS, functions=FUNCTIONS, names=values)
        try:
            result = evaluator.eval(self.source, previously_parsed=self.tree)
        except ZeroDivisionError:
            raise FormulaError(f"{self.source}: division by zero") from None
        except (ArithmeticError, ValueError, TypeError, InvalidExpression) as exc:
            raise FormulaError(f"{self.source}: {exc}") from None
        except RecursionError:  # validation bounds the depth; a deep caller stack could still hit it
            raise FormulaError(f"{self.source}: nests too deeply to evaluate") from None
        if isinstance(result, bool):
            return float(result)
        if not isinstance(result, (int, float)) or not math.isfinite(result):
            raise FormulaError(f"{self.source}: gave {result!r}, not a finite number")
        return float(result)


def _syntax_problem(source: str, exc: SyntaxError) -> str:
    """Where and why a formula does not parse; Python reports column 0 for an expression that
    ends too early, which names the end instead.

    >>> _syntax_problem("a +", SyntaxError("invalid syntax", ("<unknown>", 1, 0, "a +")))
    "ends with '+': a term is missing after it"
    """
    if source and source[-1] in "+-*/%^(,.":
        return f"ends with {source[-1]!r}: a term is missing after it"
    if not exc.offset:
        return f"does not parse: {exc.msg}"
    return f"does not parse at column {exc.offset}: {exc.msg}"


def parse_formula(source: str, names: set[str]) -> tuple[Formula | None, list[str]]:
    """The formula, or why it is refused. `names` are the sub-graders it may use.

    >>> parse_formula("tests + nope", {"tests"})[1]
    ["'nope' is not a sub-grader (sub-graders: tests)"]
    >>> parse_formula("0.5 * a + 0.5 * b ^ 2", {"a", "b"})[0].evaluate({"a": 1, "b": 0.5})
    0.625
    >>> parse_formula("tests.__class__", {"tests"})[1]
    ['attribute access is not allowed in a formula']
    """
    if not isinstance(source, str) or not source.strip():
        return None, ["must be a non-empty formula, e.g. 0.5 * a + 0.5 * b"]
    if len(source) > MAX_FORMULA_LENGTH:
        return None, [f"is too long: {len(source):,} characters (at most {MAX_FORMULA_LENGTH:,})"]
    try:
        # OpenAI's formulas write powers as a ^ b, binding tighter than * (formulas hold no strings)
        expression = ast.parse(source.strip().replace("^", "**"), mode="eval")
    except SyntaxError as exc:
        return None, [_syntax_problem(source.strip(), exc)]
    except (RecursionError, MemoryError):
        return None, [f"does not parse: it nests too deeply (at most {MAX_FORMULA_DEPTH} operations)"]
    depth = nesting_depth(expression.body)
    if depth > MAX_FORMULA_DEPTH:
        return None, [
            f"nests {depth} operations deep; scoring evaluates at most {MAX_FORMULA_DEPTH} "
            "(a sum of n terms nests n - 1: use fewer terms, or group them in sub-graders)"
        ]
    problems = construct_problems(expression) + name_problems(expression, names)
    if problems:
        return None, problems
    tree = ast.Expr(expression.body)  # the node simpleeval evaluates
    used = frozenset(node.id for node in ast.walk(expression) if isinstance(node, ast.Name))
    return Formula(source, tree, used), []


def nesting_depth(node: ast.AST) -> int:
    """How many operations nest inside each other at the deepest point, without recursion.

    >>> [nesting_depth(ast.parse(text, mode="eval").body) for text in ("a + b * c", "a", "-(-a)")]
    [2, 0, 2]
    """
    deepest = 0
    stack = [(node, 0)]
    while stack:
        current, depth = stack.pop()
        if isinstance(current, (ast.Name, ast.Constant)):
            continue
        depth += isinstance(current, ast.expr)
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in ast.iter_child_nodes(current))
    return deepest


def construct_problems(expression: ast.Expression) -> list[str]:
    problems: list[str] = []
    for node in ast.walk(expression):
        if not isinstance(node, ALLOWED):
            what = CONSTRUCT_NAMES.get(type(node), type(node).__name__)
            message = f"{what} {'is' if what.endswith('access') else 'are'} not allowed in a formula"
            if message not in problems:
                problems.append(message)
        elif isinstance(node, ast.Constant) and (isinstance(node.value, bool) or not is_number(node.value)):
            problems.append(f"{node.value!r} is not a number; formulas compute with numbers only")
        elif isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
                problems.append(f"only these functions may be called: {', '.join(FUNCTIONS)}")
            elif node.keywords or any(isinstance(arg, ast.Starred) for arg in node.args):
                problems.append(f"{node.func.id}() takes plain positional arguments")
    return problems


def name_problems(expression: ast.Expression, names: set[str]) -> list[str]:
    called = {id(node.func) for node in ast.walk(expression) if isinstance(node, ast.Call)}
    problems = []
    for node in ast.walk(expression):
        if isinstance(node, ast.Name) and id(node) not in called and node.id not in names:
            known = ", ".join(sorted(names)) or "none"
            problems.append(f"'{node.id}' is not a sub-grader (sub-graders: {known})")
    return problems


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)

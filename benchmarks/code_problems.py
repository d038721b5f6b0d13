"""Distinct candidate-style (HumanEval-shaped) code problems, generated from a seed, for benchmarks.

Each problem is a dict as HumanEval ships them (`task_id`, `prompt`: a signature and docstring,
`entry_point`, `test`: a `check(candidate)` with its own asserts, `canonical_solution`: the body) and
three completions of the body: the right one, a wrong one, and one that raises. No two problems share
an entry point, a test or a reference. The expected values in the tests come from running the
reference here, in the benchmark's process: it is this file's own code, never model output.
"""

import random
from collections.abc import Callable


def _ints(rng: random.Random, count: int, low: int = -50, high: int = 50) -> list[int]:
    return [rng.randint(low, high) for _ in range(count)]


def _words(rng: random.Random, count: int) -> str:
    syllables = ["ka", "lo", "mi", "tre", "zu", "fen", "qua", "ri", "sto", "vel"]
    return " ".join("".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(count))


# name, signature, docstring, body (uses the parameters in {braces}), wrong body, argument maker
FAMILIES: list[tuple[str, str, str, str, str, Callable[[random.Random], list]]] = [
    (
        "poly",
        "x",
        "Return {a} * x ** 2 + {b} * x + {c}.",
        "    return {a} * x ** 2 + {b} * x + {c}\n",
        "    return {a} * x ** 2 + {b} * x + {c} + (1 if x > 3 else 0)\n",
        lambda rng: [rng.randint(-20, 20)],
    ),
    (
        "count_multiples",
        "numbers",
        "Count the numbers that are multiples of {k} (zero counts).",
        "    return sum(1 for n in numbers if n % {k} == 0)\n",
        "    return sum(1 for n in numbers if n % {k} == 0 and n > 0)\n",
        lambda rng: [_ints(rng, rng.randint(0, 12))],
    ),
    (
        "sum_above",
        "numbers",
        "Sum the numbers strictly greater than {k}.",
        "    return sum(n for n in numbers if n > {k})\n",
        "    return sum(n for n in numbers if n >= {k})\n",
        lambda rng: [_ints(rng, rng.randint(0, 12))],
    ),
    (
        "rotate",
        "items",
        "Rotate the list left by {k} places (a copy).",
        "    if not items:\n        return []\n    shift = {k} % len(items)\n"
        "    return items[shift:] + items[:shift]\n",
        "    if not items:\n        return []\n    shift = {k} % len(items)\n"
        "    return items[-shift:] + items[:-shift]\n",
        lambda rng: [_ints(rng, rng.randint(0, 9))],
    ),
    (
        "caesar",
        "text",
        "Shift each lowercase letter {k} places forward in the alphabet, wrapping; keep the rest.",
        "    return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) if 'a' <= c <= 'z' else c for c in text)\n",
        "    return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) if 'a' <= c < 'z' else c for c in text)\n",
        lambda rng: [_words(rng, rng.randint(1, 5))],
    ),
    (
        "digit_sum",
        "n",
        "Return the sum of the digits of abs(n) written in base {base}.",
        "    n, total = abs(n), 0\n    while n:\n"
        "        n, digit = divmod(n, {base})\n        total += digit\n    return total\n",
        "    n, total = abs(n), 0\n    while n > {base}:\n"
        "        n, digit = divmod(n, {base})\n        total += digit\n    return total + n\n",
        lambda rng: [rng.randint(-5000, 5000)],
    ),
    (
        "run_lengths",
        "text",
        "Return [(char, count)] for each run of equal characters, stopping after {k} runs.",
        "    runs = []\n    for c in text:\n        if runs and runs[-1][0] == c:\n"
        "            runs[-1] = (c, runs[-1][1] + 1)\n"
        "        else:\n            runs.append((c, 1))\n    return runs[:{k}]\n",
        "    runs = []\n    for c in text:\n        if runs and runs[-1][0] == c:\n"
        "            runs[-1] = (c, runs[-1][1] + 1)\n"
        "        else:\n            runs.append((c, 1))\n    return runs[:{k} - 1]\n",
        lambda rng: ["".join(rng.choice("aab") for _ in range(rng.randint(0, 14)))],
    ),
    (
        "window_max",
        "numbers",
        "Return the maximum of each window of {k} consecutive numbers.",
        "    return [max(numbers[i:i + {k}]) for i in range(len(numbers) - {k} + 1)]\n",
        "    return [max(numbers[i:i + {k}]) for i in range(len(numbers) - {k})]\n",
        lambda rng: [_ints(rng, rng.randint(0, 10))],
    ),
]
PARAMETERS = {
    "poly": [{"a": a, "b": b, "c": c} for a in (1, 2, 3, -1) for b in (-2, 0, 5) for c in (1, 7)],
    "count_multiples": [{"k": k} for k in range(2, 22)],
    "sum_above": [{"k": k} for k in range(-10, 10)],
    "rotate": [{"k": k} for k in range(1, 21)],
    "caesar": [{"k": k} for k in range(1, 21)],
    "digit_sum": [{"base": base} for base in range(2, 22)],
    "run_lengths": [{"k": k} for k in range(2, 22)],
    "window_max": [{"k": k} for k in range(1, 21)],
}


def problems(count: int = 160, *, seed: int = 0, cases: int = 8) -> list[dict]:
    """`count` distinct problems (at most the parameter grid: 184), each with its own tests."""
    rng = random.Random(seed)
    made = []
    for name, argument, doc, body, wrong, make_args in FAMILIES:
        for index, values in enumerate(PARAMETERS[name]):
            entry_point = f"{name}_{index}"
            prompt = f'def {entry_point}({argument}):\n    """{doc.format(**values)}"""\n'
            canonical, broken = body.format(**values), wrong.format(**values)
            namespace: dict = {}
            exec(prompt + canonical, namespace)  # noqa: S102  (this module's own generated code)
            function = namespace[entry_point]
            lines = []
            for _ in range(cases):
                arguments = make_args(rng)
                lines.append(
                    f"    assert candidate({', '.join(map(repr, arguments))}) == {function(*arguments)!r}"
                )
            test = (
                "\n\nMETADATA = {'author': 'flywheel-bench'}\n\n\ndef check(candidate):\n"
                + "\n".join(lines)
                + "\n"
            )
            made.append(
                {
                    "task_id": f"Bench/{len(made)}",
                    "prompt": prompt,
                    "entry_point": entry_point,
                    "canonical_solution": canonical,
                    "test": test,
                    "completions": {
                        "right": canonical,
                        "wrong": broken,
                        "raises": f"    raise ValueError('cannot do {entry_point}')\n",
                    },
                }
            )
    rng.shuffle(made)
    return made[:count]

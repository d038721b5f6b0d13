"""Scoring: a reward rule (JSON data) scores a task item's sample and says how it got there.

The rule format is OpenAI's grader JSON, extended. A rule is one grader object:

    {"type": "multi",
     "graders": {"tests": {"type": "unit_tests"},
                 "invalid": {"type": "invalid_actions"},
                 "steps": {"type": "steps"}},
     "calculate_output": "2.0 * tests - 0.2 * invalid - 0.01 * steps"}

OpenAI's types keep their field names and meaning (string_check, text_similarity, score_model,
label_model, python, multi); Flywheel adds numeric, regex, json_schema, unit_tests, agent_check and
the trajectory checks invalid_actions, format_errors, steps, tokens_used (see `grader_catalog()`).
Text fields are templates over `item` and `sample` (rewards.templating); `calculate_output` is a
safe formula over the sub-graders' keys (rewards.formula). The top level may also carry
`"hacking_penalty"`, `"hacking_floor"` and `"hacking_opt_out"` (rewards.detectors).

Safe by default: a high-confidence hacking flag (rewards.detectors.HIGH_CONFIDENCE) sets the
total to the rule's floor (`hacking_floor`, default 0; never raises a lower total) unless the rule
lists that detector, or "*", in `hacking_opt_out`. Low-confidence flags only flag.

`score` returns a ScoreResult: the total, every named sub-reward (nested names joined with "."),
typed grader errors, `errored` and the hacking flags. What an error does to the numbers:

- the sample's fault (its code timed out): GraderError "sandbox_timeout", the component is 0;
- the rule cannot judge this sample (a template names a field the item lacks, the grader's own
  code raised, a judge's reply holds no score): the component is None, and so is every formula
  that uses it and the total; `errored` stays False;
- infrastructure (a sandbox that does not start or answer, no judge or a failing one): `errored`
  is True and the total None, so later stages mask the sample from learning instead of scoring 0.
"""

import copy
import json
import keyword
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from projects.task_format import COMMON_FIELDS as ITEM_COMMON_FIELDS
from projects.task_format import KIND_FIELDS
from rewards import detectors
from rewards.formula import FUNCTIONS, Formula, FormulaError, parse_formula
from rewards.graders import MULTI, grader_types
from rewards.graders.base import (
    MESSAGES,
    REGISTRY,
    TEXT,
    Context,
    Field,
    GraderError,
    GraderKind,
    GradingError,
    HackingFlag,
    Judge,
    RuleProblem,
    Sample,
    as_number,
)
from rewards.templating import Template, TemplateRenderError, compile_template, template_problems
from sandboxes.interface import InfrastructureError
from sandboxes.services import sandbox_pool

__all__ = [
    "GraderError",
    "HackingFlag",
    "Judge",
    "RuleError",
    "RuleProblem",
    "Sample",
    "ScoreResult",
    "grader_catalog",
    "score",
    "score_batch",
    "validate_rule",
]

RULE_FIELDS = ("hacking_penalty", "hacking_floor", "hacking_opt_out")  # allowed at the top level only
MULTI_FIELDS = {"type", "name", "graders", "calculate_output"}
# Compiling and scoring recurse once per multi: a bound checked with the rule keeps them in stack.
MAX_MULTI_DEPTH = 16


@dataclass
class ScoreResult:
    total: float | None
    components: dict[str, float | None] = field(default_factory=dict)
    errors: list[GraderError] = field(default_factory=list)
    errored: bool = False
    flags: list[HackingFlag] = field(default_factory=list)
    tests: list[dict] = field(
        default_factory=list
    )  # per test: name, passed, outcome, message, expected, actual
    stop_reason: str | None = None  # how the tested code stopped, where a unit_tests grader ran it

    def to_dict(self) -> dict:
        return {
            "total": self.total,
            "components": dict(self.components),
            "errors": [asdict(error) for error in self.errors],
            "errored": self.errored,
            "flags": [asdict(flag) for flag in self.flags],
            "tests": list(self.tests),
            "stop_reason": self.stop_reason,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "ScoreResult":
        return cls(
            total=data["total"],
            components=dict(data.get("components") or {}),
            errors=[GraderError(**error) for error in data.get("errors") or []],
            errored=bool(data.get("errored")),
            flags=[HackingFlag(**flag) for flag in data.get("flags") or []],
            tests=list(data.get("tests") or []),
            stop_reason=data.get("stop_reason"),
        )


class RuleError(ValueError):
    """A rule that does not validate was given to score; `problems` says what is wrong where."""

    def __init__(self, problems: list[RuleProblem]) -> None:
        super().__init__("; ".join(f"{problem.path or 'rule'}: {problem.message}" for problem in problems))
        self.problems = problems


# -- checking a rule ---------------------------------------------------------------------------


def validate_rule(spec: dict, *, item_kind: str | None = None) -> list[RuleProblem]:
    """Every problem of a rule, each at its dotted place; empty when the rule can score.

    With `item_kind` ("answer", "code", "agent"), templates naming an item field that kind lacks
    are problems too; without it they are caught when scoring (GraderError "bad_template").

    >>> validate_rule({"type": "steps", "name": "steps"})
    []
    >>> rule = {"type": "multi", "graders": {"a": {"type": "nope"}}, "calculate_output": "a + b"}
    >>> for problem in validate_rule(rule):
    ...     print(problem.path, "-", problem.message.split(":")[0])
    graders.a.type - unknown grader type 'nope'
    calculate_output - 'b' is not a sub-grader (sub-graders
    """
    if not isinstance(spec, dict):
        return [RuleProblem("", "a rule is a JSON object with a type")]
    item_fields = None
    if item_kind is not None:
        item_fields = set(ITEM_COMMON_FIELDS) | set(KIND_FIELDS.get(item_kind, {}))
    grader_spec = {key: value for key, value in spec.items() if key not in RULE_FIELDS}
    return grader_problems(grader_spec, "", item_fields) + penalty_problems(spec)


def place(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def grader_problems(
    spec: Any, path: str, item_fields: set[str] | None, multi_depth: int = 0
) -> list[RuleProblem]:
    if not isinstance(spec, dict):
        return [RuleProblem(path, "must be a grader: an object with a type")]
    type_name = spec.get("type")
    if type_name == MULTI:
        if multi_depth >= MAX_MULTI_DEPTH:
            return [RuleProblem(path, f"multi graders nest at most {MAX_MULTI_DEPTH} deep")]
        return multi_problems(spec, path, item_fields, multi_depth + 1)
    kind = REGISTRY.get(type_name) if isinstance(type_name, str) else None
    if kind is None:
        known = ", ".join(grader_types())
        what = "is required" if type_name is None else f"unknown grader type {type_name!r}"
        return [RuleProblem(place(path, "type"), f"{what}: one of {known}")]
    problems = []
    for name, spec_field in kind.fields.items():
        if name in spec:
            problems += field_problems(spec[name], spec_field, place(path, name), item_fields)
        elif spec_field.required:
            problems.append(RuleProblem(place(path, name), f"is required for a {type_name} grader"))
    for name in sorted(set(spec) - set(kind.fields)):
        takes = ", ".join(kind.fields)
        problems.append(
            RuleProblem(place(path, name), f"unknown field for a {type_name} grader (it takes {takes})")
        )
    if kind.check is not None:
        problems += [RuleProblem(place(path, name), message) for name, message in kind.check(spec)]
    return problems


def field_problems(
    value: Any, spec_field: Field, path: str, item_fields: set[str] | None
) -> list[RuleProblem]:
    if not type_matches(value, spec_field.types):
        return [RuleProblem(path, f"must be {type_words(spec_field.types)}")]
    if spec_field.choices and value not in spec_field.choices:
        return [RuleProblem(path, f"must be one of {', '.join(map(str, spec_field.choices))}; got {value!r}")]
    if spec_field.form == TEXT:
        return [RuleProblem(path, message) for message in template_problems(value, item_fields=item_fields)]
    if spec_field.form == MESSAGES:
        problems = []
        for index, message in enumerate(value):
            content = message.get("content") if isinstance(message, dict) else None
            for text in strings_in(content):
                problems += [
                    RuleProblem(f"{path}.{index}.content", problem)
                    for problem in template_problems(text, item_fields=item_fields)
                ]
        return problems
    return []


def multi_problems(
    spec: dict, path: str, item_fields: set[str] | None, multi_depth: int = 1
) -> list[RuleProblem]:
    problems = [
        RuleProblem(
            place(path, name),
            "unknown field for a multi grader (it takes type, name, graders, calculate_output)",
        )
        for name in sorted(set(spec) - MULTI_FIELDS)
    ]
    if "name" in spec and not isinstance(spec["name"], str):
        problems.append(RuleProblem(place(path, "name"), "must be a string"))
    graders = spec.get("graders")
    if not isinstance(graders, dict) or not graders:
        problems.append(RuleProblem(place(path, "graders"), "must be an object of named sub-graders"))
        graders = {}
    for key, sub in graders.items():
        where = place(path, f"graders.{key}")
        if not key.isidentifier() or keyword.iskeyword(key) or key in FUNCTIONS:
            problems.append(
                RuleProblem(
                    where, "a sub-grader's key must be a name a formula can use (not a function name)"
                )
            )
        problems += grader_problems(sub, where, item_fields, multi_depth)
    if "calculate_output" not in spec:
        problems.append(RuleProblem(place(path, "calculate_output"), "is required for a multi grader"))
    else:
        _, messages = parse_formula(spec["calculate_output"], set(graders))
        problems += [RuleProblem(place(path, "calculate_output"), message) for message in messages]
    return problems


def penalty_problems(spec: dict) -> list[RuleProblem]:
    problems = floor_problems(spec)
    penalty = spec.get("hacking_penalty")
    if penalty is None:
        return problems
    if not isinstance(penalty, dict):
        return problems + [RuleProblem("hacking_penalty", "must be an object: detector -> penalty")]
    for name, value in penalty.items():
        if name != "*" and name not in detectors.DETECTORS:
            known = ", ".join(detectors.DETECTORS)
            problems.append(RuleProblem(f"hacking_penalty.{name}", f"unknown detector: one of {known}, or *"))
        if not type_matches(value, (int, float)):
            problems.append(RuleProblem(f"hacking_penalty.{name}", "must be a number"))
    return problems


def floor_problems(spec: dict) -> list[RuleProblem]:
    problems = []
    if "hacking_floor" in spec and not type_matches(spec["hacking_floor"], (int, float)):
        problems.append(RuleProblem("hacking_floor", "must be a number: the reward of a flagged sample"))
    opt_out = spec.get("hacking_opt_out")
    if opt_out is None:
        return problems
    if not isinstance(opt_out, list) or not all(isinstance(name, str) for name in opt_out):
        return problems + [RuleProblem("hacking_opt_out", 'must be a list of detector names (or "*")')]
    known = ", ".join(detectors.HIGH_CONFIDENCE)
    for index, name in enumerate(opt_out):
        if name != "*" and name not in detectors.HIGH_CONFIDENCE:
            message = f"{name!r} is not a high-confidence detector: one of {known}, or *"
            problems.append(RuleProblem(f"hacking_opt_out.{index}", message))
    return problems


def type_matches(value: Any, types: type | tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        return False
    return isinstance(value, types)


def type_words(types: type | tuple[type, ...]) -> str:
    names = {
        str: "a string",
        int: "a number",
        float: "a number",
        list: "a list",
        dict: "an object",
        bool: "true or false",
    }
    kinds = types if isinstance(types, tuple) else (types,)
    return " or ".join(dict.fromkeys(names.get(kind, kind.__name__) for kind in kinds))


def strings_in(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [text for part in value for text in strings_in(part)]
    if isinstance(value, dict):
        return [text for part in value.values() for text in strings_in(part)]
    return []


# -- compiling a rule --------------------------------------------------------------------------


@dataclass
class Leaf:
    kind: GraderKind
    arguments: dict[str, Any]
    texts: dict[str, Template]
    structures: dict[str, Any]  # message lists whose strings are Templates

    def arguments_for(self, context: Context) -> dict[str, Any]:
        """The function's keyword arguments for this sample: the templates rendered."""
        kwargs = dict(self.arguments)
        if self.texts or self.structures:
            variables = context.variables()
            for name, template in self.texts.items():
                kwargs[name] = template.render(variables)
            for name, structure in self.structures.items():
                kwargs[name] = render_structure(structure, variables)
        return kwargs

    def run(self, context: Context) -> float:
        ready = context.notes.get(BATCHED, {})
        if id(self) in ready:  # scored with the whole batch (score_batch)
            value = ready[id(self)]
            if isinstance(value, BaseException):
                raise value
        else:
            kwargs = self.arguments_for(context)
            if self.kind.wants_context:
                kwargs["context"] = context
            value = self.kind.function(**kwargs)
        number = as_number(value) if isinstance(value, (int, float)) else None
        if number is None:
            raise GradingError("invalid_output", f"the grader returned {value!r}, not a number")
        return number


@dataclass
class Multi:
    children: dict[str, "Leaf | Multi"]
    formula: Formula


BATCHED = "batched"  # Context.notes key: values of batch graders, by leaf


@dataclass
class CompiledRule:
    root: Leaf | Multi
    name: str
    penalty: dict[str, float]
    floor: float
    opt_out: frozenset[str]
    uses_sandbox: bool
    uses_judge: bool
    batched: list[Leaf] = field(default_factory=list)  # leaves whose grader scores a batch at once


def compile_rule(spec: dict) -> CompiledRule:
    """The rule ready to score many samples; raises RuleError when it does not validate."""
    problems = validate_rule(spec)
    if problems:
        raise RuleError(problems)
    root = compile_node({key: value for key, value in spec.items() if key not in RULE_FIELDS})
    kinds = list(leaf_kinds(root))
    return CompiledRule(
        root=root,
        name=spec.get("name") or spec["type"],
        penalty={name: float(value) for name, value in (spec.get("hacking_penalty") or {}).items()},
        floor=float(spec.get("hacking_floor", 0.0)),
        opt_out=frozenset(spec.get("hacking_opt_out") or ()),
        uses_sandbox=any(kind.uses_sandbox for kind in kinds),
        uses_judge=any(kind.uses_judge for kind in kinds),
        batched=[leaf for leaf in leaves(root) if leaf.kind.batch is not None],
    )


def leaves(node: Leaf | Multi):
    if isinstance(node, Leaf):
        yield node
        return
    for child in node.children.values():
        yield from leaves(child)


def compile_node(spec: dict) -> Leaf | Multi:
    if spec["type"] == MULTI:
        children = {key: compile_node(sub) for key, sub in spec["graders"].items()}
        formula, _ = parse_formula(spec["calculate_output"], set(children))
        assert formula is not None  # compile_rule validated the spec, its formulas included
        return Multi(children, formula)
    kind = REGISTRY[spec["type"]]
    arguments, texts, structures = {}, {}, {}
    for name, value in spec.items():
        spec_field = kind.fields[name]
        if name in ("type", "name", "pass_threshold"):
            continue
        if spec_field.form == TEXT:
            texts[name] = compile_template(value)
        elif spec_field.form == MESSAGES:
            structures[name] = [
                dict(message, content=template_structure(message["content"])) for message in value
            ]
        else:
            arguments[name] = value
    return Leaf(kind, arguments, texts, structures)


def leaf_kinds(node: Leaf | Multi):
    if isinstance(node, Leaf):
        yield node.kind
        return
    for child in node.children.values():
        yield from leaf_kinds(child)


def template_structure(value: Any) -> Any:
    if isinstance(value, str):
        return compile_template(value)
    if isinstance(value, list):
        return [template_structure(part) for part in value]
    if isinstance(value, dict):
        return {key: template_structure(part) for key, part in value.items()}
    return value


def render_structure(value: Any, variables: dict) -> Any:
    if isinstance(value, Template):
        return value.render(variables)
    if isinstance(value, list):
        return [render_structure(part, variables) for part in value]
    if isinstance(value, dict):
        return {key: render_structure(part, variables) for key, part in value.items()}
    return value


_compiled: dict[str, CompiledRule] = {}
_recent = threading.local()
CACHE_SIZE = 256


def compiled(spec: dict) -> CompiledRule:
    """The compiled rule for spec, cached: scoring the same rule again costs no compilation."""
    recent = getattr(_recent, "entry", None)
    if recent is not None and recent[0] is spec and recent[1] == spec:
        return recent[2]
    key = json.dumps(spec, sort_keys=True, default=str)
    rule = _compiled.get(key)
    if rule is None:
        rule = compile_rule(spec)
        if len(_compiled) >= CACHE_SIZE:
            _compiled.clear()
        _compiled[key] = rule
    _recent.entry = (spec, copy.deepcopy(spec), rule)
    return rule


# -- scoring -----------------------------------------------------------------------------------


@dataclass
class Tally:
    components: dict[str, float | None] = field(default_factory=dict)
    errors: list[GraderError] = field(default_factory=list)
    errored: bool = False


def score(
    spec: dict,
    item: dict,
    sample: Sample,
    *,
    pool=None,
    judge: Judge | None = None,
    sandbox=None,
    reward_models=None,
) -> ScoreResult:
    """Score one sample of one item with a rule (raises RuleError for a rule that does not validate).

    `pool` is the sandbox pool for sandbox graders (default: the process's shared pool), `judge`
    answers score_model and label_model, `sandbox` is the episode's live sandbox for agent_check,
    `reward_models` answers reward_model graders.

    >>> rule = {"type": "string_check", "name": "exact", "input": "{{ sample.output_text }}",
    ...         "reference": "{{ item.reference }}", "operation": "eq"}
    >>> result = score(rule, {"kind": "answer", "prompt": "2+2?", "reference": "4"}, Sample(output_text="4"))
    >>> result.total, result.components, result.errors, result.errored, result.flags
    (1.0, {'exact': 1.0}, [], False, [])
    """
    return score_compiled(
        compiled(spec), item, sample, pool=pool, judge=judge, sandbox=sandbox, reward_models=reward_models
    )


def score_batch(
    spec: dict,
    pairs: list[tuple[dict, Sample]],
    *,
    pool=None,
    judge: Judge | None = None,
    max_workers: int | None = None,
    reward_models=None,
) -> list[ScoreResult]:
    """Score many (item, sample) pairs with one rule, in order.

    In-process rules score in a plain loop (they take microseconds); rules with sandbox or judge
    graders score in threads, as many as the sandbox pool lends sandboxes at once. Graders that
    score a batch at once (reward_model: one forward pass for all) score first, for every pair.
    """
    rule = compiled(spec)
    contexts = [
        Context(item, Sample.from_dict(sample) if isinstance(sample, dict) else sample, pool, judge)
        for item, sample in pairs
    ]
    for context in contexts:
        context.reward_models = reward_models
    for leaf in rule.batched:
        batch_fill(leaf, contexts)
    if not (rule.uses_sandbox or rule.uses_judge) or len(pairs) < 2:
        return [
            score_compiled(rule, item, sample, pool=pool, judge=judge, context=context)
            for (item, sample), context in zip(pairs, contexts, strict=True)
        ]
    if rule.uses_sandbox and pool is None:
        pool = sandbox_pool()
    workers = max_workers or (pool.max_sandboxes if pool is not None else 8)
    with ThreadPoolExecutor(max_workers=min(workers, len(pairs)), thread_name_prefix="score") as executor:
        return list(
            executor.map(
                lambda index: score_compiled(
                    rule, pairs[index][0], pairs[index][1], pool=pool, judge=judge, context=contexts[index]
                ),
                range(len(pairs)),
            )
        )


def batch_fill(leaf: Leaf, contexts: list[Context]) -> None:
    """Score `leaf` for every context in one call of its grader's batch function; each value (or the
    error that stands for it) waits in the context's notes for the leaf to read."""
    batch = leaf.kind.batch
    assert batch is not None  # only the leaves in CompiledRule.batched, whose graders have one
    ready, kwargs = [], []
    for context in contexts:
        try:
            kwargs.append(leaf.arguments_for(context))
            ready.append(context)
        except TemplateRenderError:
            continue  # scored alone, where the same error is reported on its component
    if not ready:
        return
    try:
        values = batch(kwargs, ready)
    except Exception as exc:  # noqa: BLE001  (the whole batch failed: each sample reports it)
        values = [exc] * len(ready)
    for context, value in zip(ready, values, strict=True):
        context.notes.setdefault(BATCHED, {})[id(leaf)] = value


def score_compiled(
    rule: CompiledRule,
    item: dict,
    sample: Sample,
    *,
    pool=None,
    judge=None,
    sandbox=None,
    reward_models=None,
    context: Context | None = None,
) -> ScoreResult:
    if context is None:
        if isinstance(sample, dict):
            sample = Sample.from_dict(sample)
        context = Context(item, sample, pool, judge, sandbox, reward_models=reward_models)
    sample = context.sample
    tally = Tally()
    if isinstance(rule.root, Multi):
        total = evaluate_multi(rule.root, "", rule.name, context, tally)
    else:
        total = evaluate_leaf(rule.root, rule.name, context, tally)
    test_run = context.notes.get("test_run")
    flags = detectors.detect(item, sample, test_run=test_run, test_format=context.notes.get("test_format"))
    earned = None if tally.errored else total  # what the rule paid before the detectors had a say
    ran = test_run is not None
    flags = detectors.notes_marked(flags, item, sample, earned=earned, floor=rule.floor, ran=ran)
    if rule.penalty:
        penalty = sum(rule.penalty.get(flag.detector, rule.penalty.get("*", 0.0)) for flag in flags)
        tally.components["hacking_penalty"] = -penalty
        total = None if total is None else total - penalty
    if "*" not in rule.opt_out and any(
        flag.confidence == "high" and flag.detector not in rule.opt_out for flag in flags
    ):
        tally.components["hacking_floor"] = rule.floor
        total = None if total is None else min(total, rule.floor)
    if tally.errored:
        total = None
    tests = [test.to_dict() for test in test_run.tests] if test_run is not None else []
    stop = str(test_run.execution.stop_reason) if test_run is not None else None
    return ScoreResult(total, tally.components, tally.errors, tally.errored, flags, tests, stop)


def evaluate_leaf(leaf: Leaf, name: str, context: Context, tally: Tally) -> float | None:
    value: float | None = None
    try:
        value = leaf.run(context)
    except GradingError as failure:
        tally.errors.append(GraderError(name, failure.kind, failure.message))
        tally.errored |= failure.errored
        value = failure.score
    except TemplateRenderError as exc:
        tally.errors.append(GraderError(name, "bad_template", str(exc)))
    except InfrastructureError as exc:
        tally.errors.append(GraderError(name, "sandbox_error", str(exc)))
        tally.errored = True
    except Exception as exc:  # noqa: BLE001  (a grader's own failure is reported on its component, never raised)
        tally.errors.append(GraderError(name, "grader_exception", f"{type(exc).__name__}: {exc}"))
    tally.components[name] = value
    return value


def evaluate_multi(multi: Multi, path: str, name: str, context: Context, tally: Tally) -> float | None:
    values = {}
    for key, child in multi.children.items():
        child_path = place(path, key)
        if isinstance(child, Multi):
            values[key] = evaluate_multi(child, child_path, child_path, context, tally)
        else:
            values[key] = evaluate_leaf(child, child_path, context, tally)
    value = None
    known = {key: child for key, child in values.items() if child is not None}
    if len(known) == len(values):
        try:
            value = multi.formula.evaluate(known)
        except FormulaError as exc:
            tally.errors.append(GraderError(name, "grader_exception", f"calculate_output: {exc}"))
    if path:
        tally.components[path] = value
    return value


# -- for editors -------------------------------------------------------------------------------


def grader_catalog() -> list[dict]:
    """Every grader type with its one-line summary and fields, for a rule editor.

    >>> [entry["type"] for entry in grader_catalog()][:3]
    ['agent_check', 'format_errors', 'invalid_actions']
    """
    catalog = []
    for type_name in grader_types():
        if type_name == MULTI:
            catalog.append(
                {
                    "type": MULTI,
                    "summary": "A formula (calculate_output) over named sub-graders.",
                    "openai": True,
                    "fields": {"graders": {"required": True}, "calculate_output": {"required": True}},
                }
            )
            continue
        kind = REGISTRY[type_name]
        fields = {
            name: {
                "required": spec_field.required,
                "template": spec_field.form != "value",
                "choices": list(spec_field.choices),
            }
            for name, spec_field in kind.fields.items()
            if name != "type"
        }
        catalog.append({"type": type_name, "summary": kind.summary, "openai": kind.openai, "fields": fields})
    return catalog

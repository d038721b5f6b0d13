"""The shapes graders take and give: a sample, typed errors and flags, and the registry entry of a grader.

A grader is a plain typed function with a docstring and a doctest (as TRL's `rewards/` does it). The
registry maps a rule's `"type"` to a `GraderKind`: the fields that type accepts in the rule JSON and
the function that scores. The engine renders the template fields, then calls the function with the
rule's fields as keyword arguments; a function that declares a `context` parameter also gets the
item, the sample, the sandbox pool and the judge.
"""

import inspect
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

# A judge answers chat messages with a tier: judge(tier_ref, messages, sampling_params) -> reply text.
Judge = Callable[[str, list[dict], dict], str]


@dataclass
class Sample:
    """What the model produced for one item: text, JSON, final workspace files and the trajectory."""

    output_text: str = ""
    output_json: Any = None
    files: dict[str, str] = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)
    tokens: int = 0
    metadata: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict) -> "Sample":
        """A sample from its JSON form; unknown keys are refused so typos don't score silently.

        >>> Sample.from_dict({"output_text": "42"}).output_text
        '42'
        """
        unknown = set(data) - set(SAMPLE_FIELDS)
        if unknown:
            raise ValueError(
                f"unknown sample fields: {', '.join(sorted(unknown))}; known: {', '.join(SAMPLE_FIELDS)}"
            )
        return cls(**data)

    def to_dict(self) -> dict:
        return asdict(self)


SAMPLE_FIELDS = ("output_text", "output_json", "files", "steps", "tokens", "metadata")


@dataclass
class RuleProblem:
    path: str  # dotted place in the rule JSON: "graders.tests.calculate_output", "input"
    message: str


@dataclass
class GraderError:
    grader: str  # the component's name, nested names joined with "."
    kind: str  # one of ERROR_KINDS
    message: str


ERROR_KINDS = {
    "bad_template": "a template named something the item or sample does not have",
    "grader_exception": "the grader itself failed (its code raised, the item lacks what it needs)",
    "sandbox_timeout": "the graded code ran past its time limit: the model's fault, scored 0",
    "sandbox_error": "the sandbox machinery failed: infrastructure, the sample is errored",
    "judge_error": "no judge is configured or the judge failed: the sample is errored",
    "invalid_output": "a judge or python grader answered something that is not a score",
    "unsupported": "this grader cannot run here (a metric that needs a model or data this machine lacks)",
}


@dataclass
class HackingFlag:
    detector: str
    evidence: str
    confidence: str = "low"  # "high": the rule's floor replaces the reward unless the rule opts out
    note: str = ""  # why it is only a note (no reward to gain): shown, never counted by the monitors


class GradingError(Exception):
    """A grader could not score normally. `score` is what its component becomes: 0.0 when the
    sample is to blame (its code timed out), None when the sample can't be judged by this rule."""

    def __init__(self, kind: str, message: str, *, score: float | None = None, errored: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.score = score
        self.errored = errored


@dataclass
class Context:
    """Everything a grader may look at besides its own fields."""

    item: dict
    sample: Sample
    pool: Any = None  # a sandboxes.pool.SandboxPool; None: the process's shared pool
    judge: Judge | None = None
    sandbox: Any = None  # the episode's live sandbox, where the caller still holds one
    notes: dict = field(default_factory=dict)  # what graders learned that detectors use: "test_run"
    _variables: dict | None = None
    # Answers `reward_model` graders: scorer(name, version, prompts, completions) -> scores.
    reward_models: Any = None

    def variables(self) -> dict:
        """The template namespaces: `item` and `sample`."""
        if self._variables is None:
            sample = self.sample
            self._variables = {
                "item": self.item,
                "sample": {name: getattr(sample, name) for name in SAMPLE_FIELDS},
            }
        return self._variables


TEXT = "text"  # a string that may hold templates
MESSAGES = "messages"  # a list of chat messages whose contents may hold templates
VALUE = "value"  # plain JSON, used as given


@dataclass(frozen=True)
class Field:
    types: type | tuple[type, ...]
    required: bool = True
    form: str = VALUE
    choices: tuple[Any, ...] = ()
    default: Any = None


@dataclass(frozen=True)
class GraderKind:
    type: str
    function: Callable[..., float]
    fields: dict[str, Field]
    check: Callable[[dict], list[tuple[str, str]]] | None = None  # extra checks: (field, message)
    openai: bool = False  # a type of OpenAI's grader JSON
    uses_sandbox: bool = False
    uses_judge: bool = False
    wants_context: bool = False
    uses_reward_model: bool = False
    # Scores many samples in one call: batch(kwargs of each sample, their contexts) -> a value or a
    # GradingError per sample. score_batch uses it; scoring one sample calls `function`.
    batch: Callable[[list[dict], list["Context"]], list] | None = None

    @property
    def summary(self) -> str:
        return (inspect.getdoc(self.function) or "").split("\n", 1)[0]


COMMON_FIELDS = {
    "type": Field(str),
    "name": Field(str, required=False),
    "pass_threshold": Field((int, float), required=False),  # OpenAI's evals carry it; scores ignore it
}
REGISTRY: dict[str, GraderKind] = {}


def grader(
    type_name: str,
    *,
    check=None,
    openai=False,
    uses_sandbox=False,
    uses_judge=False,
    uses_reward_model=False,
    batch=None,
    **fields: Field,
):
    """Register a grader function under a rule type, with the rule fields it takes."""

    def register(function: Callable[..., float]) -> Callable[..., float]:
        parameters = inspect.signature(function).parameters
        missing = set(fields) - set(parameters)
        if missing:
            raise TypeError(f"{function.__name__} lacks parameters for fields {sorted(missing)}")
        REGISTRY[type_name] = GraderKind(
            type=type_name,
            function=function,
            fields={**COMMON_FIELDS, **fields},
            check=check,
            openai=openai,
            uses_sandbox=uses_sandbox,
            uses_judge=uses_judge,
            wants_context="context" in parameters,
            uses_reward_model=uses_reward_model,
            batch=batch,
        )
        return function

    return register


def as_number(value: Any) -> float | None:
    """A real number from what a grader returned, else None (bools count as 1 and 0).

    >>> as_number(True), as_number("0.5"), as_number("x"), as_number(float("nan"))
    (1.0, 0.5, None, None)
    """
    if isinstance(value, bool):
        return float(value)
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if number == number and abs(number) != float("inf") else None

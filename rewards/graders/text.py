"""In-process graders of text: string_check, text_similarity, numeric, regex, json_schema.

`string_check` and `text_similarity` score as OpenAI documents them: string_check is 1 or 0 (`like`
and `ilike` are substring checks), fuzzy_match is rapidfuzz's WRatio on a 0..1 scale, BLEU, GLEU
and METEOR are NLTK's sentence scores over whitespace tokens, ROUGE is the F-measure of Google's
rouge-score. METEOR here matches exact words and Porter stems only: WordNet's synonym data cannot
be shipped with the project, so where synonyms matter it is lower than OpenAI's.
"""

import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

import regex
from jsonschema import exceptions as schema_exceptions
from jsonschema import validators
from rapidfuzz import fuzz

from rewards.graders.base import TEXT, Field, GradingError, grader

OPERATIONS = ("eq", "ne", "like", "ilike")
METRICS = (
    "fuzzy_match",
    "bleu",
    "gleu",
    "meteor",
    "cosine",
    "rouge_1",
    "rouge_2",
    "rouge_3",
    "rouge_4",
    "rouge_5",
    "rouge_l",
)
REGEX_FLAGS = {"IGNORECASE": regex.IGNORECASE, "MULTILINE": regex.MULTILINE, "DOTALL": regex.DOTALL}
REGEX_SECONDS = 1.0  # model output is untrusted: a pattern that backtracks forever is stopped
NUMBER = re.compile(r"[-+]?(?:\d[\d,_]*)?\.?\d+(?:[eE][-+]?\d+)?(?:\s*/\s*\d+)?")


@grader(
    "string_check",
    openai=True,
    input=Field(str, form=TEXT),
    reference=Field(str, form=TEXT),
    operation=Field(str, choices=OPERATIONS),
)
def string_check(input: str, reference: str, operation: str) -> float:
    """1.0 when input and reference compare as `operation` says, else 0.0.

    eq and ne compare exactly; like is "input contains reference", ilike the same ignoring case.

    >>> string_check("Paris", "Paris", "eq"), string_check("Paris", "paris", "eq")
    (1.0, 0.0)
    >>> string_check("The capital is Paris.", "paris", "ilike"), string_check("x", "y", "ne")
    (1.0, 1.0)
    """
    if operation == "eq":
        return float(input == reference)
    if operation == "ne":
        return float(input != reference)
    if operation == "like":
        return float(reference in input)
    return float(reference.casefold() in input.casefold())


@grader(
    "text_similarity",
    openai=True,
    input=Field(str, form=TEXT),
    reference=Field(str, form=TEXT),
    evaluation_metric=Field(str, choices=METRICS),
)
def text_similarity(input: str, reference: str, evaluation_metric: str) -> float:
    """How close input is to reference, from 0.0 to 1.0, by `evaluation_metric`.

    >>> text_similarity("hello world", "hello world", "fuzzy_match")
    1.0
    >>> round(text_similarity("hello wrld", "hello world", "fuzzy_match"), 4)
    0.9524
    >>> text_similarity("the cat sat", "the cat sat down", "rouge_1")
    0.8571428571428571
    """
    if evaluation_metric == "fuzzy_match":
        return fuzz.WRatio(input, reference) / 100.0
    if evaluation_metric.startswith("rouge_"):
        return rouge(input, reference, evaluation_metric)
    if evaluation_metric == "cosine":
        return cosine(input, reference)
    return nltk_score(input, reference, evaluation_metric)


def rouge(input: str, reference: str, metric: str) -> float:
    name = "rougeL" if metric == "rouge_l" else "rouge" + metric[-1]
    return rouge_scorer(name).score(reference, input)[name].fmeasure


@lru_cache(maxsize=8)
def rouge_scorer(name: str):
    from rouge_score.rouge_scorer import RougeScorer  # imports NLTK: only when a ROUGE grader runs

    return RougeScorer([name])


class NoSynonyms:
    """A WordNet stand-in with no synsets: METEOR then matches exact words and stems only."""

    def synsets(self, *args: Any, **kwargs: Any) -> list:
        return []


def nltk_score(input: str, reference: str, metric: str) -> float:
    hypothesis, references = input.split(), [reference.split()]
    if metric == "bleu":
        from nltk.translate.bleu_score import sentence_bleu

        return float(sentence_bleu(references, hypothesis))
    if metric == "gleu":
        from nltk.translate.gleu_score import sentence_gleu

        return float(sentence_gleu(references, hypothesis))
    from nltk.translate.meteor_score import meteor_score

    return float(meteor_score(references, hypothesis, wordnet=NoSynonyms()))


def embedding_model() -> str:
    """FLYWHEEL_EMBEDDING_MODEL: a local path of a Hugging Face encoder for `cosine`; empty: none."""
    try:
        from django.conf import settings

        if settings.configured and hasattr(settings, "FLYWHEEL_EMBEDDING_MODEL"):
            return str(settings.FLYWHEEL_EMBEDDING_MODEL)
    except ImportError:
        pass
    return os.environ.get("FLYWHEEL_EMBEDDING_MODEL", "")


def cosine(input: str, reference: str) -> float:
    path = embedding_model()
    if not path:
        raise GradingError(
            "unsupported",
            "cosine similarity needs an embedding model: set FLYWHEEL_EMBEDDING_MODEL to a local path",
        )
    first, second = embed(path, (input, reference))
    norms = math.sqrt(sum(a * a for a in first)) * math.sqrt(sum(b * b for b in second))
    return sum(a * b for a, b in zip(first, second, strict=True)) / norms if norms else 0.0


def embed(path: str, texts: tuple[str, ...]) -> list[list[float]]:
    """Mean-pooled embeddings from a local encoder; nothing is downloaded."""
    try:
        import torch
        from transformers import AutoModel, AutoTokenizer
    except ImportError:
        raise GradingError("unsupported", "cosine similarity needs the transformers package") from None
    tokenizer, model = load_encoder(path, AutoTokenizer, AutoModel)
    batch = tokenizer(list(texts), padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return ((hidden * mask).sum(1) / mask.sum(1).clamp(min=1)).tolist()


@lru_cache(maxsize=2)
def load_encoder(path: str, tokenizer_class: Any, model_class: Any) -> tuple[Any, Any]:
    try:
        return (
            tokenizer_class.from_pretrained(path, local_files_only=True),
            model_class.from_pretrained(path, local_files_only=True).eval(),
        )
    except OSError as exc:
        raise GradingError("unsupported", f"FLYWHEEL_EMBEDDING_MODEL {path!r} does not load: {exc}") from None


def parse_number(text: str) -> float | None:
    """The number a text states: the whole text if it is one, else the last number in it.

    >>> parse_number(" 42 "), parse_number("1,234.5"), parse_number("so it is 3/4."), parse_number("none")
    (42.0, 1234.5, 0.75, None)
    """
    cleaned = text.strip().replace(",", "").replace("_", "")
    try:
        return float(cleaned)
    except ValueError:
        pass
    found = NUMBER.findall(text)
    if not found:
        return None
    last = found[-1].replace(",", "").replace("_", "").replace(" ", "")
    if "/" in last:
        numerator, denominator = last.split("/")
        return float(numerator) / float(denominator) if float(denominator) else None
    return float(last)


@grader(
    "numeric",
    input=Field(str, form=TEXT),
    reference=Field(str, form=TEXT),
    tolerance=Field((int, float), required=False, default=0.0),
    relative_tolerance=Field((int, float), required=False, default=0.0),
)
def numeric(input: str, reference: str, tolerance: float = 0.0, relative_tolerance: float = 0.0) -> float:
    """1.0 when the number input states is within tolerance of the reference, else 0.0.

    `tolerance` is absolute, `relative_tolerance` a fraction of the larger magnitude; either suffices.

    >>> numeric("The answer is 3.14", "3.14159", tolerance=0.01), numeric("3.2", "3.14159", tolerance=0.01)
    (1.0, 0.0)
    >>> numeric("105", "100", relative_tolerance=0.05), numeric("no number", "100")
    (1.0, 0.0)
    """
    expected = parse_number(reference)
    if expected is None:
        raise GradingError("grader_exception", f"the reference {reference[:100]!r} is not a number")
    stated = parse_number(input)
    if stated is None:
        return 0.0
    return float(math.isclose(stated, expected, rel_tol=relative_tolerance, abs_tol=tolerance))


def check_regex(spec: dict) -> list[tuple[str, str]]:
    problems = []
    try:
        regex.compile(spec.get("pattern", ""), regex_flags(spec.get("flags") or []))
    except (regex.error, ValueError) as exc:
        problems.append(("pattern", f"does not compile: {exc}"))
    except TypeError:
        pass  # the field type check reports it
    for flag in spec.get("flags") or []:
        if flag not in REGEX_FLAGS:
            problems.append(("flags", f"unknown flag {flag!r}: use {', '.join(REGEX_FLAGS)}"))
    return problems


def regex_flags(names: Iterable[str]) -> int:
    flags = 0
    for name in names:
        flags |= REGEX_FLAGS.get(name, 0)
    return flags


@grader(
    "regex",
    check=check_regex,
    input=Field(str, form=TEXT),
    pattern=Field(str),
    flags=Field(list, required=False, default=()),
    mode=Field(str, required=False, choices=("search", "fullmatch"), default="search"),
)
def regex_match(input: str, pattern: str, flags: Sequence[str] = (), mode: str = "search") -> float:
    """1.0 when the pattern is found in input (mode "search") or matches all of it ("fullmatch").

    >>> regex_match("Answer: 42", r"Answer: \\d+"), regex_match("Answer: 42", r"\\d+", mode="fullmatch")
    (1.0, 0.0)
    >>> regex_match("ANSWER", "answer", flags=["IGNORECASE"])
    1.0
    """
    compiled = regex.compile(pattern, regex_flags(flags))
    method = compiled.search if mode == "search" else compiled.fullmatch
    try:
        return float(method(input, timeout=REGEX_SECONDS) is not None)
    except TimeoutError:
        raise GradingError(
            "grader_exception", f"the pattern ran past {REGEX_SECONDS:g} s on this input"
        ) from None


def check_schema(spec: dict) -> list[tuple[str, str]]:
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        return []
    try:
        validators.validator_for(schema).check_schema(schema)
    except schema_exceptions.SchemaError as exc:
        where = ".".join(str(part) for part in exc.path)
        return [("schema" + (f".{where}" if where else ""), f"is not a valid JSON Schema: {exc.message}")]
    return []


@lru_cache(maxsize=256)
def schema_validator(schema_json: str):
    schema = json.loads(schema_json)
    return validators.validator_for(schema)(schema)


@grader(
    "json_schema",
    check=check_schema,
    input=Field(str, form=TEXT, required=False),
    schema=Field(dict),
)
def json_schema(schema: dict, input: str | None = None, context: Any = None) -> float:
    """1.0 when the output is JSON that the schema accepts, else 0.0.

    Without `input`, the sample's output_json is checked, or its output_text parsed as JSON.

    >>> schema = {"type": "object", "required": ["a"]}
    >>> json_schema(schema, '{"a": 1}'), json_schema(schema, '{"b": 1}'), json_schema(schema, "not json")
    (1.0, 0.0, 0.0)
    """
    if input is not None:
        try:
            value = json.loads(input)
        except ValueError:
            return 0.0
    elif context.sample.output_json is not None:
        value = context.sample.output_json
    else:
        try:
            value = json.loads(context.sample.output_text)
        except ValueError:
            return 0.0
    validator = schema_validator(json.dumps(schema, sort_keys=True))
    return float(validator.is_valid(value))

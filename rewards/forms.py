"""Page forms: they parse and type the input (JSON text into objects); the services decide whether
the rule may be stored (rewards.engine.validate_rule), and their refusals land next to the field."""

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from core import strict_json
from rewards import engine
from rewards.graders import MULTI, grader_kind
from rewards.graders.base import MESSAGES, TEXT
from rewards.services import DRY_RUN_MAX_PAIRS

SPEC_ROWS = 24


def parse_json(text: str, what: str) -> Any:
    try:
        return strict_json.loads(text)
    except strict_json.JsonInputError as exc:
        if exc.lineno is None:  # JSON, but refused: NaN, too deep, ...
            raise ValidationError(f"{what} is refused: {exc.reason}") from None
        reason = exc.reason.removeprefix("not valid JSON: ")
        raise ValidationError(
            f"{what} is not valid JSON: line {exc.lineno}, column {exc.colno}: {reason}"
        ) from None


def parse_jsonl(text: str, what: str) -> list[Any]:
    """One JSON value a line, blank lines skipped; a whole JSON array is accepted too."""
    stripped = text.strip()
    if stripped.startswith("["):
        value = parse_json(stripped, what)
        return value if isinstance(value, list) else [value]
    values = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            values.append(strict_json.loads(line))
        except strict_json.JsonInputError as exc:
            raise ValidationError(f"{what}, line {number}: {exc.reason}") from None
    return values


class SpecField(forms.CharField):
    widget = forms.Textarea(attrs={"rows": SPEC_ROWS, "spellcheck": "false", "class": "code-input"})

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value)
        return parse_json(text, "the rule") if text else None


class RewardRuleForm(forms.Form):
    name = forms.CharField(max_length=100)
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)
    spec = SpecField(label="Rule (JSON)")
    note = forms.CharField(
        max_length=500, required=False, help_text="What changed, in a line; kept with the new version"
    )


class ImportOpenAIForm(forms.Form):
    name = forms.CharField(max_length=100)
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)
    grader = SpecField(
        label="OpenAI grader JSON",
        help_text="string_check, text_similarity, score_model, label_model, python or multi, as is",
    )


class DryRunForm(forms.Form):
    version = forms.TypedChoiceField(coerce=int, label="Rule version")
    source = forms.ChoiceField(
        choices=[("paste", "Paste items"), ("task_set", "Items of a task set version")],
        initial="paste",
        widget=forms.RadioSelect,
    )
    items = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false", "class": "code-input"}),
        required=False,
        label="Items (JSONL)",
        help_text='One item a line, as the task library exports them: {"id": …, "kind": "answer", …}',
    )
    task_set_version = forms.TypedChoiceField(coerce=int, required=False, label="Task set version")
    item_ids = forms.CharField(
        required=False,
        label="Item ids",
        help_text="Separated by spaces or commas; empty: the first items in file order",
    )
    samples = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false", "class": "code-input"}),
        label="Samples (JSONL or a JSON array)",
        help_text=(
            'A completion string, or {"output_text": …, "steps": [...], "tokens": …, "item_id": …}; '
            "without item_id a sample pairs with the item at the same position"
        ),
    )

    def __init__(self, *args: Any, versions: list[int], task_set_versions: list[tuple[int, str]], **kwargs):
        super().__init__(*args, **kwargs)
        version, task_set_version = self.fields["version"], self.fields["task_set_version"]
        assert isinstance(version, forms.ChoiceField) and isinstance(task_set_version, forms.ChoiceField)
        version.choices = [(n, f"v{n}") for n in versions]
        task_set_version.choices = [("", "—"), *task_set_versions]

    def clean_items(self) -> list[Any]:
        return parse_jsonl(self.cleaned_data["items"], "items")

    def clean_samples(self) -> list[Any]:
        samples = parse_jsonl(self.cleaned_data["samples"], "samples")
        if len(samples) > DRY_RUN_MAX_PAIRS:
            raise ValidationError(f"at most {DRY_RUN_MAX_PAIRS} samples per dry-run; got {len(samples)}")
        return samples

    def clean_item_ids(self) -> list[str]:
        return [part for part in self.cleaned_data["item_ids"].replace(",", " ").split() if part]

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if data.get("source") == "task_set" and not data.get("task_set_version"):
            self.add_error("task_set_version", "pick a task set version")
        if data.get("source") == "paste" and "items" in data and not data["items"]:
            self.add_error("items", "paste at least one item")
        return data


# --- the form editor -----------------------------------------------------------------------
# What the browser's form editor offers for each grader type, read from the engine's registry so
# a new grader appears without touching the page. Display only: the engine's validate_rule decides
# what a valid rule is, and keys the form does not show stay in the JSON untouched.

LABELS = {
    "string_check": "String check",
    "text_similarity": "Text similarity",
    "numeric": "Numeric",
    "regex": "Regular expression",
    "json_schema": "JSON schema",
    "unit_tests": "Unit tests (code tasks)",
    "agent_check": "Agent check command",
    "python": "Python (sandboxed)",
    "score_model": "Score model (judge)",
    "label_model": "Label model (judge)",
    "invalid_actions": "Invalid actions",
    "format_errors": "Format errors",
    "steps": "Steps",
    "tokens_used": "Tokens used",
    "multi": "Multi (formula over sub-graders)",
}
HELP = {
    "input": "A template: {{sample.output_text}}, {{item.reference}}, …",
    "reference": "A template, such as {{item.reference}}",
    "calculate_output": (
        "Over the sub-graders' names: 2.0 * tests - 0.2 * invalid - 0.01 * steps; min, max, abs, clamp"
    ),
    "source": "def grade(sample, item) -> float: …",
}
HIDDEN_FIELDS = {"type", "name", "graders", "pass_threshold"}  # the editor shows these its own way
CODE_FIELDS = {"source"}


def _editor_kind(name: str, field: Any) -> str:
    """How the editor edits a registry field: a select, a template or text line, code, a number, JSON."""
    types = set(field.types) if isinstance(field.types, tuple) else {field.types}
    if field.choices:
        return "select"
    if field.form == TEXT:
        return "template"
    if field.form == MESSAGES or not types & {str, int, float}:
        return "json"
    if str in types:
        return "code" if name in CODE_FIELDS else "text"
    return "number"


def grader_types() -> list[dict[str, Any]]:
    """Every grader type of the engine's catalog with the fields the form editor shows, OpenAI's
    types first; multi's sub-graders have their own editor, so only its formula is a field."""
    types = []
    for entry in sorted(engine.grader_catalog(), key=lambda entry: (not entry["openai"], entry["type"])):
        kind = grader_kind(entry["type"])
        fields = []
        for name, described in entry["fields"].items():
            if name in HIDDEN_FIELDS:
                continue
            if entry["type"] == MULTI or kind is None:
                editor_kind = "text"
            else:
                editor_kind = _editor_kind(name, kind.fields[name])
            fields.append(
                {
                    "name": name,
                    "label": name.replace("_", " ").capitalize(),
                    "kind": editor_kind,
                    "required": described.get("required", False),
                    "choices": list(described.get("choices") or []),
                    "help": HELP.get(name, ""),
                }
            )
        label = LABELS.get(entry["type"], entry["type"].replace("_", " ").capitalize())
        types.append(
            {
                "type": entry["type"],
                "label": label,
                "summary": entry["summary"],
                "openai": entry["openai"],
                "fields": fields,
            }
        )
    return types


STARTER_SPEC: dict[str, Any] = {
    "type": "string_check",
    "name": "exact answer",
    "input": "{{sample.output_text}}",
    "reference": "{{item.reference}}",
    "operation": "eq",
}

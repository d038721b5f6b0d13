"""Tier page forms: they parse and type the input; the services decide whether it may be stored."""

from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.db.models import Model

from inference.settings import TIER_FIELDS
from projects.models import TaskItem, TaskSetVersion
from tiers.models import Tier

STOP_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
STOP_UNESCAPES = {"\\": "\\", "n": "\n", "t": "\t", "r": "\r"}


def stop_escape(text: str) -> str:
    r"""A stop sequence as one line of the form: newlines, tabs and backslashes written as escapes.

    >>> stop_escape("\n\nHuman:")
    '\\n\\nHuman:'
    """
    return "".join(STOP_ESCAPES.get(char, char) for char in text)


def stop_unescape(line: str) -> str:
    r"""The inverse of stop_escape; a backslash before any other character is kept as it is.

    >>> stop_unescape(r"\n\n") == "\n\n" and stop_unescape(r"a\d") == "a\\d"
    True
    """
    out, chars = [], iter(line)
    for char in chars:
        if char != "\\":
            out.append(char)
            continue
        following = next(chars, "")
        out.append(STOP_UNESCAPES.get(following, "\\" + following))
    return "".join(out)


ENGINE_DEFAULTS = {"engine": Tier.Engine.LOCAL, "engine_adapters": Tier.EngineAdapters.NONE}


class TierForm(forms.ModelForm):
    stop = forms.CharField(
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text=r"Stop sequences, one per line; write a newline as \n, a tab as \t, a backslash as \\",
    )

    class Meta:
        model = Tier
        fields = list(TIER_FIELDS)
        widgets = {
            "description": forms.Textarea(attrs={"rows": 2}),
            "base_model": forms.TextInput(attrs={"list": "local-models", "autocomplete": "off"}),
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk and not self.is_bound:
            self.initial["stop"] = "\n".join(stop_escape(stop) for stop in self.instance.stop or [])
        for name in ENGINE_DEFAULTS:  # a form that leaves the engine out keeps Flywheel's decoder
            self.fields[name].required = False

    def clean_engine(self) -> str:
        return self.cleaned_data["engine"] or ENGINE_DEFAULTS["engine"]

    def clean_engine_adapters(self) -> str:
        return self.cleaned_data["engine_adapters"] or ENGINE_DEFAULTS["engine_adapters"]

    def clean_stop(self) -> list[str]:
        return [stop_unescape(line) for line in self.cleaned_data["stop"].splitlines() if line.strip()]

    def _post_clean(self) -> None:
        # The service checks the whole tier (names, impossible combinations); the model's own
        # validation would only repeat part of it with different wording.
        pass


class TierEvaluateForm(forms.Form):
    task_set_version = forms.ModelChoiceField(
        queryset=TaskSetVersion.objects.none(), label="Task set version"
    )
    split = forms.ChoiceField(choices=TaskItem.Split.choices, initial=TaskItem.Split.HELDOUT)
    # The project's runs, set per tier below: through the project's relation, since runs sit above
    # tiers and tiers import none of them.
    run: "forms.ModelChoiceField[Model]" = forms.ModelChoiceField(
        queryset=None, required=False, help_text="Evaluate a run's policy instead of a path"
    )
    version = forms.IntegerField(
        min_value=0, required=False, help_text="The run's policy version (default: newest)"
    )
    checkpoint = forms.CharField(
        max_length=500, required=False, help_text="A local path or hub id; empty: the tier's base model"
    )
    compare = forms.ModelMultipleChoiceField(
        queryset=Tier.objects.none(),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Compare with tiers",
    )
    limit = forms.IntegerField(min_value=1, required=False, help_text="Only the split's first N items")

    def __init__(self, *args: Any, tier: Tier, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choices(self, "task_set_version").queryset = TaskSetVersion.objects.filter(
            task_set__project_id=tier.project_id
        ).select_related("task_set")
        _choices(self, "run").queryset = tier.project.runs.order_by("-created_at")
        _choices(self, "compare").queryset = Tier.objects.filter(project_id=tier.project_id).exclude(
            pk=tier.pk
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("checkpoint") and data.get("run"):
            raise ValidationError("Give a checkpoint path or a run, not both.")
        return data


def _choices(form: forms.Form, name: str) -> "forms.ModelChoiceField[Any]":
    """The form's model choice field `name` (this instance's copy, whose choices may be narrowed)."""
    field = form.fields[name]
    assert isinstance(field, forms.ModelChoiceField)
    return field

"""Page forms: they parse and type the input; the services decide whether it may be stored."""

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from runs.models import Tier
from runs.roles import Role
from runs.services import TIER_FIELDS


def add_service_errors(form: forms.BaseForm, error: ValidationError) -> None:
    """Show a service's refusal next to the field it names, or above the form."""
    if not hasattr(error, "error_dict"):
        form.add_error(None, error.messages)
        return
    for name, messages in error.message_dict.items():
        for message in messages:
            if name in form.fields:
                form.add_error(name, message)
            else:
                form.add_error(None, message if name == "__all__" else f"{name}: {message}")


class ProjectForm(forms.Form):
    name = forms.CharField(max_length=100)
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)


class TaskSetForm(forms.Form):
    name = forms.CharField(max_length=100)
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)


class MemberAddForm(forms.Form):
    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.VIEWER)


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class SplitForm(forms.Form):
    """The seeded split rule; left empty, an import keeps the latest version's settings."""

    split_seed = forms.IntegerField(required=False, min_value=-(2**63), max_value=2**63 - 1)
    heldout_fraction = forms.FloatField(
        required=False, min_value=0, max_value=1, label="Held-out fraction", help_text="0 to 1"
    )


class ImportForm(SplitForm):
    file = forms.FileField(
        label="JSONL or CSV file",
        widget=forms.ClearableFileInput(attrs={"accept": ".jsonl,.json,.ndjson,.csv,.txt"}),
    )


class ResplitForm(SplitForm):
    split_seed = forms.IntegerField(min_value=-(2**63), max_value=2**63 - 1)
    heldout_fraction = forms.FloatField(min_value=0, max_value=1, label="Held-out fraction")


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What uses it, such as a CI job or script")


class TierForm(forms.ModelForm):
    stop = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Stop sequences, one per line",
    )

    class Meta:
        model = Tier
        fields = list(TIER_FIELDS)
        widgets = {"description": forms.Textarea(attrs={"rows": 2})}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk and not self.is_bound:
            self.initial["stop"] = "\n".join(self.instance.stop or [])

    def clean_stop(self) -> list[str]:
        return [line for line in self.cleaned_data["stop"].splitlines() if line.strip()]

    def _post_clean(self) -> None:
        # The service checks the whole tier (names, impossible combinations); the model's own
        # validation would only repeat part of it with different wording.
        pass

"""Page forms: they parse and type the input; the services decide whether it may be stored."""

from typing import Any

from django import forms
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError

from core.roles import Role
from projects.models import Project


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


IMPORT_FORMAT_CHOICES = [
    ("auto", "Recognise each line (Flywheel, HumanEval, MBPP, APPS, CodeContests, LiveCodeBench)"),
    ("flywheel", "Flywheel's own lines only"),
    ("humaneval", "HumanEval (every line)"),
    ("mbpp", "MBPP, original or sanitized (every line)"),
    ("apps", "APPS-style stdin/stdout (every line)"),
    ("codecontests", "CodeContests (every line)"),
    ("livecodebench", "LiveCodeBench (every line)"),
    ("csv", "CSV (answer items)"),
]


class ImportOptionsForm(SplitForm):
    """The split rule, and how the file's lines are read (`task_format.resolve_format`)."""

    format = forms.ChoiceField(choices=IMPORT_FORMAT_CHOICES, required=False, initial="auto")


class ImportForm(ImportOptionsForm):
    file = forms.FileField(
        label="JSONL or CSV file",
        widget=forms.ClearableFileInput(attrs={"accept": ".jsonl,.json,.ndjson,.csv,.txt"}),
    )


class TaskSetImportCreateForm(ImportForm):
    """A new task set with its first version: the set is created only when the whole file imports."""

    name = forms.CharField(max_length=100)
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)
    field_order = ["name", "description", "file", "format", "split_seed", "heldout_fraction"]


class ResplitForm(SplitForm):
    split_seed = forms.IntegerField(min_value=-(2**63), max_value=2**63 - 1)
    heldout_fraction = forms.FloatField(min_value=0, max_value=1, label="Held-out fraction")


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What uses it, such as a CI job or script")
    default_project = forms.ModelChoiceField(
        queryset=Project.objects.none(),
        required=False,
        help_text="Where OpenAI-compatible calls (/v1/files, /v1/fine_tuning) act when they name no project",
    )

    def __init__(self, *args: Any, user: User | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if user is not None:
            field = self.fields["default_project"]
            assert isinstance(field, forms.ModelChoiceField)  # declared above
            field.queryset = Project.objects.filter(memberships__user=user).order_by("name")

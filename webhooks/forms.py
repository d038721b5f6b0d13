"""The page form for adding a webhook: it types the input; webhooks.services checks the URL."""

from django import forms

from runs.models import Run


class WebhookForm(forms.Form):
    url = forms.CharField(
        label="URL", max_length=2000, help_text="http:// or https://; receives a signed POST per event"
    )
    description = forms.CharField(max_length=200, required=False)
    statuses = forms.MultipleChoiceField(
        choices=Run.Status.choices,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: every status",
    )

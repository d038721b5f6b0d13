"""Page forms: they parse and type the input; the services decide whether it may be stored."""

from typing import Any, cast

from django import forms
from django.core.exceptions import ValidationError

from projects.models import Project, TaskItem, TaskSetVersion
from rewards.models import RewardRuleVersion
from runs.hyperparameters import AUTO
from runs.learners import hyperparameter_table, launch_choices
from runs.models import Run
from tiers.models import Tier

# --- launching a run -----------------------------------------------------------------------

INT32_MAX = 2**31 - 1


class RunForm(forms.Form):
    """A launch. Every hyperparameter has a text field that starts as "auto"; only the ones
    changed from "auto" are submitted, and the lifecycle refuses those the method lacks."""

    name = forms.CharField(max_length=100)
    task_set_version = forms.ModelChoiceField(
        queryset=TaskSetVersion.objects.none(), label="Task set version"
    )
    train_split = forms.ChoiceField(choices=TaskItem.Split.choices, initial="train", label="Train on")
    eval_split = forms.ChoiceField(choices=TaskItem.Split.choices, initial="heldout", label="Evaluate on")
    reward_rule_version = forms.ModelChoiceField(
        queryset=RewardRuleVersion.objects.none(), label="Reward rule version"
    )
    tier = forms.ModelChoiceField(queryset=Tier.objects.none(), help_text="The model and how it samples")
    method = forms.ChoiceField(choices=launch_choices, initial=Run.Method.GRPO)
    max_steps = forms.IntegerField(initial=20, max_value=INT32_MAX, help_text="Learner steps")
    max_wall_seconds = forms.IntegerField(
        required=False, max_value=INT32_MAX, label="Max wall seconds", help_text="Empty: no limit"
    )
    max_sandbox_cpu_seconds = forms.FloatField(
        required=False, label="Max sandbox CPU-seconds", help_text="Empty: no limit"
    )
    budget_money = forms.DecimalField(
        required=False,
        max_digits=14,
        decimal_places=2,
        label="Budget (money)",
        help_text="Reaching it pauses the run at a step boundary; empty: no limit",
    )
    budget_device_hours = forms.FloatField(
        required=False, label="Budget (device-hours)", help_text="Empty: no limit"
    )
    priority = forms.IntegerField(
        initial=0, min_value=-INT32_MAX, max_value=INT32_MAX, help_text="Higher starts first"
    )

    def __init__(self, *args: Any, project: Project, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cast(forms.ModelChoiceField, self.fields["task_set_version"]).queryset = (
            TaskSetVersion.objects.filter(task_set__project=project)
            .select_related("task_set")
            .order_by("task_set__name", "-number")
        )
        cast(forms.ModelChoiceField, self.fields["reward_rule_version"]).queryset = (
            RewardRuleVersion.objects.filter(rule__project=project)
            .select_related("rule")
            .order_by("rule__name", "-number")
        )
        cast(forms.ModelChoiceField, self.fields["tier"]).queryset = project.tiers.order_by("name")
        self.hyperparameters = hyperparameter_table()
        for name, (param, _methods) in self.hyperparameters.items():
            self.fields[f"hp_{name}"] = forms.CharField(
                required=False, initial=AUTO, max_length=100, label=name, help_text=param.help
            )

    def hyperparameter_rows(self) -> list[dict[str, Any]]:
        return [
            {"field": self[f"hp_{name}"], "default": param.default, "methods": methods}
            for name, (param, methods) in self.hyperparameters.items()
        ]

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data
        submitted = {}
        for name, (param, _methods) in self.hyperparameters.items():
            text = (cleaned.get(f"hp_{name}") or "").strip()
            if text in ("", AUTO):
                continue
            try:
                submitted[name] = param.kind(text)
            except ValueError:
                expected = "an integer" if param.kind is int else "a number"
                self.add_error(f"hp_{name}", f"must be {expected} or auto")
        cleaned["hyperparameters"] = submitted
        return cleaned

    def add_refusal(self, error: ValidationError) -> None:
        """The lifecycle's reasons next to their fields: hyperparameters.x goes to hp_x, and
        tier.base_model to tier (as "base_model: ...")."""
        for key, messages in error.message_dict.items():
            head, _, rest = key.partition(".")
            field = f"hp_{rest}" if head == "hyperparameters" else head
            for message in messages:
                if field in self.fields:
                    self.add_error(
                        field, f"{rest}: {message}" if rest and head != "hyperparameters" else message
                    )
                else:
                    self.add_error(None, f"{key}: {message}")

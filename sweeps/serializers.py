"""Input and output shapes of the sweeps API. Money is a decimal string in the installation's
currency, kept to a millionth."""

from rest_framework import serializers

from runs.api.run_serializers import INT32_MAX
from runs.models import Run
from sweeps.models import Sweep, SweepTrial


class SweepTemplateSerializer(serializers.Serializer):
    """The run every trial starts from: a launch's fields (runs), without project and name."""

    task_set_version = serializers.IntegerField(min_value=1, help_text="A version id")
    reward_rule_version = serializers.IntegerField(min_value=1, help_text="A reward rule version id")
    tier = serializers.IntegerField(min_value=1, help_text="A tier id")
    method = serializers.CharField(required=False, help_text="grpo (default), sft, dpo or a registered one")
    hyperparameters = serializers.DictField(required=False)
    max_steps = serializers.IntegerField(min_value=1, max_value=INT32_MAX, required=False)
    max_wall_seconds = serializers.IntegerField(min_value=1, max_value=INT32_MAX, required=False)
    budget_money = serializers.DecimalField(max_digits=14, decimal_places=2, required=False)
    budget_device_hours = serializers.FloatField(required=False)
    priority = serializers.IntegerField(min_value=-INT32_MAX, max_value=INT32_MAX, required=False)
    train_split = serializers.CharField(required=False)
    eval_split = serializers.CharField(required=False)


class SweepParameterSerializer(serializers.Serializer):
    """One varied parameter: a list of values (`values`, or `choices`), or a range (`low`, `high`,
    `log`) for random and TPE searches."""

    name = serializers.CharField(help_text="hyperparameters.<key>, tier, base_model or reward_rule_version")
    values = serializers.ListField(child=serializers.JSONField(), required=False)
    choices = serializers.ListField(child=serializers.JSONField(), required=False)
    low = serializers.FloatField(required=False)
    high = serializers.FloatField(required=False)
    log = serializers.BooleanField(required=False)


class SweepCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    template = serializers.JSONField(help_text="The run template: SweepTemplate's fields")
    parameters = serializers.JSONField(help_text="A list of SweepParameter")
    search = serializers.ChoiceField(choices=Sweep.Search.choices, default=Sweep.Search.TPE)
    seed = serializers.IntegerField(min_value=0, max_value=INT32_MAX, default=0)
    metric = serializers.CharField(max_length=100, default="heldout/pass_rate", help_text="The objective")
    direction = serializers.ChoiceField(choices=Sweep.Direction.choices, default=Sweep.Direction.MAXIMIZE)
    early_stopping = serializers.ChoiceField(
        choices=Sweep.EarlyStopping.choices, default=Sweep.EarlyStopping.NONE
    )
    min_steps = serializers.IntegerField(min_value=0, max_value=INT32_MAX, default=1)
    reduction_factor = serializers.IntegerField(min_value=0, max_value=100, default=3)
    max_runs = serializers.IntegerField(
        min_value=0, max_value=INT32_MAX, required=False, help_text="Default: the grid's size, else 10"
    )
    max_device_hours = serializers.FloatField(required=False, allow_null=True)
    max_money = serializers.DecimalField(max_digits=14, decimal_places=2, required=False, allow_null=True)
    concurrency = serializers.IntegerField(min_value=0, max_value=INT32_MAX, default=2)


class SweepSerializer(serializers.ModelSerializer):
    class Meta:
        model = Sweep
        fields = (
            "id",
            "project",
            "name",
            "status",
            "reason",
            "template",
            "parameters",
            "base_model_tiers",
            "search",
            "seed",
            "metric",
            "direction",
            "early_stopping",
            "min_steps",
            "reduction_factor",
            "max_runs",
            "max_device_hours",
            "max_money",
            "concurrency",
            "created_at",
            "finished_at",
        )


class SweepTrialSerializer(serializers.Serializer):
    number = serializers.IntegerField()
    run = serializers.IntegerField(help_text="The trial's run: an ordinary run (runs/{id})")
    run_name = serializers.CharField()
    run_status = serializers.ChoiceField(choices=Run.Status.choices)
    base_model = serializers.CharField()
    params = serializers.DictField(help_text="Each parameter's value, by name")
    state = serializers.ChoiceField(choices=SweepTrial.State.choices)
    value = serializers.FloatField(allow_null=True, help_text="The objective's last value")
    step = serializers.IntegerField(allow_null=True, help_text="The step of that value")
    start = serializers.FloatField(allow_null=True, help_text="The objective at step 0")
    stopped_early = serializers.BooleanField()
    why = serializers.CharField(help_text="Why it was stopped early or failed")
    money = serializers.DecimalField(max_digits=20, decimal_places=6)
    device_hours = serializers.FloatField()


class SpentSerializer(serializers.Serializer):
    money = serializers.DecimalField(max_digits=20, decimal_places=6)
    device_hours = serializers.FloatField()


class BaseModelRowSerializer(serializers.Serializer):
    base_model = serializers.CharField()
    trials = serializers.IntegerField()
    best_run = serializers.IntegerField(allow_null=True)
    best_trial = serializers.IntegerField(allow_null=True)
    start = serializers.FloatField(allow_null=True, help_text="The best run's objective at step 0")
    end = serializers.FloatField(allow_null=True, help_text="Its objective at its last evaluation")
    lift = serializers.FloatField(allow_null=True, help_text="end - start")
    money = serializers.DecimalField(max_digits=20, decimal_places=6, help_text="All its trials")
    device_hours = serializers.FloatField()


class SweepDetailSerializer(serializers.Serializer):
    sweep = SweepSerializer()
    trials = SweepTrialSerializer(many=True)
    best = SweepTrialSerializer(allow_null=True)
    spent = SpentSerializer()
    stopped_early = serializers.IntegerField()
    base_models = BaseModelRowSerializer(many=True, help_text="Per base model, when there are several")

"""Input and output shapes of the costs API. Money is a decimal string in the installation's
currency (FLYWHEEL_CURRENCY), kept to a millionth."""

from rest_framework import serializers

from costs.models import Price
from runs.api.run_serializers import RunCreateSerializer


class UnitsSerializer(serializers.Serializer):
    device_seconds = serializers.FloatField(help_text="Time holding a device (GPU or CPU), all classes")
    cpu_seconds = serializers.FloatField(help_text="CPU of sandboxes")
    tokens_prefilled = serializers.IntegerField()
    tokens_sampled = serializers.IntegerField()
    tokens_trained = serializers.IntegerField(help_text="Sampled tokens of the episodes learned from")
    engine_tokens_in = serializers.IntegerField()
    engine_tokens_out = serializers.IntegerField()
    judge_calls = serializers.IntegerField()
    reward_model_calls = serializers.IntegerField()
    storage_bytes = serializers.IntegerField(help_text="Checkpoints stored")


class MoneySerializer(serializers.Serializer):
    device_hour = serializers.CharField()
    cpu_hour = serializers.CharField()
    engine_mtok_in = serializers.CharField()
    engine_mtok_out = serializers.CharField()
    gb_month = serializers.CharField()


class TallySerializer(serializers.Serializer):
    units = UnitsSerializer()
    money = MoneySerializer(help_text="Money by price unit")
    total = serializers.CharField(help_text="Money in all")
    device_hours = serializers.FloatField()
    rerecorded = serializers.IntegerField(help_text="Records of work done again (billed once)")


class StepCostSerializer(UnitsSerializer):
    step = serializers.IntegerField()
    total = serializers.CharField()


class RunBudgetSerializer(serializers.Serializer):
    money = serializers.CharField(allow_null=True)
    device_hours = serializers.FloatField(allow_null=True)


class ByKindSerializer(serializers.Serializer):
    learner = TallySerializer(required=False)
    rollout = TallySerializer(required=False)
    evaluation = TallySerializer(required=False)
    storage = TallySerializer(required=False)


class RunCostSerializer(TallySerializer):
    run = serializers.IntegerField()
    currency = serializers.CharField()
    by_kind = ByKindSerializer()
    steps = StepCostSerializer(many=True)
    budget = RunBudgetSerializer()


class RunCostLineSerializer(TallySerializer):
    run = serializers.IntegerField()
    name = serializers.CharField()


class UserCostLineSerializer(TallySerializer):
    user = serializers.IntegerField(allow_null=True)
    username = serializers.CharField()


class ProjectBudgetSerializer(serializers.Serializer):
    monthly = serializers.CharField(allow_null=True)
    spent_this_month = serializers.CharField()


class ProjectCostSerializer(TallySerializer):
    project = serializers.IntegerField()
    currency = serializers.CharField()
    since = serializers.DateTimeField(allow_null=True)
    until = serializers.DateTimeField(allow_null=True)
    runs = RunCostLineSerializer(many=True)
    users = UserCostLineSerializer(many=True)
    budget = ProjectBudgetSerializer()


class PeriodSerializer(serializers.Serializer):
    since = serializers.DateTimeField(required=False, help_text="From (inclusive), ISO 8601")
    until = serializers.DateTimeField(required=False, help_text="Until (exclusive), ISO 8601")

    def validate(self, data: dict) -> dict:
        if data.get("since") and data.get("until") and data["since"] >= data["until"]:
            raise serializers.ValidationError({"until": "must be after since"})
        return data


class RunBudgetUpdateSerializer(serializers.Serializer):
    budget_money = serializers.DecimalField(
        max_digits=14, decimal_places=2, required=False, allow_null=True, help_text="null removes it"
    )
    budget_device_hours = serializers.FloatField(required=False, allow_null=True, help_text="null removes it")


class ProjectBudgetUpdateSerializer(serializers.Serializer):
    monthly = serializers.DecimalField(
        max_digits=14, decimal_places=2, allow_null=True, help_text="Money a month; null or 0 removes it"
    )


class PriceSerializer(serializers.ModelSerializer):
    class Meta:
        model = Price
        fields = ["id", "unit", "scope", "amount", "effective_from", "created_at"]
        read_only_fields = fields


class PriceCreateSerializer(serializers.Serializer):
    unit = serializers.ChoiceField(choices=Price.Unit.choices)
    scope = serializers.CharField(
        max_length=100,
        required=False,
        default="",
        allow_blank=True,
        help_text="A device class (cpu, or a GPU's name) for device_hour, an engine tier's name for "
        "engine tokens; blank: every scope without a price of its own",
    )
    amount = serializers.DecimalField(max_digits=14, decimal_places=6, min_value=0)
    effective_from = serializers.DateTimeField(required=False, help_text="Now when left out")


class RunEstimateInputSerializer(RunCreateSerializer):
    """A launch's fields, as POST /runs takes them; the name is optional."""

    name = serializers.CharField(max_length=100, required=False, default="estimate")
    calibrate = serializers.BooleanField(
        default=False,
        help_text="Also launch a calibration: a short run (FLYWHEEL_CALIBRATION_STEPS steps) of this tier, "
        "method and batch shape whose steps become the estimate's basis (launchers; an active one is "
        "reused)",
    )


class FigureRangeSerializer(serializers.Serializer):
    low = serializers.FloatField()
    expected = serializers.FloatField()
    high = serializers.FloatField()


class MoneyRangeSerializer(serializers.Serializer):
    low = serializers.DecimalField(max_digits=20, decimal_places=6)
    expected = serializers.DecimalField(max_digits=20, decimal_places=6)
    high = serializers.DecimalField(max_digits=20, decimal_places=6)


class EstimateBasisSerializer(serializers.Serializer):
    runs = serializers.ListField(child=serializers.IntegerField(), help_text="The earlier runs measured")
    steps = serializers.IntegerField(help_text="Their recorded steps")
    device_class = serializers.CharField(allow_blank=True)


class EstimateCalibrationSerializer(serializers.Serializer):
    run = serializers.IntegerField(help_text="The calibration run (marked `calibration`)")
    status = serializers.CharField()
    learner_step = serializers.IntegerField()
    max_steps = serializers.IntegerField()
    launched = serializers.BooleanField(required=False, help_text="True: this request launched it")


class RunEstimateSerializer(serializers.Serializer):
    steps = serializers.IntegerField()
    work_per_step = serializers.IntegerField(help_text="batch_size × group_size: the unit rates scale by")
    basis = EstimateBasisSerializer(allow_null=True, help_text="null: no earlier step to scale from")
    device_hours = FigureRangeSerializer(required=False)
    sandbox_cpu_hours = FigureRangeSerializer(required=False)
    wall_seconds = FigureRangeSerializer(required=False, allow_null=True)
    money = MoneyRangeSerializer(required=False, help_text="At today's prices")
    calibration = EstimateCalibrationSerializer(
        allow_null=True, help_text="The newest calibration of the tier and method, or null"
    )
    why = serializers.CharField(help_text="What the figures rest on, or why there are none")

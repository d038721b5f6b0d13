"""Webhooks over REST: what a client sends and sees. The secret is in one serializer only, the
answer to the creating POST."""

from rest_framework import serializers

from runs.models import Run
from webhooks.models import Webhook, WebhookDelivery


def statuses_field() -> serializers.ListField:
    return serializers.ListField(
        child=serializers.ChoiceField(choices=Run.Status.choices),
        required=False,
        help_text="Run statuses to send; empty or absent: every status",
    )


EVENT_TYPES = (
    ("run.status", "a run changed status"),
    ("run.alert", "a run's monitor raised an alert"),
    ("run.budget", "a run reached its budget and paused"),
)


def events_field() -> serializers.ListField:
    return serializers.ListField(
        child=serializers.ChoiceField(choices=EVENT_TYPES),
        required=False,
        help_text="Event types to send (run.status, run.alert); empty or absent: every type",
    )


class WebhookFilterSerializer(serializers.Serializer):
    project = serializers.IntegerField(required=False, min_value=1)


class DeliveryFilterSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=WebhookDelivery.Status.choices, required=False)


class WebhookCreateSerializer(serializers.Serializer):
    project = serializers.IntegerField(min_value=1)
    url = serializers.CharField(help_text="http:// or https://; receives a signed POST per event")
    description = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    statuses = statuses_field()
    events = events_field()
    active = serializers.BooleanField(required=False, default=True)


class WebhookUpdateSerializer(serializers.Serializer):
    url = serializers.CharField(required=False)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    statuses = statuses_field()
    events = events_field()
    active = serializers.BooleanField(required=False)


class WebhookSerializer(serializers.ModelSerializer):
    statuses = serializers.ListField(child=serializers.ChoiceField(choices=Run.Status.choices))
    events = serializers.ListField(child=serializers.ChoiceField(choices=EVENT_TYPES))

    class Meta:
        model = Webhook
        fields = [
            "id",
            "project",
            "url",
            "description",
            "statuses",
            "events",
            "active",
            "created_by",
            "created_at",
        ]


class WebhookCreatedSerializer(WebhookSerializer):
    secret = serializers.CharField(
        help_text="The signing secret, shown this once: verify Flywheel-Signature with it"
    )

    class Meta(WebhookSerializer.Meta):
        fields = [*WebhookSerializer.Meta.fields, "secret"]


class WebhookSecretSerializer(serializers.Serializer):
    webhook = WebhookSerializer()
    secret = serializers.CharField(help_text="The new signing secret, shown this once")
    previous_secret_expires_at = serializers.DateTimeField(
        source="webhook.previous_secret_expires_at",
        help_text="Until then deliveries carry a signature with the old secret as well (a second v1=)",
    )


class WebhookDeliverySerializer(serializers.ModelSerializer):
    payload = serializers.DictField(help_text="The JSON body sent: id, type, created_at, data")

    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "webhook",
            "type",
            "run",
            "event",
            "status",
            "attempts",
            "next_attempt_at",
            "last_response_code",
            "last_error",
            "delivered_at",
            "created_at",
            "payload",
        ]

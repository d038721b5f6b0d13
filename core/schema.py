"""OpenAPI details shared by every view: the one error shape, declared on every operation."""

from typing import Literal

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers

NO_CONTENT = {204: OpenApiResponse(description="Done; no body")}

ERROR_DESCRIPTIONS = {
    "400": "Invalid request: `details` names every bad field (and, for an import, the line)",
    "401": "No credentials, or an unknown or revoked token",
    "403": "Your role in the project does not allow this",
    "404": "No such object, or it belongs to a project you are not in",
    "409": "The object's state does not allow this, or the Idempotency-Key is still in flight",
    "422": "The Idempotency-Key was used with a different request",
    "429": "Too many requests",
}


class ErrorDetailSerializer(serializers.Serializer):
    param = serializers.CharField(allow_null=True, help_text="The field (or query parameter) at fault")
    message = serializers.CharField()
    line = serializers.IntegerField(required=False, help_text="For a file import: the 1-based line")


class ErrorBodySerializer(serializers.Serializer):
    code = serializers.CharField(help_text="Machine-readable, such as invalid_request or not_found")
    message = serializers.CharField()
    param = serializers.CharField(allow_null=True)
    details = ErrorDetailSerializer(many=True)
    error_count = serializers.IntegerField(
        required=False, help_text="For a file import: every error found, of which `details` lists the first"
    )


class ErrorSerializer(serializers.Serializer):
    error = ErrorBodySerializer()


class FlywheelAutoSchema(AutoSchema):
    """Adds the error responses a client must handle to each operation's declared responses."""

    def _error_codes(self) -> list[str]:
        codes = ["400", "401", "403", "404", "429"]
        if self.method in ("POST", "PATCH", "DELETE"):
            codes.append("409")
        if self.method == "POST":
            codes.append("422")
        return codes

    def _get_response_bodies(self, direction: Literal["request", "response"] = "response") -> dict:
        responses = super()._get_response_bodies(direction)
        for code in self._error_codes():
            if code not in responses:
                error = OpenApiResponse(ErrorSerializer, description=ERROR_DESCRIPTIONS[code])
                responses[code] = self._get_response_for_code(error, code, ("application/json",), direction)
        return responses

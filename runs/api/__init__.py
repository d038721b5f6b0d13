"""The REST API under /api/v1/: thin views over selectors and services (see shared API.md).

`serializers` holds the input serializers (types and shapes) and output serializers (what a
client sees); `schema` declares the error shape on every operation; `views` wires them up.
"""

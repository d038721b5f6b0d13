"""The runs' REST API under /api/v1/: thin views over selectors and services (see shared API.md).

`runs` holds the views of runs and their record, `run_serializers` their input and output
serializers, `quotas` a project's run quota. Tiers and their evaluations are the tiers app's API.
"""

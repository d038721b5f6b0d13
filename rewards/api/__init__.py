"""The reward-rules REST API under /api/v1/ (see shared API.md), built like runs.api:
`serializers` for shapes in and out, `views` thin over rewards.selectors and rewards.services."""

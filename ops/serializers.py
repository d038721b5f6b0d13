"""The shapes of GET /api/v1/ops/overview, for the schema (the selectors build plain dicts)."""

from rest_framework import serializers

OVERALL = ("ok", "degraded")
SCOPES = ("all", "own_projects")
WORKER_STATES = ("alive", "gone", "stopped")
PROCESS_ENDS = ("gone", "stopped")
FAILURE_KINDS = ("task_failed", "worker_restarted", "run_failed", "learner_restarted")


class RedisHealthSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    latency_ms = serializers.FloatField(allow_null=True, help_text="One PING, from this web process")
    detail = serializers.CharField()
    version = serializers.CharField()
    used_memory_bytes = serializers.IntegerField(allow_null=True)


class DatabaseHealthSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    latency_ms = serializers.FloatField(allow_null=True, help_text="One SELECT 1, from this web process")
    vendor = serializers.CharField()
    detail = serializers.CharField()


class QueueSerializer(serializers.Serializer):
    name = serializers.CharField()
    waiting = serializers.IntegerField(help_text="Messages no worker has taken yet")
    oldest_wait_seconds = serializers.FloatField(
        allow_null=True, help_text="How long the oldest waiting message has waited; null when none waits"
    )
    workers_alive = serializers.IntegerField()
    workers_busy = serializers.IntegerField()
    running = serializers.IntegerField(help_text="Tasks its live workers are running")


class SandboxCountsSerializer(serializers.Serializer):
    live = serializers.IntegerField(help_text="Started: busy, idle or starting")
    busy = serializers.IntegerField(help_text="In use by a rollout or a grader now")
    idle = serializers.IntegerField()
    replaced = serializers.IntegerField(help_text="Closed after misbehaving and replaced")


class RunRefSerializer(serializers.Serializer):
    id = serializers.IntegerField(allow_null=True)
    name = serializers.CharField()
    project = serializers.IntegerField(allow_null=True)
    hidden = serializers.BooleanField(help_text="A run of a project the caller is not a member of")


class RunningTaskSerializer(serializers.Serializer):
    task = serializers.CharField()
    since = serializers.DateTimeField(allow_null=True)
    pid = serializers.IntegerField(allow_null=True)
    run = RunRefSerializer(allow_null=True)


class PreviousProcessSerializer(serializers.Serializer):
    pid = serializers.IntegerField(allow_null=True)
    ended = serializers.ChoiceField(choices=PROCESS_ENDS)
    last_seen_at = serializers.DateTimeField(allow_null=True)


class WorkerSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="The Celery node name, queue@host")
    host = serializers.CharField()
    pid = serializers.IntegerField()
    queues = serializers.ListField(child=serializers.CharField())
    concurrency = serializers.IntegerField()
    pool = serializers.CharField()
    state = serializers.ChoiceField(
        choices=WORKER_STATES, help_text="gone: its heartbeats stopped without a stop (killed, host lost)"
    )
    started_at = serializers.DateTimeField()
    last_seen_at = serializers.DateTimeField(allow_null=True)
    device = serializers.CharField()
    memory_bytes = serializers.IntegerField(help_text="Resident memory of the worker and its processes")
    restarts = serializers.IntegerField(help_text="Times a worker of this name started again (last hour)")
    previous = PreviousProcessSerializer(allow_null=True)
    tasks = RunningTaskSerializer(many=True)
    sandboxes = SandboxCountsSerializer()


class FailureSerializer(serializers.Serializer):
    at = serializers.DateTimeField(allow_null=True)
    kind = serializers.ChoiceField(choices=FAILURE_KINDS)
    worker = serializers.CharField()
    task = serializers.CharField()
    message = serializers.CharField()
    run = RunRefSerializer(allow_null=True)


class OverviewSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=OVERALL)
    scope = serializers.ChoiceField(
        choices=SCOPES, help_text="own_projects: runs of other projects are not named (staff see all)"
    )
    generated_at = serializers.DateTimeField()
    redis = RedisHealthSerializer()
    database = DatabaseHealthSerializer()
    queues = QueueSerializer(many=True)
    workers = WorkerSerializer(many=True)
    sandboxes = SandboxCountsSerializer()
    failures = FailureSerializer(many=True)

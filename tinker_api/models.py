"""What the Tinker API keeps: a client's session, its training models (each a Flywheel run of
method `tinker`), the requests they queue (futures the SDK polls), the weights they save by name,
and sampling sessions.

A request is the unit of work and of recovery: the web process writes it `pending` with its body;
the model's learner process (training) or a rollout worker (sampling) takes it, runs it and writes
its answer; the client's `retrieve_future` reads that answer. A retried POST (the SDK's
`X-Idempotency-Key`) finds its first request instead of queuing the work twice.
"""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from projects.models import Project
from runs.models import Run
from tiers.models import Tier


def _ident(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4()}"


def session_key() -> str:
    return _ident("")


def request_key() -> str:
    return _ident("req-")


def sampler_key() -> str:
    return _ident("sampler-")


class TinkerSession(models.Model):
    class Status(models.TextChoices):
        ACTIVE = "active"
        FINISHED = "finished"  # the client closed it
        EXPIRED = "expired"  # its heartbeats stopped

    key = models.CharField(max_length=64, unique=True, default=session_key)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="tinker_sessions")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    display_name = models.CharField(max_length=200, blank=True)
    tags = models.JSONField(default=list, blank=True)
    user_metadata = models.JSONField(default=dict, blank=True)
    sdk_version = models.CharField(max_length=40, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.ACTIVE, db_index=True)
    heartbeat_at = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"tinker session {self.key} ({self.status})"


class TinkerModel(models.Model):
    """A training client's model: a LoRA (or full-weight) copy of a tier's base model, trained by
    the learner process of its run."""

    model_id = models.CharField(max_length=120, unique=True)
    session = models.ForeignKey(TinkerSession, on_delete=models.CASCADE, related_name="models")
    seq_id = models.PositiveIntegerField()
    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="tinker_model")
    base_model = models.CharField(max_length=500, help_text="As the client named it")
    lora = models.JSONField(null=True, blank=True, help_text="rank, seed, train_mlp/attn/unembed; None: full")
    optimizer = models.JSONField(default=dict, blank=True)
    load_path = models.CharField(max_length=500, blank=True, help_text="tinker:// weights it starts from")
    load_optimizer = models.BooleanField(default=False)
    optim_steps = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["session", "seq_id"], name="tinker_model_seq_per_session")
        ]

    def __str__(self) -> str:
        return self.model_id


class TinkerSampler(models.Model):
    """A sampling session: a policy version of a Tinker model's run, or a tier's base model."""

    key = models.CharField(max_length=64, unique=True, default=sampler_key)
    session = models.ForeignKey(TinkerSession, on_delete=models.CASCADE, related_name="samplers")
    seq_id = models.PositiveIntegerField(default=0)
    tier = models.ForeignKey(Tier, null=True, on_delete=models.SET_NULL, related_name="+")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    policy_version = models.PositiveIntegerField(null=True, blank=True)
    base_model = models.CharField(max_length=500)
    model_path = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.key


class TinkerRequest(models.Model):
    class Kind(models.TextChoices):
        CREATE_MODEL = "create_model"
        FORWARD_BACKWARD = "forward_backward"
        FORWARD = "forward"
        OPTIM_STEP = "optim_step"
        SAVE_WEIGHTS = "save_weights"
        SAVE_WEIGHTS_FOR_SAMPLER = "save_weights_for_sampler"
        LOAD_WEIGHTS = "load_weights"
        SAMPLE = "sample"

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    key = models.CharField(max_length=64, unique=True, default=request_key)
    session = models.ForeignKey(TinkerSession, on_delete=models.CASCADE, related_name="requests")
    model = models.ForeignKey(
        TinkerModel, null=True, blank=True, on_delete=models.CASCADE, related_name="requests"
    )
    sampler = models.ForeignKey(
        TinkerSampler, null=True, blank=True, on_delete=models.CASCADE, related_name="requests"
    )
    kind = models.CharField(max_length=32, choices=Kind.choices)
    idempotency_key = models.CharField(max_length=200, blank=True)
    body = models.BinaryField(help_text="As sent: protobuf for forward passes, else JSON")
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING, db_index=True)
    result = models.BinaryField(null=True, blank=True)
    result_proto = models.BooleanField(default=False, help_text="The result is protobuf, else JSON")
    error = models.TextField(blank=True)
    user_error = models.BooleanField(default=True, help_text="The request's fault, not the server's")
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["session", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="tinker_request_once_per_key",
            )
        ]
        indexes = [models.Index(fields=["model", "status", "id"])]

    def __str__(self) -> str:
        return f"{self.kind} {self.key} ({self.status})"


class TinkerWeights(models.Model):
    """Weights a model saved by name: training state (a run checkpoint, with the optimiser) or
    sampler weights (a policy version of the run, served on /v1 as run-<id>)."""

    class Kind(models.TextChoices):
        STATE = "weights"
        SAMPLER = "sampler_weights"

    model = models.ForeignKey(TinkerModel, on_delete=models.CASCADE, related_name="weights")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    name = models.CharField(max_length=200)
    step = models.PositiveIntegerField(help_text="The run's checkpoint step or policy version")
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Forgotten by name after this")
    public = models.BooleanField(
        default=False, help_text="Published: any user of this server may sample it and train from it"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["model", "kind", "name"], name="tinker_weights_name")]

    def __str__(self) -> str:
        return self.path

    @property
    def path(self) -> str:
        return f"tinker://{self.model.model_id}/{self.kind}/{self.name}"
